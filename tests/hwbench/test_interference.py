"""Copy/compute interference: the fit inverts the simulator, and the hook only slows streaming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwbench.interference import KEY, S_MAX, fit_interference, interference_of, layer_time
from hwbench.validate import Comparison, median_comparison, run_simulator
from hwbench.workloads import ValidationWorkload
from sim.costmodel import Profile, load_profile


@given(
    s_true=st.floats(0.0, S_MAX),
    base=st.floats(0.1, 10.0),
    slope=st.floats(0.01, 5.0),
    bias=st.floats(0.5, 2.0),
)
def test_fit_recovers_the_factor_of_a_monotone_simulator(
    s_true: float, base: float, slope: float, bias: float
) -> None:
    """Reference: sim(s) = base + slope * s; the engine is the simulator at s_true times the
    compute model's bias (seen on the resident runs), which the fit divides out."""

    def sim(s: float) -> float:
        return base + slope * s

    sim_res = 3.0
    s = fit_interference(sim(s_true) * bias, sim_res * bias, sim, sim_res, tol=1e-6)
    assert s == pytest.approx(s_true, abs=1e-5)


@given(
    c=st.floats(0.0, 1.0),
    x=st.floats(0.0, 1.0),
    s=st.floats(0.0, S_MAX),
)
def test_layer_time_runs_from_parallel_to_serial(c: float, x: float, s: float) -> None:
    """s = 0: copy and compute overlap fully; s = 1: they take turns (C + X), whichever is
    longer; the time grows with s and never undercuts the longer of the two."""
    assert layer_time(c, x, 0.0) == max(c, x)
    assert layer_time(c, x, 1.0) == pytest.approx(c + x)
    assert layer_time(c, x, s) >= max(c, x)
    assert layer_time(c, x, s) == pytest.approx(layer_time(x, c, s))  # symmetric
    assert layer_time(c, x, s) <= layer_time(c, x, s + 0.5)


def test_fit_clamps_to_the_range_ends() -> None:
    def sim(s: float) -> float:
        return 1.0 + s

    assert fit_interference(0.5, 1.0, sim, 1.0) == 0.0  # engine faster than no interference
    assert fit_interference(100.0, 1.0, sim, 1.0) == S_MAX
    with pytest.raises(ValueError):
        fit_interference(1.0, 0.0, sim, 1.0)


def _profile(s: float | None) -> Profile:
    prof = load_profile("a100-80gb")
    fitted = dict(prof.fitted)
    fit: dict[str, float] = {"attn_per_token_s": 4e-7}
    if s is not None:
        fit[KEY] = s
    fitted["engine_fit"] = [fit]
    gpu = prof.gpu.model_copy(update={"per_layer_overhead_s": 3e-4})
    # a slow copy path, so a layer's copy and compute are of the same order
    links = prof.links.model_copy(
        update={"pcie": prof.links.pcie.model_copy(update={"bandwidth": 5e9})}
    )
    return prof.model_copy(update={"fitted": fitted, "gpu": gpu, "links": links})


def test_datasheet_profiles_have_no_interference() -> None:
    assert interference_of(load_profile("h200-sxm")) == 0.0
    assert interference_of(_profile(None)) == 0.0
    assert interference_of(_profile(0.7)) == 0.7


def _latency(w: ValidationWorkload, prof: Profile, tmp: Path, s: float | None) -> np.ndarray:
    df, hits, _, _, _ = run_simulator(w, prof, tmp, interference=s)
    return (df["end"] - df["arrival"]).to_numpy(dtype=float), hits


def test_interference_slows_streaming_only_and_keeps_cache_decisions(tmp_path: Path) -> None:
    stream = ValidationWorkload("s", "stream", requests=6, rate=20.0, hbm_fraction=0.6, seed=3)
    resident = ValidationWorkload("r", "resident", requests=6, rate=20.0, seed=3)
    prof = _profile(None)
    base, hits0 = _latency(stream, prof, tmp_path, 0.0)
    lat = [base]
    for s in (0.5, 1.5):
        x, hits = _latency(stream, prof, tmp_path, s)
        # same cache decisions (hit rates); slower iterations batch differently, so counts move
        np.testing.assert_allclose(hits / hits.sum(), hits0 / hits0.sum(), atol=0.01)
        lat.append(x)
    assert lat[0].mean() < lat[1].mean() < lat[2].mean()
    # the profile's own factor is used by default
    x, _ = _latency(stream, _profile(0.5), tmp_path, None)
    np.testing.assert_allclose(x, lat[1])
    # nothing streams: the factor changes nothing
    r0, _ = _latency(resident, prof, tmp_path, 0.0)
    r1, _ = _latency(resident, prof, tmp_path, 1.5)
    np.testing.assert_array_equal(r0, r1)


def test_median_comparison_takes_each_metrics_median() -> None:
    def comp(p50: float, hit: float) -> Comparison:
        rows = [
            ("latency_p50", p50, 2.0, (2.0 - p50) / p50, "rel"),
            ("hit_rate_hbm", hit, 0.3, 0.3 - hit, "abs"),
        ]
        return Comparison("w", rows, np.array([p50]), np.array([2.0]))

    m = median_comparison([comp(1.0, 0.30), comp(4.0, 0.31), comp(2.5, 0.29)])
    rows = {r[0]: r for r in m.rows}
    assert rows["latency_p50"][1:4] == pytest.approx((2.5, 2.0, -0.2))
    assert rows["hit_rate_hbm"][1:4] == pytest.approx((0.30, 0.3, 0.0))
    assert m.engine_latency.tolist() == [2.5]  # the CDF of the median run
