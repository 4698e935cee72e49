"""The compare plan: candidate enumeration, analytic bounds, the search for the fewest passing
GPUs (against a brute-force reference on a stubbed evaluation), and the --json shape end to end."""

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
    from sim.serving.costmodel import load_profile
    from sim.serving.models import load_catalogue

    sc = load_scenario(ROOT / "scenarios" / "disagg-llama70b-h200.yaml")
    b = Bounds(sc, load_catalogue(None), load_profile(sc.profile))
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


def test_bounds_are_tp_aware_and_never_undercharge_the_simulator() -> None:
    """A bigger tp serves more per replica and decodes faster; the TPOT floor is below the
    simulator's own one-sequence decode step (a bound must not skip what could pass)."""
    from sim.scenario import load_scenario
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    sc = load_scenario(ROOT / "scenarios" / "disagg-llama70b-h200.yaml")
    prof, cat = load_profile(sc.profile), load_catalogue(None)
    b = Bounds(sc, cat, prof)
    r2, r4, r8 = (b.per_tp(tp) for tp in (2, 4, 8))
    assert r2.token_rate < r4.token_rate < r8.token_rate
    assert r8.tpot_floor_s < r4.tpot_floor_s < r2.tpot_floor_s
    for tp, bd in ((2, r2), (8, r8)):
        cost = CostModel(prof, cat["llama-3.1-70b"], tp=tp, gpus_per_server=8)
        c, k, _, _ = cost.iteration.work(0, 0.0, 0, 1, 512.0)
        assert bd.tpot_floor_s <= c + k


class _Stub(Compare):
    """Compare with runs replaced by a monotone pass rule ``passes(candidate)``."""

    def __init__(self, passes: Any) -> None:
        self.cfg = CompareCfg()
        self.done = {}
        self.passes = passes
        self.calls = 0

    def evaluate(self, cands: list[Candidate]) -> list[bool]:
        for c in cands:
            if c.label not in self.done:
                self.calls += 1
                ok = bool(self.passes(c))
                c.metrics = [{"goodput_rps": 10.0, "latency.tpot.p99": 0.01}] if ok else [None]
                self.done[c.label] = (c, ok, [] if ok else ["too small"])
        return [self.done[c.label][1] for c in cands]


@settings(max_examples=80, deadline=None)
@given(
    agg_need=st.dictionaries(st.sampled_from([1, 2, 4]), st.integers(1, 40), min_size=3),
    stairs=st.dictionaries(
        st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2])),
        st.lists(st.integers(1, 7), min_size=6, max_size=6),
        min_size=4,
    ),
    budget=st.sampled_from([8, 16, 32]),
)
def test_search_finds_the_smallest_passing_gpu_count_of_every_family(
    agg_need: dict[int, int], stairs: dict[tuple[int, int], list[int]], budget: int
) -> None:
    """Within a sub-family more replicas never hurt; the search must find each family's
    fewest passing GPUs among all candidates (the reference: brute force over all of them).
    Aggregated tp passes from ``agg_need[tp]`` replicas; a disaggregated (ptp, dtp) pool pair
    passes when its decode replicas reach a staircase ``g(prefill replicas)`` that never
    rises (``stairs``: g for 1..6 prefill replicas, sorted descending; 7 never passes)."""
    g = {k: sorted(v, reverse=True) for k, v in stairs.items()}

    def passes(c: Candidate) -> bool:
        if c.prefill is None:
            return c.decode["replicas"] >= agg_need[c.decode["tp"]]
        need = g[(c.prefill["tp"], c.decode["tp"])][c.prefill["replicas"] - 1]
        return c.decode["replicas"] >= need

    fams = {
        "aggregated": aggregated([1, 2, 4], 8, budget, 64),
        "disaggregated": disaggregated([1, 2], [1, 2], 6, 8, budget, "packed"),
    }
    stub = _Stub(passes)
    best = stub.search(fams)
    for f, cs in fams.items():
        passing = [c.gpus for c in cs if passes(c)]
        got = best[f]
        if not passing:
            assert got is None
        else:
            assert got is not None and got.gpus == min(passing)
    assert stub.calls < sum(len(cs) for cs in fams.values()) / 2  # far from brute force


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
        " max_replicas: 3}\n"
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


def _fixed_70b_plan(tmp_path: Path, slo: str, **extra: str) -> Path:
    """The shipped 70B fixed 512/128 compare plan with ``slo`` (YAML flow) in place of its
    own, written next to a copy of its scenario."""
    import re

    text = (ROOT / "scenarios" / "plan-disagg-70b-fixed.yaml").read_text()
    text = re.sub(r"slo:\n(  .*\n)+", f"slo: {slo}\n", text)
    for key, value in extra.items():
        text = re.sub(rf"  {key}: .*\n", f"  {key}: {value}\n", text)
    (tmp_path / "disagg-llama70b-h200.yaml").write_text(
        (ROOT / "scenarios" / "disagg-llama70b-h200.yaml").read_text()
    )
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_plan_no_deployment_can_meet_exits_1_naming_the_limit(tmp_path: Path) -> None:
    """No decode step of a 70B model takes 1 ms: the bounds skip every candidate (no run)
    and the plan exits 1 with the TPOT limit and the fastest step any candidate could take."""
    from typer.testing import CliRunner

    from pdsim.cli import app

    plan = _fixed_70b_plan(tmp_path, "{tpot: {p50: {all: 1ms}}}")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["plan", str(plan), "--json", "--out", str(out)])
    assert r.exit_code == 1, r.output
    res = json.loads(r.output.strip().splitlines()[-1])
    assert res["choice"] == "none" and res["runs"] == 0
    assert "TPOT limit 1 ms" in res["shortfall"] and "fastest decode step" in res["shortfall"]
    assert "no candidate meets the SLOs: TPOT limit 1 ms" in r.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slo", "family", "most_gpus", "tps"),
    [
        # a tp-blind screen once pruned every candidate here ("choice: none")
        ("{ttft: {p50: {all: 1s}}, tpot: {p50: {all: 25ms}}}", "aggregated", 48, (4, 8)),
        # ... and answered 22 x tp2 = 44 GPUs here, though 9 x tp4 = 36 GPUs passes
        ("{ttft: {p50: {all: 1s}}, tpot: {p50: {all: 30ms}}}", "aggregated", 40, (4, 8)),
        # the top-ranked-candidate-per-rung search answered 42 GPUs; 32 pass
        ("{ttft: {p99: {all: 1s}}, tpot: {p99: {all: 30ms}}}", "disaggregated", 34, (2, 4, 8)),
    ],
)
def test_the_70b_fixed_plan_finds_the_small_deployments(
    tmp_path: Path, slo: str, family: str, most_gpus: int, tps: tuple[int, ...]
) -> None:
    from typer.testing import CliRunner

    from pdsim.cli import app

    plan = _fixed_70b_plan(tmp_path, slo)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["plan", str(plan), "--json", "--workers", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output.strip().splitlines()[-1])
    got = res[family]
    assert got["meets_slo"] and got["gpus"] <= most_gpus, got
    assert got["decode"]["tp"] in tps
