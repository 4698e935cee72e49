"""Faults in a disaggregated cluster, through the existing fault injection with the checkers
on: killing a decode or a prefill replica, partitioning the KV-transfer path. No request is
lost: every one completes (re-routed) or is reported."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.cluster import build
from sim.control.faultinject import attach
from sim.runner import run_scenario
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.metrics import DONE
from sim.serving.models import load_catalogue

from .conftest import scenario

# packed layout, P D P D: node0 and node2 prefill, node1 and node3 decode
POOLS = {"prefill": {"replicas": 2, "tp": 1}, "decode": {"replicas": 2, "tp": 1}}
WORKLOAD = {
    "requests": 60,
    "rate": 6.0,
    "output_tokens": {"dist": "uniform", "low": 200, "high": 400},
}


def _run(schedule: list[dict[str, Any]], **dis: Any) -> dict[str, Any]:
    sc = scenario(
        workload=WORKLOAD,
        disaggregation={**POOLS, **dis},
        faults={"enabled": True, "raft": {"replicas": 3}, "schedule": schedule},
    )
    res = run_scenario(sc, seed=3)
    s = res.summary
    r = s["requests"]
    # every acknowledged request is accounted for: completed, shed, degraded or unfinished
    assert (
        r["completed"] + r["shed"] + r["rejected"] + r["degraded"] + r["unfinished"] == r["total"]
    )
    assert s["faults"]["violations"] == []
    s["_status"] = res.requests["status"].to_numpy()
    return s


def test_killing_a_decode_replica_loses_no_acknowledged_request() -> None:
    s = _run([{"at": 3.0, "kind": "kill", "target": "node1"}])
    r = s["requests"]
    assert r["completed"] == r["total"] == 60  # all re-routed to the live decode replica
    applied = [(a["kind"], a["target"]) for a in s["faults"]["schedule"]]
    assert ("kill", "node1") in applied
    deg = s["faults"]["degradation"]
    assert deg["node_kills"] == 1 and deg["migrated"] > 0  # it held requests when it died
    assert s["disaggregation"]["kv_transfers"] >= 60 - 1


def test_killing_a_prefill_replica_loses_no_acknowledged_request() -> None:
    s = _run([{"at": 3.0, "kind": "kill", "target": "node0"}])
    assert s["requests"]["completed"] == 60
    assert s["faults"]["degradation"]["node_kills"] == 1


def test_partitioning_the_kv_path_holds_transfers_until_it_heals() -> None:
    # both decode replicas cut off from prefill replica node0 for 2 s
    sched = [
        {"at": 2.0, "kind": "partition", "shape": "isolate", "target": "node0", "duration": 2.0}
    ]
    sc = scenario(
        workload=WORKLOAD,
        disaggregation={**POOLS, "placement": "split"},
        faults={"enabled": True, "raft": {"replicas": 3}, "schedule": sched},
    )
    cl = build(sc, 3, load_catalogue(None), load_profile(sc.profile), CostModel)
    ctl = attach(cl)
    assert ctl is not None
    cl.run()
    assert ctl.finish(cl.env.now, cl.ctx.trace.hexdigest())["faults"]["violations"] == []
    co, met = cl.ctx.disagg, cl.ctx.metrics
    assert np.all(met.status == DONE)
    assert co.blocked > 0  # some transfer waited for the heal
    # KV handed over by node0 while it was cut off landed only after the heal (t = 4 s)
    cut = (met.node == 0) & (co.handoff >= 2.0) & (co.handoff < 4.0)
    assert cut.any()
    landed = co.handoff[cut] + co.wait[cut]
    assert np.all(landed >= 4.0)
    # the other prefill replica was never cut off: its transfers did not wait
    other = (met.node == 2) & ~np.isnan(co.wait)
    assert np.all(co.wait[other] < 0.01)
