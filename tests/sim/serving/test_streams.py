"""Stream isolation on a multi-model replica (R13): shares, no waiting for turns, errors."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import InputError
from sim.cluster import build
from sim.runner import run_scenario
from sim.scenario import load_scenario, validate, variant
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.models import load_catalogue
from sim.serving.replica import ComputeNode

ROOT = Path(__file__).resolve().parents[3]


def _two_models(streams: str, share: float) -> Any:
    """Two resident 7B models (high, low), a burst of 40 requests each at once."""
    return validate(
        {
            "name": "streams",
            "profile": "a100-80gb",
            "mode": "coupled",
            "deployments": [
                {"model": "llama-2-7b", "share": 0.5, "cls": "high"},
                {"model": "llama-2-7b", "share": 0.5, "version": 2, "cls": "low"},
            ],
            "cluster": {
                "servers": 1,
                "param_servers": 1,
                "replica": {"max_num_seqs": 4, "streams": streams, "stream_share": share},
            },
            "workload": {
                "kind": "poisson",
                "requests": 80,
                "rate": 400,
                "input_tokens": {"dist": "fixed", "mean": 64},
                "output_tokens": {"dist": "fixed", "mean": 64},
                "classes": [{"name": "high", "slo": "60s"}, {"name": "low", "slo": "60s"}],
            },
        }
    )


def _ends(streams: str, share: float) -> tuple[float, float, float]:
    """(last completion of high, of low, of all)."""
    req = run_scenario(_two_models(streams, share), seed=0).requests
    end = req.groupby("cls")["end"].max()
    return float(end["high"]), float(end["low"]), float(req["end"].max())


def test_backlogged_streams_share_the_gpu_by_stream_share() -> None:
    """Both models backlogged from t=0: the fluid model of two streams sharing the GPU. The
    high stream's work W_h is share x T_h while both run (share 0.8: high ends first); with
    share 0.2 low ends first at T_l and high then runs alone, W_h = 0.2 T_l + (T - T_l).
    Both runs must give the same W_h, and the same total (work conserving)."""
    h8, l8, t8 = _ends("isolated", 0.8)
    h2, l2, t2 = _ends("isolated", 0.2)
    h5, _, t5 = _ends("isolated", 0.5)
    assert h8 < l8 and l2 < h2  # the larger share finishes first
    assert h8 < h5 < h2
    assert t8 == pytest.approx(t2, rel=0.01) and t5 == pytest.approx(t2, rel=0.01)
    w_h_a = 0.8 * h8
    w_h_b = 0.2 * l2 + (t2 - l2)
    assert w_h_a == pytest.approx(w_h_b, rel=0.03)
    w_l_a = 0.2 * h8 + (t8 - h8)
    assert w_l_a == pytest.approx(0.8 * l2, rel=0.03)


def test_isolation_cuts_the_high_priority_tail_and_keeps_busy_time_honest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """multi-model-coloring, colouring on, 40 s: with a stream of its own the high class no
    longer waits for low models' turns and weight fetches. A replica's busy time is exactly
    the time spent inside its (outermost) turns: the high stream's iterations that ran while a
    low iteration waited for weights are counted once, not twice."""
    sc = load_scenario(ROOT / "scenarios" / "multi-model-coloring.yaml",
                       overrides=["workload.duration=40s"])  # fmt: skip
    runs = {v.name: variant(sc, v) for v in sc.variants}
    p99 = {}
    for name in ("color-lru", "color-lru-streams"):
        s = run_scenario(runs[name], seed=1).summary
        assert s["requests"]["unfinished"] == 0
        p99[name] = s["per_class"]["high"]["latency"]["e2e"]["p99"]
    assert p99["color-lru-streams"] < 0.8 * p99["color-lru"]

    outer = {"depth": 0, "time": 0.0}
    turn = ComputeNode.turn

    def timed(self: ComputeNode, m: int) -> Generator[Any, Any, None]:
        outer["depth"] += 1
        t0 = self.env.now
        yield from turn(self, m)
        outer["depth"] -= 1
        if outer["depth"] == 0:
            outer["time"] += self.env.now - t0

    monkeypatch.setattr(ComputeNode, "turn", timed)
    cl = build(runs["color-lru-streams"], 1, load_catalogue(), load_profile(sc.profile), CostModel)
    cl.run()
    node = cl.ctx.nodes[0]
    assert node.lent > 0.5  # the high stream ran while low iterations waited for weights
    assert node.busy == pytest.approx(outer["time"], abs=1e-6)


def test_isolation_needs_a_protected_and_another_class() -> None:
    sc = _two_models("isolated", 0.5)
    data = sc.model_dump(mode="json")
    data["deployments"][1]["cls"] = "high"
    bad = validate(data)
    with pytest.raises(InputError, match="streams: isolated"):
        build(bad, 0, load_catalogue(), load_profile(bad.profile), CostModel)
