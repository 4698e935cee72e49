"""Time compression and peak-rate scaling of trace workloads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sim.scenario import WorkloadCfg
from sim.serving.tracescale import peak_rate
from sim.serving.workload import make_workload

RNG = np.random.default_rng(0)


def _csv(path: Path, times: list[float]) -> Path:
    rows = "".join(f"{t!r},{10 + i},{1 + i}\n" for i, t in enumerate(times))
    path.write_text("time,input_tokens,output_tokens\n" + rows, encoding="utf-8")
    return path


def _replay(path: Path, **kw: object) -> np.ndarray:
    cfg = WorkloadCfg(kind="trace", trace=str(path), requests=10**6, **kw)  # type: ignore[arg-type]
    return make_workload(cfg, [1.0], RNG).arrival


def _brute_peak(t: np.ndarray, window: float) -> int:
    """Most arrivals in any [t_i, t_i + window): every start tried, every arrival counted."""
    return max(int(((t >= a) & (t < a + window)).sum()) for a in t)


@given(
    st.lists(st.floats(0, 1e5, allow_nan=False), min_size=1, max_size=40),
    st.sampled_from([0.25, 0.5, 2.0, 8.0]),
)
@settings(max_examples=30, deadline=None)
def test_a_power_of_two_time_scale_multiplies_every_interarrival_time_exactly(
    tmp_path_factory: pytest.TempPathFactory, times: list[float], scale: float
) -> None:
    p = _csv(tmp_path_factory.mktemp("ts") / "t.csv", sorted(times))
    base, scaled = _replay(p), _replay(p, trace_time_scale=scale)
    assert np.array_equal(np.diff(scaled), scale * np.diff(base))  # x 2^k is exact in binary


def test_any_time_scale_multiplies_each_arrival_once(tmp_path: Path) -> None:
    times = [3.0, 3.5, 4.25, 10.0, 10.0, 71.125]
    p = _csv(tmp_path / "t.csv", times)
    scaled = _replay(p, trace_time_scale=0.3)
    assert scaled.tolist() == [(t - 3.0) * 0.3 for t in times]  # first arrival at 0
    gaps = np.diff(scaled)
    assert np.allclose(gaps, 0.3 * np.diff(times), rtol=1e-15, atol=0)


def test_peak_rate_by_hand() -> None:
    # windows of 10 s: [0, 10) holds 0, 1, 2, 9.999 (4); [9.999, 19.999) holds 9.999, 10, 19 (3)
    t = np.asarray([0.0, 1.0, 2.0, 9.999, 10.0, 19.0, 40.0])
    assert peak_rate(t, 10.0) == 4 / 10.0
    assert peak_rate(t, 1.0) == 2.0  # [9.999, 10.999) holds 9.999 and 10; [0, 1) only 0
    assert peak_rate(t, 0.5) == 2 / 0.5
    assert peak_rate(t, 0.01) == 2 / 0.01  # 9.999 and 10.0 share a 10 ms window


@given(
    st.lists(st.integers(0, 10**6), min_size=2, max_size=60),
    st.floats(0.5, 500.0),
    st.sampled_from([1.0, 7.0, 60.0]),
)
@settings(max_examples=40, deadline=None)
def test_peak_rate_scaling_hits_the_target_in_the_scaled_window(
    tmp_path_factory: pytest.TempPathFactory, ms: list[int], target: float, window: float
) -> None:
    times = sorted(m / 1000 for m in ms)
    gaps = np.subtract.outer(times, times)
    assume(not np.any(np.abs(gaps - window) < 1e-6))  # no arrival on a window's very edge
    p = _csv(tmp_path_factory.mktemp("pk") / "t.csv", times)
    raw = np.asarray(times) - times[0]
    scale = _brute_peak(raw, window) / window / target
    scaled = _replay(p, trace_peak_rate=target, trace_peak_window=window)
    assert np.allclose(scaled, raw * scale, rtol=1e-12, atol=0)
    # the replay's busiest window of scale x window seconds averages the target
    busiest = _brute_peak(scaled, scale * window)
    assert busiest / (scale * window) == pytest.approx(target, rel=1e-12)


def test_the_azure_trace_scaled_to_a_peak_minute_of_15_per_second() -> None:
    cfg = WorkloadCfg(kind="trace", trace="shipped:AzureLLMInferenceTrace_conv.csv", requests=10**6)
    raw = make_workload(cfg, [1.0], RNG).arrival
    assert peak_rate(raw, 60.0) * 60 == 522  # the busiest minute (any start) holds 522
    scaled = make_workload(cfg.model_copy(update={"trace_peak_rate": 15.0}), [1.0], RNG).arrival
    scale = 522 / 60 / 15  # 0.58
    assert scaled[-1] == pytest.approx(3501.721937 * scale, rel=1e-12)
    assert peak_rate(scaled, 60 * scale) == pytest.approx(15.0, rel=1e-12)


def test_a_duration_bound_applies_to_the_scaled_times(tmp_path: Path) -> None:
    p = _csv(tmp_path / "t.csv", [0.0, 10.0, 20.0, 30.0])  # peak: 1 per 10 s window
    kept = _replay(p, trace_peak_rate=0.2, trace_peak_window=10.0, duration=30.0)
    assert kept.tolist() == [0.0, 5.0, 10.0, 15.0]  # scale 0.5
    assert _replay(p, trace_time_scale=2.0, duration=30.0).tolist() == [0.0, 20.0]


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"trace_peak_rate": 10.0, "trace_time_scale": 0.5}, "trace_time_scale 1"),
        ({"trace_peak_rate": 0.0}, "trace_peak_rate"),
        ({"trace_peak_rate": 1e8}, "trace_peak_rate"),
        ({"trace_peak_window": 0.0}, "trace_peak_window"),
        ({"trace_time_scale": 0.0}, "trace_time_scale"),
        ({"trace_time_scale": 1e7}, "trace_time_scale"),
    ],
)
def test_bad_scaling_fields_are_refused(fields: dict[str, float], what: str) -> None:
    with pytest.raises(ValidationError, match=what):
        WorkloadCfg(kind="trace", trace="t.csv", **fields)  # type: ignore[arg-type]
