"""Model pushes (vector-clock versions, pinned batches) and node-failure degradation."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cluster import build
from sim.control.faultinject import attach
from sim.control.runcheckers import CheckerViolation
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.metrics import DEGRADED, DONE
from sim.serving.models import load_catalogue
from sim.study.recording import run_checked

from .conftest import small


def _quiet(*schedule: str) -> list[str]:
    return ["faults.random.enabled=false", f"faults.schedule=[{', '.join(schedule)}]"]


def test_concurrent_pushes_are_resolved_and_every_node_switches() -> None:
    sc = small(
        _quiet(
            "{at: 0.5s, kind: push, model: 0, writer: ps0}",
            "{at: 0.5s, kind: push, model: 0, writer: ps1}",
            "{at: 1.2s, kind: push, model: 0, writer: node0}",
        )
    )
    out = run_checked(sc, 2)
    assert out.ok, out.findings
    v = out.faults["versions"]
    assert v["pushes"] == 3 and v["acked"] == 3
    assert v["conflicts_resolved"] == 1  # the two pushes at 0.5 s saw the same clock
    assert v["node_switches"] >= 2 and v["switches_pending"] == 0


def test_switch_under_a_running_batch_is_reported() -> None:
    sc = small(_quiet())
    cat = load_catalogue(None)
    cl = build(sc, 1, cat, load_profile(sc.profile), CostModel)
    ctl = attach(cl)
    assert ctl is not None
    cl.env.run(until=0.3)
    node = cl.ctx.nodes[0]
    node.sched.num_decoding[0] = 1  # pretend a batch of model 0 is running
    with pytest.raises(CheckerViolation, match="mixed versions"):
        ctl.versions.switch(0, 0)


def test_node_kill_migrates_its_requests() -> None:
    sc = small(
        [
            *_quiet("{at: 0.05s, kind: kill, target: node0, duration: 0.4s}"),
            "workload.rate=2000",
            "workload.requests=200",
        ]
    )
    out = run_checked(sc, 3)
    assert out.ok, out.findings
    d = out.faults["degradation"]
    assert d["node_kills"] == 1 and d["migrated"] > 0
    assert out.completed == sc.workload.requests and d["degraded_results"] == 0


def test_no_live_node_within_the_deadline_gives_degraded_results() -> None:
    sc = small(
        [
            *_quiet(
                "{at: 0.5s, kind: kill, target: node0, duration: 3s}",
                "{at: 0.5s, kind: kill, target: node1, duration: 3s}",
            ),
            "faults.deadline=0.5s",
            "workload.rate=60",
        ]
    )
    cat = load_catalogue(None)
    cl = build(sc, 4, cat, load_profile(sc.profile), CostModel)
    ctl = attach(cl)
    assert ctl is not None
    cl.run()
    res = ctl.finish(float(cl.env.now), cl.ctx.trace.hexdigest())
    met = cl.ctx.metrics
    d = res["faults"]["degradation"]
    n_deg = int(np.sum(met.status == DEGRADED))
    assert d["degraded_results"] == n_deg > 0
    # every request is final and accounted once: done, shed (arrived with no node) or degraded
    assert met.n_final == sc.workload.requests
    assert int(np.sum(met.status == DONE)) + n_deg + int(np.sum(met.status == 2)) == met.n_final
    # degraded results came no earlier than the deadline after the kill
    ends = met.end[met.status == DEGRADED]
    assert float(ends.min()) >= 0.5 + 0.5 - 1e-9
