"""The compressed day plan against the day played as given: every setting's GPU-hours and
attainment, and the answer (slow: the uncompressed day is 144,000 requests a run)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from sim.study.plan import run_plan
from sim.study.planspec import PlanFile
from tests.sim.control.autoscale.conftest import BASE


def _plan(tmp_path: Path, compress: bool) -> PlanFile:
    sc = copy.deepcopy(BASE)
    sc["metrics"] = {"warmup": 0}
    sc["mode"] = "pd"
    sc["warmup"] = {"node_hbm": True}
    sc["cluster"]["gpu"] = {"weight_cache_fraction": 0.9}
    sc["autoscale"]["cold_start"] = {"load_from": "peers"}
    sc["autoscale"]["max_replicas"] = 6
    # a 3,600 s day at 40 req/s mean: cosine from 0.2 to 1 of its peak at 15:00, a flash
    # crowd at 09:00
    sc["workload"] = {
        "kind": "profile",
        "rate": 40,
        "duration": 3600,
        "rate_profile": {
            "day": 3600,
            "trough_ratio": 0.2,
            "peak_hour": 15,
            "surges": [
                {"at": "9h", "multiplier": 1.5, "rise": "20min", "hold": "1h", "decay": "1h"}
            ],
        },
        "input_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.5, "low": 16, "high": 2048},
        "output_tokens": {"dist": "lognormal", "mean": 64, "sigma": 0.5, "low": 4, "high": 256},
        "classes": [{"name": "normal", "slo": "10s", "ttft_slo": "2s"}],
    }
    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(sc))
    return PlanFile.model_validate(
        {
            "scenario": str(path),
            "seeds": 1,
            "slo": {"sustain": False},
            "day": {
                "attainment": 0.95,  # bound min(0.05, 1 - 0.95): c = 5
                "min_replicas": [1],
                "max_replicas": [6],
                "target": [0.5, 0.9],
                "static_range": [1, 6],
                "compress": compress,
            },
        }
    )


@pytest.mark.slow
def test_compressed_plan_matches_the_day_played_as_given(tmp_path: Path) -> None:
    fast = run_plan(_plan(tmp_path, True), tmp_path / "day.yaml", tmp_path / "fast")
    full = run_plan(_plan(tmp_path, False), tmp_path / "day.yaml", tmp_path / "full")
    assert fast.compare is not None and full.compare is not None
    comp = fast.compare["compression"]
    assert comp["factor"] >= 4 and full.compare["compression"]["factor"] == 1
    bound = comp["catch_up_share"]  # <= 0.05: the compression's own bound
    key = ["kind", "min_replicas", "max_replicas", "target", "replicas"]
    a = fast.frontier.set_index(key)
    b = full.frontier.set_index(key)
    common = a.index.intersection(b.index)
    assert len(common) >= 4
    for idx in common:
        # GPU-hours: the lag covers a c times larger share of the day, at most the catch-up
        # share of the replica-time
        ga, gb = a.loc[idx, "gpu_hours"], b.loc[idx, "gpu_hours"]
        assert abs(ga / gb - 1) <= bound, (idx, ga, gb)
    for idx in [i for i in common if i[0] == "autoscaled"]:
        # attainment: at most that share of the requests arrives while the cluster catches up
        assert abs(a.loc[idx, "attainment"] - b.loc[idx, "attainment"]) <= bound, idx
        assert a.loc[idx, "meets_slo"] == b.loc[idx, "meets_slo"], idx
    assert fast.compare["choice"] == full.compare["choice"]
    assert fast.compare["autoscale"] == full.compare["autoscale"]
    # a static count the peak overloads builds a queue c times shallower compressed: the
    # compressed count may be one short at the edge (here 3 against 4), never more
    n_fast, n_full = fast.compare["static_replicas"], full.compare["static_replicas"]
    assert n_full - 1 <= n_fast <= n_full
    assert fast.compare["saved"] <= full.compare["saved"]  # so the saving is a lower bound
