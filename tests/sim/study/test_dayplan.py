"""A plan for a day: the cheapest passing autoscaler setting, the smallest passing static
count, and the GPU-hours saved, on a one-minute "day" (a step burst)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from engine.errors import InputError
from sim.study.plan import run_plan
from sim.study.planspec import PlanFile, load_plan_file
from tests.sim.control.autoscale.conftest import BASE


def _plan(tmp_path: Path, **day: object) -> tuple[PlanFile, Path]:
    sc = copy.deepcopy(BASE)
    sc["metrics"] = {"warmup": 0}
    sc["mode"] = "pd"  # new replicas serve ~3 s after the decision (multicast from a peer)
    sc["warmup"] = {"node_hbm": True}
    sc["cluster"]["gpu"] = {"weight_cache_fraction": 0.9}
    sc["autoscale"]["cold_start"] = {"load_from": "peers"}
    sc["workload"]["steps"] = [{"at": "20s", "rate": 40}, {"at": "40s", "rate": 1}]
    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(sc))
    spec = PlanFile.model_validate(
        {
            "scenario": str(path),
            "seeds": 1,
            "slo": {"sustain": False},
            "day": {
                "attainment": 0.9,
                "min_replicas": [1],
                "max_replicas": [4, 6],
                "target": [0.7],
                "static_range": [1, 6],
                **day,
            },
        }
    )
    return spec, path


def test_day_plan_answers_the_cheapest_passing_setting_and_the_static_peak(
    tmp_path: Path,
) -> None:
    spec, path = _plan(tmp_path)
    res = run_plan(spec, path, tmp_path / "out")
    df, ans = res.frontier, res.compare
    assert ans is not None
    auto = df[df["kind"] == "autoscaled"]
    static = df[df["kind"] == "static"].set_index("replicas")
    n = ans["static_replicas"]
    assert n is not None and bool(static.loc[n, "meets_slo"])
    if n > 1:  # the bisection's answer is the smallest: one fewer fails
        assert not bool(static.loc[n - 1, "meets_slo"])
    passing = auto[auto["meets_slo"]]
    assert not passing.empty
    assert ans["gpu_hours"] == pytest.approx(passing["gpu_hours"].min())
    assert ans["saved"] == pytest.approx(1 - ans["gpu_hours"] / ans["static_gpu_hours"])
    assert ans["saved"] > 0  # the burst is a third of the day: static pays for its peak all day
    assert (tmp_path / "out" / "plan.json").exists()


def test_day_plan_without_a_passing_setting_says_none(tmp_path: Path) -> None:
    spec, path = _plan(tmp_path, attainment=1.0, max_replicas=[1], static_range=[1, 1])
    res = run_plan(spec, path, tmp_path / "out")
    assert res.compare is not None and res.compare["choice"] == "none"
    assert res.compare["static_replicas"] is None


def test_day_section_rejects_unknown_keys(tmp_path: Path) -> None:
    bad = tmp_path / "plan.yaml"
    bad.write_text("scenario: x.yaml\nslo: {sustain: false}\nday: {maximum: [3]}\n")
    with pytest.raises(InputError, match=r"day\.maximum"):
        load_plan_file(bad)
