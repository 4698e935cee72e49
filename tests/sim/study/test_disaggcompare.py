"""The compare plan: candidate enumeration, analytic bounds, the bisection over GPU counts
(against a brute-force reference on a stubbed evaluation), and the --json shape end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.study.disaggcandidates import Bounds, Candidate, aggregated, disaggregated
from sim.study.disaggcompare import Compare, CompareCfg

ROOT = Path(__file__).resolve().parents[3]


def test_candidates_stay_within_the_budget_and_count_their_gpus() -> None:
    agg = aggregated([1, 2, 4], gps=8, budget=8, max_replicas=32)
    assert sorted((c.decode["tp"], c.decode["replicas"]) for c in agg) == sorted(
        [(1, r) for r in range(1, 9)] + [(2, r) for r in range(1, 5)] + [(4, 1), (4, 2)]
    )
    assert all(c.gpus == c.decode["replicas"] * c.decode["tp"] <= 8 for c in agg)
    dis = disaggregated([1, 2], [1, 2], max_replicas=3, gps=8, budget=6, placement="packed")
    for c in dis:
        assert c.prefill is not None
        assert (
            c.gpus
            == c.prefill["replicas"] * c.prefill["tp"] + c.decode["replicas"] * c.decode["tp"]
        )
        assert c.gpus <= 6 and c.overrides["disaggregation.enabled"] is True
    # brute force: every (ptp, pn, dtp, dn) within the budget
    want = {
        (pt, pn, dt, dn)
        for pt in (1, 2)
        for dt in (1, 2)
        for pn in range(1, 4)
        for dn in range(1, 4)
        if pn * pt + dn * dt <= 6
    }
    got = {(c.prefill["tp"], c.prefill["replicas"], c.decode["tp"], c.decode["replicas"])
           for c in dis if c.prefill}  # fmt: skip
    assert got == want


def test_bounds_reject_a_70b_model_at_tp1_and_scale_with_replicas() -> None:
    from sim.scenario import load_scenario
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    sc = load_scenario(ROOT / "scenarios" / "disagg-llama70b-h200.yaml")
    b = Bounds(sc, load_catalogue(None), load_profile(sc.profile), CostModel)
    one = aggregated([1, 8], gps=8, budget=16, max_replicas=2)
    for c in one:
        b.apply(c)
    tp1 = [c for c in one if c.decode["tp"] == 1]
    tp8 = [c for c in one if c.decode["tp"] == 8]
    assert all(c.infeasible and "tp=1" in c.infeasible for c in tp1)
    assert [c.decode["replicas"] for c in tp8] == [1, 2]
    assert tp8[1].bound_rps == pytest.approx(2 * tp8[0].bound_rps)
    assert tp8[0].tpot_floor_s > 0
    d = disaggregated([8], [8], max_replicas=2, gps=8, budget=32, placement="packed")
    for c in d:
        b.apply(c)
    by = {(c.prefill["replicas"], c.decode["replicas"]): c.bound_rps for c in d if c.prefill}
    # the bound is the smaller pool's: doubling both pools doubles it
    assert by[(2, 2)] == pytest.approx(2 * by[(1, 1)])
    assert by[(2, 1)] >= by[(1, 1)] and by[(1, 2)] >= by[(1, 1)]


class _Stub(Compare):
    """Compare with runs replaced by a pass rule: a candidate passes at >= ``need`` GPUs."""

    def __init__(self, need: dict[str, int], extra: int) -> None:
        self.cfg = CompareCfg(extra_per_rung=extra)
        self.done = {}
        self.need = need
        self.calls = 0

    def evaluate(self, cands: list[Candidate]) -> list[bool]:
        for c in cands:
            if c.label not in self.done:
                self.calls += 1
                ok = c.gpus >= self.need[c.family]
                c.metrics = [{"goodput_rps": 10.0, "latency.tpot.p99": 0.01}] if ok else [None]
                self.done[c.label] = (c, ok, [] if ok else ["too small"])
        return [self.done[c.label][1] for c in cands]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 3), st.sampled_from([4, 8, 16, 32]))
def test_bisection_finds_the_smallest_passing_gpu_count(
    need_a: int, need_d: int, extra: int, budget: int
) -> None:
    fams = {
        "aggregated": aggregated([1, 2], 8, budget, 64),
        "disaggregated": disaggregated([1, 2], [1], 4, 8, budget, "packed"),
    }
    for cs in fams.values():
        for c in cs:
            c.bound_rps = 1.0
    stub = _Stub({"aggregated": need_a, "disaggregated": need_d}, extra)
    best = stub.search(fams)
    for f, cs in fams.items():
        passing = [c.gpus for c in cs if c.gpus >= stub.need[f]]
        if not passing:
            assert best[f] is None
        else:
            got = best[f]
            assert got is not None and got.gpus == min(passing)  # the reference: brute force
    rungs = max(len({c.gpus for c in cs}) for cs in fams.values())
    # each family: the top, then ~log2(rungs) probes, then `extra` more at the answer
    assert stub.calls <= 2 * (2 + rungs.bit_length() + extra)


@pytest.mark.slow
def test_compare_plan_json_has_both_families_and_a_choice(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pdsim.cli import app

    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"scenario: {ROOT / 'scenarios' / 'disagg-llama8b-h200.yaml'}\n"
        "seeds: 1\nset: {workload.duration: 10s}\n"
        "slo: {ttft: {p99: {all: 2s}}, tpot: {p99: {all: 60ms}}}\n"
        "qps: [20]\n"
        "compare: {gpu_budget: 4, aggregated_tp: [1], prefill_tp: [1], decode_tp: [1],"
        " max_replicas: 3, extra_per_rung: 0}\n"
    )
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["plan", str(plan), "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res: dict[str, Any] = json.loads(r.output.strip().splitlines()[-1])
    assert res["choice"] in ("aggregated", "disaggregated", "none")
    for fam in ("aggregated", "disaggregated"):
        a = res[fam]
        assert {"gpus", "decode", "throughput_per_gpu", "meets_slo"} <= set(a)
        if a["meets_slo"]:
            assert a["throughput_per_gpu"] > 0 and a["gpus"] <= 4
    assert "prefill" in res["disaggregated"]
    if res["choice"] != "none":
        other = "aggregated" if res["choice"] == "disaggregated" else "disaggregated"
        assert res[res["choice"]]["throughput_per_gpu"] >= (res[other]["throughput_per_gpu"] or 0)
    assert (out / "frontier.png").stat().st_size > 0
    assert json.loads((out / "plan.json").read_text())["choice"] == res["choice"]
