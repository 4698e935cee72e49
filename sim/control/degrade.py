"""Degradation paths when compute nodes fail (R11, R28): migrate, shed, degraded result.

* **Kill** (:meth:`Degrader.kill_node`): the node stops taking work, its process is
  interrupted (cause ``"kill"``), its GPU and host memory are lost, its KV reservations are
  released, and every request it held (queued or running) is *migrated*: placed again on a
  live node by the scheduler's placement policy, starting over (its earlier work is lost).
* **Shed**: with ``degradation.enabled``, a migrated request of a non-protected class whose new
  node is overloaded is shed (counted), exactly as the scheduler does for arrivals.
* **Degraded result**: a request that finds no live node waits; if none appears within
  ``faults.deadline`` seconds it ends with status ``degraded`` -- an explicit outcome,
  counted, never silent.

Invariant after a kill: the node holds no request (``qlen == running == 0``), no KV bytes
and no pinned chunk; each request it held is in exactly one place (another node's queue,
the waiting list, or final).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from sim.control.clusterview import ClusterView
from sim.control.versions import drop_model
from sim.serving.metrics import DEGRADED

RETRY_S = 0.05  # how often waiting requests look for a live node


class Degrader:
    """Node failures and the degradation paths of one cluster; see the module docstring."""

    def __init__(self, cluster: ClusterView, deadline: float) -> None:
        self.cl, self.ctx, self.env = cluster, cluster.ctx, cluster.ctx.env
        self.deadline = deadline
        self.waiting: deque[tuple[int, float]] = deque()
        self._retrying = False
        self.migrated = self.shed = self.degraded = self.kills = 0

    # -- node failures -------------------------------------------------------------------------
    def kill_node(self, i: int) -> None:
        """Crash compute node ``i`` (no effect if it is already down)."""
        node = self.ctx.nodes[i]
        if not node.up:
            return
        self.kills += 1
        node.up = False
        now = self.env.now
        held = node.abort_all()
        ws = node.ws
        for m, mr in enumerate(self.ctx.models):
            for cid in range(mr.n_chunks):
                key = mr.base | cid
                while key in ws.hbm and ws.hbm.pin_count(key) > 0:
                    ws.hbm.unpin(key)
            drop_model(ws, m, now, nvme=False)
        if node.proc is not None and node.proc.is_alive:
            node.proc.interrupt("kill")
        for rid in held:
            self.place(rid)

    def restart_node(self, i: int, disk: bool = True) -> None:
        """Bring node ``i`` back (its NVMe copies survive only ``disk=True``)."""
        node = self.ctx.nodes[i]
        if node.up:
            return
        if not disk:
            for m in range(len(self.ctx.models)):
                drop_model(node.ws, m, self.env.now, hbm=False, host=False)
        node.start()
        self._kick()

    # -- placement of displaced requests -------------------------------------------------------
    def place(self, rid: int) -> bool:
        """Migrate ``rid`` to a live node (or shed it, or park it); True if placed."""
        sch = self.cl.scheduler
        now = self.env.now
        live = sch.live_nodes()
        if not live:
            self.waiting.append((rid, now + self.deadline))
            self._kick()
            return False
        if sch.redispatch(rid, live, now):
            self.migrated += 1
            return True
        self.shed += 1
        return False

    def _kick(self) -> None:
        if self.waiting and not self._retrying:
            self._retrying = True
            self.env.process(self._retry())

    def _retry(self) -> Generator[simpy.Event, Any, None]:
        met = self.ctx.metrics
        while self.waiting:
            yield self.env.timeout(RETRY_S)
            now = self.env.now
            live = self.cl.scheduler.live_nodes()
            keep: deque[tuple[int, float]] = deque()
            while self.waiting:
                rid, due = self.waiting.popleft()
                if live:
                    self.place(rid)
                elif now >= due:
                    self.degraded += 1
                    met.end[rid] = now
                    met.finish(rid, DEGRADED)
                    if self.ctx.on_complete is not None:
                        self.ctx.on_complete(rid)
                else:
                    keep.append((rid, due))
            self.waiting = keep
        self._retrying = False

    def summary(self) -> dict[str, int]:
        return {
            "node_kills": self.kills,
            "migrated": self.migrated,
            "shed_on_failure": self.shed,
            "degraded_results": self.degraded,
            "waiting": len(self.waiting),
        }
