"""A plan's report (issue 41, item 7): the pass rule and non-monotone probes stated, busiest
vs saturating resource, costs with a unit, counts as integers in plan.json."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.study.planreport import PlanResult, answer_sentence, plan_json, plan_notes
from sim.study.planspec import RESOURCES, PlanFile, Probe


def _spec(**kw: object) -> PlanFile:
    return PlanFile.model_validate({"scenario": "x.yaml", "slo": {"p99": {"all": "5s"}}, **kw})


def _probe(size: int, qps: float, frac: float, need: float = 1.0) -> Probe:
    return Probe({}, size, qps, frac >= need, frac, dict.fromkeys(RESOURCES, 0.1))


def test_notes_state_the_pass_rule_and_each_contradicted_failure() -> None:
    spec = _spec(min_pass_fraction=0.5)
    probes = [_probe(4, 30.0, 0.25, 0.5), _probe(4, 34.48, 1.0), _probe(5, 30.0, 1.0),
              _probe(4, 40.0, 0.0, 0.5), _probe(2, 35.0, 0.25, 0.5)]  # fmt: skip
    notes = plan_notes(probes, spec, 4)
    assert notes[0].startswith("pass rule: a probe (size, load) passes when 2 of its 4 seeds")
    # (4, 30) failed though (4, 34.48) passed; (4, 40) and (2, 35) contradict nothing
    assert notes[1:] == [
        "not monotone: cluster.servers=4 failed at 30 QPS (1 of 4 seeds passed) while "
        "cluster.servers=4 passed at 34.48 QPS: seed-to-seed noise near the boundary; more "
        "seeds narrow it"
    ]
    assert len(plan_notes([p for p in probes if p.qps != 34.48], spec, 4)) == 1


def _row(util_mbu: float, cost: float) -> dict[str, object]:
    util = {f"util_{r}": 0.0 for r in RESOURCES} | {"util_mbu": util_mbu}
    return {"question": "min-size", "qps": 1200.0, "size": 62.0, "gpus": 496.0,
            "cost": cost, "saturates_first": "mbu", **util}  # fmt: skip


def test_answer_names_saturation_only_near_it_and_gives_the_costs_unit() -> None:
    hourly = _spec(gpu_hour_cost=3.5, size_range=[1, 128])
    text = answer_sentence(_row(0.27, 1736.0), hourly)
    assert text == (
        "1200 QPS: smallest cluster.servers = 62 (496 GPUs); cost 1,736 per hour (GPUs x 3.5 "
        "per GPU-hour); busiest: mbu (27%), none near saturation"
    )
    per_unit = _spec(costs={"cluster.servers": 3.0})
    text = answer_sentence(_row(0.95, 186.0), per_unit)
    assert text.endswith("cost 186 (cluster.servers x 3); saturates first: mbu (95%)")


def test_plan_json_gives_counts_as_integers(tmp_path: Path) -> None:
    rows = [{**_row(0.5, 1.0), "answered": True, "servers": 62.0, "tp": 8.0, "pp": 1.0},
            {**_row(0.5, 1.0), "question": "max-qps", "servers": None, "gpus": None}]  # fmt: skip
    out = plan_json(PlanResult(pd.DataFrame(rows), tmp_path, [], notes=["n"]))
    assert out["answer"]["servers"] == 62 and isinstance(out["answer"]["servers"], int)
    assert out["answer"]["gpus"] == 496 and out["frontier"][0]["size"] == 62
    assert out["frontier"][1]["servers"] is None and out["notes"] == ["n"]
