"""The end-of-run checkers find what they should (they can fail)."""

from __future__ import annotations

import pytest

from sim.cluster import build
from sim.control.faultinject import attach
from sim.control.raft.messages import Command
from sim.control.runcheckers import CheckerViolation
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.models import load_catalogue

from .conftest import small


def _ran() -> tuple:
    sc = small(["faults.random.enabled=false"])
    cl = build(sc, 1, load_catalogue(None), load_profile(sc.profile), CostModel)
    ctl = attach(cl)
    assert ctl is not None
    end = cl.run()
    return cl, ctl, end


def test_clean_run_has_reads_and_writes_and_passes() -> None:
    cl, ctl, end = _ran()
    res = ctl.finish(end, cl.ctx.trace.hexdigest())
    hist = ctl.meta.history()
    assert {h.op for h in hist} == {"put", "get"}
    assert res["faults"]["linearizability_checked"] and not res["faults"]["violations"]


def test_a_stale_read_in_the_history_is_not_linearizable() -> None:
    cl, ctl, end = _ran()
    reads = [h for h in ctl.meta.history() if h.op == "get" and h.response is not None]
    assert reads
    reads[-1].result = -12345  # a value no one ever wrote
    with pytest.raises(CheckerViolation, match="Linearizability"):
        ctl.finish(end, cl.ctx.trace.hexdigest())


def test_an_acknowledged_write_missing_from_the_final_log_is_reported() -> None:
    cl, ctl, end = _ran()
    # an acknowledgement the replicas never logged (as if a committed entry had been lost)
    ctl.meta.checker.acked[10**6] = Command("put", "ring/ghost", 1, 1999, 1)
    with pytest.raises(CheckerViolation, match="Acknowledged write lost"):
        ctl.finish(end, cl.ctx.trace.hexdigest())
