"""The shipped drill scenarios end to end at reduced size, through ``run_scenario``."""

from __future__ import annotations

from sim.runner import run_scenario
from sim.scenario import load_scenario

from .conftest import SCEN


def _run(name: str, *over: str) -> dict:
    sc = load_scenario(SCEN / f"{name}.yaml", ["workload.requests=24", *over])
    s = run_scenario(sc, seed=1).summary
    r = s["requests"]
    assert r["completed"] + r["shed"] + r["rejected"] + r["degraded"] == r["total"]
    f = s["faults"]
    assert f["violations"] == [] and f["linearizability_checked"]
    return s


def test_kill_param_server_drill() -> None:
    s = _run("chaos-kill-param-server")
    f = s["faults"]
    kinds = [(a["kind"], a["target"]) for a in f["schedule"]]
    assert ("kill", "ps1") in kinds and ("restart", "ps1") in kinds
    assert f["degradation"]["replica_retries"] > 0  # reads went around the dead server
    assert f["replication_recovery_s"] and f["recovery_time_s"] > 0  # re-replicated
    assert s["recovery_time_s"] == f["recovery_time_s"]
    assert f["time_to_elect_s"] and all(0 < t < 2.0 for t in f["time_to_elect_s"])
    assert [d["downtime_s"] for d in f["downtime"]] == [1.0, 0.5]


def test_partition_drill() -> None:
    s = _run("chaos-partition")
    f = s["faults"]
    shapes = [a.get("shape") for a in f["schedule"] if a["kind"] == "partition"]
    assert shapes == ["majority-minority", "majorities-ring", "bridge"]
    assert f["time_to_elect_s"], "isolating the leader's side must elect a new leader"
    assert f["degradation"]["replica_retries"] > 0
    assert f["raft"]["dropped"] > 0


def test_corrupt_chunk_drill_detects_every_corruption() -> None:
    s = _run("chaos-corrupt-chunk")
    integ = s["faults"]["integrity"]
    print("corruption drill:", integ)
    assert integ["injected"] == 12
    assert integ["detected"] + integ["cancelled"] == integ["injected"]
    assert integ["corrupted_chunks_used"] == 0
    assert integ["repaired"] == integ["detected"]  # one injection per copy in this drill
    assert integ["still_corrupt"] == 0
    assert integ["reads_refused"] > 0  # some were caught on the read path, not the scrub


def test_raft_stress_drill() -> None:
    s = _run("raft-stress")
    f = s["faults"]
    assert f["raft"]["leaders"] >= 4 and f["raft"]["dropped"] > 0
    assert len(f["time_to_elect_s"]) >= 3
    assert f["raft"]["acked_writes"] > 50
