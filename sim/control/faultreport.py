"""Reporting of a faulty run: the ``faults`` summary section and the ``--until`` state dump.

Functions of a :class:`sim.control.faultinject.Control` (``self``). Availability = fraction of all
requests answered (status done) within their class SLO; requests lost = shed or never
answered; downtime per fault = how long the killed / cut / paused component stayed so (its
``duration``; ``None`` if it never came back before the end); time to elect = from a fault
that hit the leader (its replica or host) to the first leader of a higher term; replication
recovery = time a server restarted without its disk took to re-read its share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sim.serving.metrics import DONE, SHED

if TYPE_CHECKING:
    from sim.control.faultinject import Control


def state(self: Control) -> dict[str, Any]:
    """A JSON-ready snapshot of the control plane and the cluster (``replay --until``)."""
    g = self.meta.group
    ctx = self.ctx
    return {
        "time": float(self.env.now),
        "leader": g.leader(),
        "raft": [
            {
                "id": x.id,
                "host": self.meta.replica_host[x.id],
                "alive": x.alive,
                "role": x.role.value,
                "term": x.current_term,
                "commit_index": x.commit_index,
                "last_index": x.log.last_index,
            }
            for x in g.nodes
        ],
        "servers": [{"name": s.name, "up": s.up, "served": s.served} for s in ctx.servers],
        "nodes": [
            {
                "name": n.name,
                "up": n.up,
                "queued": n.qlen,
                "running": n.running,
                "hbm_weight_bytes": n.ws.hbm.used,
            }
            for n in ctx.nodes
        ],
        "cuts": sorted(self.meta.reach.cuts),
        "paused": sorted(self.meta.reach.paused),
        "requests": {
            "arrived": ctx.metrics.n_arrived,
            "final": ctx.metrics.n_final,
        },
        "integrity": self.integrity.summary(),
        "applied": self.applied,
        "findings": [str(x) for x in self.checkers.findings],
    }


def summary(self: Control, end: float) -> dict[str, Any]:
    met, wl, sc = self.ctx.metrics, self.cl.wl, self.ctx.sc
    slo = np.array([c.slo for c in sc.workload.classes])[wl.cls]
    lat = met.end - met.arrival
    done = met.status == DONE
    good = int(np.sum(done & (lat <= slo)))
    n = max(wl.n, 1)
    lost = int(np.sum(met.status == SHED) + np.sum(met.status == 0))
    elect = _elections(self)
    downtime = []
    for i, a in enumerate(self.applied):
        if a["kind"] in ("kill", "partition", "pause") and "skipped" not in a:
            d = a.get("duration")
            downtime.append({"fault": i, "kind": a["kind"], "target": a["target"], "downtime_s": d})
    rec = self.replication_recovery
    return {
        "applied": len(self.applied),
        "schedule": self.applied,
        "violations": [str(x) for x in self.checkers.findings],
        "linearizability_checked": self.checkers.linearizability_checked,
        "availability": good / n,
        "requests_lost": lost,
        "downtime": downtime,
        "initial_election_s": elect[0],
        "time_to_elect_s": elect[1],
        "replication_recovery_s": rec,
        "recovery_time_s": max(rec) if rec else None,
        "integrity": self.integrity.summary(),
        "versions": self.versions.summary(),
        "degradation": {
            **self.degrader.summary(),
            "replica_retries": self.directory.retries,
            "object_store_fallbacks": self.directory.unavailable,
        },
        "raft": {
            "leaders": len(self.meta.checker.leaders),
            "messages": self.meta.transport.sent,
            "dropped": self.meta.transport.dropped,
            "acked_writes": len(self.meta.checker.acked),
            "unknown_outcomes": self.meta.unknown,
        },
    }


def _elections(self: Control) -> tuple[float | None, list[float]]:
    """(time to the first leader, times from each leader loss to the next leader)."""
    log = self.meta.leader_log
    first = next((t for t, lead, _ in log if lead is not None), None)
    out: list[float] = []
    for a in self.applied:
        if a.get("leader") is None or "skipped" in a:
            continue
        host = self.meta.replica_host[a["leader"]]
        if a["target"] not in (f"raft{a['leader']}", host):
            continue
        t0 = a["at"]
        nxt = next(
            (t for t, lead, term in log if t > t0 and lead is not None and term > a["term"]),
            None,
        )
        if nxt is not None:
            out.append(nxt - t0)
    return first, out
