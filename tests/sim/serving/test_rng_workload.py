"""Named random streams and workload generators."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from sim.rng import RngStreams
from sim.scenario import StepCfg, TokenDist, WorkloadCfg
from sim.serving.workload import draw_tokens, make_workload, read_mooncake, step_arrivals

DATA = Path(__file__).parents[1] / "data"


def test_streams_depend_on_name_not_order() -> None:
    a, b = RngStreams(7), RngStreams(7)
    x = a.get("workload").random(4)
    b.get("faults").random(100)  # asking another stream first shifts nothing
    assert np.array_equal(x, b.get("workload").random(4))
    assert not np.array_equal(x, RngStreams(8).get("workload").random(4))
    assert not np.array_equal(RngStreams(7).get("a").random(4), RngStreams(7).get("b").random(4))


def test_step_arrivals_follow_each_rate() -> None:
    cfg = WorkloadCfg(kind="step", rate=50, steps=[StepCfg(at=10, rate=1200)], requests=20000)
    t = step_arrivals(cfg, cfg.requests, np.random.default_rng(1))
    assert np.all(np.diff(t) >= 0)
    before = (t < 10).sum()
    assert 400 < before < 600  # ~50/s for 10 s
    after = ((t >= 10) & (t < 15)).sum()
    assert 5400 < after < 6600  # ~1200/s


def test_poisson_mean_rate_and_mix() -> None:
    cfg = WorkloadCfg(kind="poisson", rate=100, requests=20000)
    wl = make_workload(cfg, [3.0, 1.0], np.random.default_rng(2))
    rate = wl.n / wl.arrival[-1]
    assert 95 < rate < 105
    assert 0.72 < (wl.model == 0).mean() < 0.78


def test_forced_class_per_model() -> None:
    cfg = WorkloadCfg(requests=500, classes=[{"name": "a"}, {"name": "b"}])
    wl = make_workload(cfg, [1.0, 1.0], np.random.default_rng(3), model_classes=[1, None])
    assert np.all(wl.cls[wl.model == 0] == 1)
    assert set(np.unique(wl.cls[wl.model == 1]).tolist()) == {0, 1}


@given(
    dist=st.sampled_from(["fixed", "uniform", "lognormal"]),
    low=st.integers(1, 50),
    span=st.integers(0, 500),
    mean=st.floats(1, 600),
)
def test_tokens_stay_in_bounds(dist: str, low: int, span: int, mean: float) -> None:
    d = TokenDist(dist=dist, low=low, high=low + span, mean=mean)
    x = draw_tokens(d, 200, np.random.default_rng(0))
    assert x.min() >= low and x.max() <= low + span


def test_mooncake_fixture_and_bad_line(tmp_path: Path) -> None:
    t, i, o = read_mooncake(DATA / "mooncake_small.jsonl", 1000)
    assert len(t) == 40 and t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert i[0] == 40160 and o[0] == 6
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 3, "output_length": 2}\n{"timestamp": 1}\n')
    with pytest.raises(InputError, match="line 2"):
        read_mooncake(bad, 10)


def test_trace_workload_from_file() -> None:
    cfg = WorkloadCfg(kind="trace", trace=str(DATA / "mooncake_small.jsonl"), requests=10)
    wl = make_workload(cfg, [1.0], np.random.default_rng(0))
    assert wl.n == 10 and wl.arrival[0] == 0.0
