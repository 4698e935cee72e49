"""Copy/compute interference: the fit inverts the simulator, and the hook only slows streaming."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwbench.interference import (
    KEY,
    KEY_PREFILL,
    S_MAX,
    Interference,
    KindBusy,
    fit_pair,
    interference_of,
    layer_time,
)
from hwbench.validate import run_simulator
from hwbench.workloads import ValidationWorkload
from sim.costmodel import Profile, load_profile


def _linear(
    base: tuple[float, float], slope: tuple[float, float], cross: float
) -> Callable[[Interference], tuple[float, float]]:
    """Reference simulator: each kind's busy grows linearly with its own factor and, by
    ``cross`` times as much, with the other's (timing moves batches a little)."""

    def sim(s: Interference) -> tuple[float, float]:
        return (
            base[0] + slope[0] * (s.decode + cross * s.prefill),
            base[1] + slope[1] * (s.prefill + cross * s.decode),
        )

    return sim


@given(
    s_true=st.tuples(st.floats(0.0, S_MAX), st.floats(0.0, S_MAX)),
    base=st.tuples(st.floats(0.1, 10.0), st.floats(0.1, 10.0)),
    slope=st.tuples(st.floats(0.05, 5.0), st.floats(0.05, 5.0)),
    cross=st.floats(0.0, 0.1),
)
def test_fit_pair_recovers_both_factors(
    s_true: tuple[float, float],
    base: tuple[float, float],
    slope: tuple[float, float],
    cross: float,
) -> None:
    sim = _linear(base, slope, cross)
    target = sim(Interference(*s_true))
    s = fit_pair(target, sim, rtol=1e-6, max_evals=40)
    got = sim(s)
    assert got[0] == pytest.approx(target[0], rel=1e-5)
    assert got[1] == pytest.approx(target[1], rel=1e-5)
    assert s.decode == pytest.approx(s_true[0], abs=1e-3)
    assert s.prefill == pytest.approx(s_true[1], abs=1e-3)


def test_fit_pair_clamps_to_the_range_and_keeps_a_kind_without_iterations() -> None:
    sim = _linear((1.0, 1.0), (1.0, 1.0), 0.0)
    # engine faster than no interference on decodes, far slower on prefills
    s = fit_pair((0.5, 100.0), sim)
    assert s == Interference(0.0, S_MAX)
    # no prefill-admitting iterations: that factor stays at the start value
    s = fit_pair((2.5, 0.0), sim, start=(0.7, 0.7), rtol=1e-9, max_evals=20)
    assert s.decode == pytest.approx(1.5) and s.prefill == 0.7
    with pytest.raises(ValueError):
        fit_pair((-1.0, 1.0), sim)
    with pytest.raises(ValueError):
        fit_pair((1.0, 1.0), sim, max_evals=0)


def test_fit_pair_returns_the_best_pair_it_evaluated_when_out_of_evaluations() -> None:
    calls: list[Interference] = []
    sim = _linear((1.0, 1.0), (1.0, 2.0), 0.0)

    def counted(s: Interference) -> tuple[float, float]:
        calls.append(s)
        return sim(s)

    s = fit_pair((3.0, 3.0), counted, max_evals=2)
    assert len(calls) == 2 and s in calls
    worst = [max(abs(a / 3.0 - 1.0) for a in sim(c)) for c in calls]
    assert max(abs(a / 3.0 - 1.0) for a in sim(s)) == min(worst)


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


def _profile(s: float | None, s_prefill: float | None = None) -> Profile:
    prof = load_profile("a100-80gb")
    fitted = dict(prof.fitted)
    fit: dict[str, float] = {"attn_per_token_s": 4e-7}
    if s is not None:
        fit[KEY] = s
    if s_prefill is not None:
        fit[KEY_PREFILL] = s_prefill
    fitted["engine_fit"] = [fit]
    gpu = prof.gpu.model_copy(update={"per_layer_overhead_s": 3e-4})
    # a slow copy path, so a layer's copy and compute are of the same order
    links = prof.links.model_copy(
        update={"pcie": prof.links.pcie.model_copy(update={"bandwidth": 5e9})}
    )
    return prof.model_copy(update={"fitted": fitted, "gpu": gpu, "links": links})


def test_datasheet_profiles_have_no_interference() -> None:
    assert interference_of(load_profile("h200-sxm")) == (0.0, 0.0)
    assert interference_of(_profile(None)) == (0.0, 0.0)
    # one factor serves both kinds unless the prefill one is given
    assert interference_of(_profile(0.7)) == Interference(0.7, 0.7)
    assert interference_of(_profile(0.7, 1.4)) == Interference(0.7, 1.4)


def _latency(
    w: ValidationWorkload, prof: Profile, tmp: Path, s: float | None
) -> tuple[np.ndarray, np.ndarray]:
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


def _kinds(w: ValidationWorkload, prof: Profile, tmp: Path, s: tuple[float, float]) -> KindBusy:
    kb = KindBusy()
    cl = run_simulator(w, prof, tmp, interference=s, busy=kb)[4]
    # every iteration streams, so the two kinds make up the whole busy time
    assert kb.decode + kb.prefill == pytest.approx(cl.ctx.metrics.busy, rel=1e-9)
    return kb


def test_each_factor_slows_only_its_own_kind_of_iteration(tmp_path: Path) -> None:
    """One request: one prompt-admitting iteration, then decode-only ones, so each kind's
    busy time moves with its own factor only."""
    w = ValidationWorkload(
        "one", "one request", requests=1, rate=1.0, hbm_fraction=0.6, output_low=8, seed=4
    )
    prof = _profile(None)
    base = _kinds(w, prof, tmp_path, (0.0, 0.0))
    assert base.decode > 0 and base.prefill > 0
    pre = _kinds(w, prof, tmp_path, (0.0, 1.5))
    dec = _kinds(w, prof, tmp_path, (1.5, 0.0))
    assert pre.decode == pytest.approx(base.decode) and pre.prefill > base.prefill
    assert dec.prefill == pytest.approx(base.prefill) and dec.decode > base.decode
