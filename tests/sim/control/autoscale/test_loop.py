"""The control loop in a running cluster: a step burst scales out in time, scale-in drains
without losing a request, the size stays in bounds, runs replay, bad sections are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.errors import InputError
from sim.runner import run_scenario
from tests.sim.control.autoscale.conftest import scenario

BURST_AT = 20.0


def _run(*sets: str, seed: int = 1):  # type: ignore[no-untyped-def]
    return run_scenario(scenario(*sets), seed=seed)


@pytest.mark.parametrize("policy_sets", [(), ("autoscale.policy=slo",)])
def test_a_step_burst_scales_out_within_interval_plus_cooldown(
    policy_sets: tuple[str, ...],
) -> None:
    r = _run(*policy_sets)
    a = r.summary["autoscale"]
    cfg = scenario().autoscale
    outs = [e for e in a["events"] if e["action"] == "out"]
    assert outs, "the burst (1 -> 40 req/s on one replica) must scale out"
    assert all(e["t"] > BURST_AT for e in outs)  # nothing to react to before it
    assert outs[0]["t"] <= BURST_AT + cfg.interval + cfg.cooldown


def test_scale_in_drains_and_loses_no_request() -> None:
    r = _run()
    s, a = r.summary, r.summary["autoscale"]
    assert a["replicas_drained"] >= 1
    req = s["requests"]
    assert req["completed"] == req["total"]  # count in == count out
    assert req["shed"] == req["unfinished"] == req["rejected"] == 0
    df = r.requests
    for cs in a["cold_starts"]:  # a new replica gets requests only once it serves
        mine = df[df["node"] == cs["replica"]]
        assert (mine["arrival"] >= cs["serving"] - 1e-9).all()
    for e in (e for e in a["events"] if e["action"] == "in"):
        for idx in e["nodes"]:  # ... and none after its drain began; it finished them all
            mine = df[df["node"] == idx]
            assert len(mine) and (mine["arrival"] <= e["t"]).all()
            assert (mine["status"] == "done").all()


def test_size_never_leaves_bounds_in_a_run() -> None:
    r = _run("autoscale.max_replicas=3", "autoscale.scale_up_step=4")
    ts = r.autoscale
    assert ts is not None
    held = ts["provisioning"] + ts["loading"] + ts["serving"] + ts["draining"]
    assert held.max() == 3 and r.summary["autoscale"]["peak_replicas"] == 3
    assert (ts["serving"] + ts["provisioning"] + ts["loading"] >= 1).all()


def test_gpu_hours_count_each_replica_from_decision_to_release() -> None:
    r = _run()
    a = r.summary["autoscale"]
    end = r.summary["sim_time_s"]
    starts = {c["replica"]: c["decision"] for c in a["cold_starts"]}
    # replica 0 holds its GPU all run; the others from their decision on (released ones
    # stopped earlier), so GPU-hours lie between replica 0 alone and everyone all run
    lo = end / 3600
    hi = (end + sum(end - t for t in starts.values())) / 3600
    assert lo < a["gpu_hours"] <= hi + 1e-9
    assert a["cost"] == pytest.approx(a["gpu_hours"] * 2.0)
    assert 0 < a["reclaim"] < 1


def test_same_seed_same_trace_and_scaling_changes_it() -> None:
    a, b = _run(), _run()
    assert a.trace_hash == b.trace_hash
    off = _run("autoscale.enabled=false")
    assert off.trace_hash != a.trace_hash
    assert "autoscale" not in off.summary and off.autoscale is None


def test_windows_attainment_drops_in_the_burst_and_recovers() -> None:
    ts = _run().autoscale
    assert ts is not None
    before = ts[ts["t"] <= BURST_AT]["slo_attainment"].dropna()
    assert (before == 1.0).all()
    assert np.nanmin(ts["slo_attainment"]) < 1.0
    assert ts["slo_attainment"].dropna().iloc[-1] == 1.0


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (
            ("mode=coupled", "autoscale.cold_start.load_from=peers"),
            "autoscale.cold_start.load_from",
        ),
        (("mode=pd", "autoscale.cold_start.load_from=object"), "autoscale.cold_start.load_from"),
        (("autoscale.min_replicas=2",), "autoscale.min_replicas"),
        (("autoscale.policy=predictive",), "replica_rate"),
        (("autoscale.min_replicas=4", "autoscale.max_replicas=3"), "min_replicas"),
    ],
)
def test_bad_sections_name_the_field(sets: tuple[str, ...], field: str) -> None:
    with pytest.raises(InputError) as err:
        run_scenario(scenario(*sets), seed=1)
    assert field in str(err.value)


def test_an_autoscaling_run_replays_to_its_hash(tmp_path: Path) -> None:
    from sim.study.recording import replay

    sc = scenario()
    res = run_scenario(sc, seed=2, out_dir=tmp_path)
    assert res.out_dir is not None
    rep = replay(res.out_dir / "replay.json")
    assert rep.matches, rep
    # the run folder carries the timeline and its plot
    tl = pd.read_parquet(res.out_dir / "autoscale.parquet")
    assert {"serving", "provisioning", "gpus", "slo_attainment"} <= set(tl.columns)
    assert (res.out_dir / "autoscale.png").stat().st_size > 0


def test_replica_seconds_held_is_the_overlap_of_each_replica_with_the_window() -> None:
    from sim.control.autoscale.loop import Autoscaler
    from tests.sim.control.autoscale.conftest import built

    sc = scenario()
    cl, prof = built(sc)
    a = Autoscaler(cl, prof.coldstart)
    a.acquired.update({1: 10.0, 2: 20.0, 3: 50.0})
    a.released.update({1: 30.0})
    # window [5, 40]: replica 0 35 s, 1 20 s (10..30), 2 20 s (20..40), 3 none (from 50)
    assert a.replica_seconds(5.0, 40.0) == 75.0
