"""Model versions in the cluster (R4): pushes through Raft with vector clocks; pinned batches.

A *push* (model update / fine-tune) of model ``m`` by writer ``w`` writes the metadata key
``chunk/model<m>`` (one record per model: a push replaces every chunk of the model, so the
per-chunk versions move together) with a :class:`sim.control.vclock.Version` whose clock is the
writer's last *seen* clock (its own acknowledged pushes merged with the committed version it
learnt through the watch) ticked for ``w``. Two pushes from different writers that saw the
same clock (the second sent before the first was committed) are concurrent: the state machine detects it and keeps the winner of
:func:`sim.control.vclock.resolve`'s documented rule (higher Lamport sum, then writer name); the loser
is recorded as a conflict (counted here when its write is acknowledged with the winner).

Version pinning: each compute node runs model ``m`` at ``node_epoch[node][m]``. A committed
push raises the target epoch; a node adopts it only when its batch of ``m`` is empty AND no
transfer of ``m``'s chunks is in flight to it, and then drops every cached chunk of ``m``
(HBM, host, NVMe) so that later fetches bring the new bytes. Hence every request runs on one
version from admission to completion: it is admitted into a batch that started on the
current epoch, and the epoch cannot change before that batch drains. Parameter servers drop
their DRAM/SSD copies of ``m`` on commit (the new version is read from the object store).
:meth:`VersionTracker.switch` re-checks the precondition and reports a ``mixed versions``
violation to the checkers if it ever fails.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from sim.control.raft.statemachine import Change
from sim.control.vclock import VectorClock, Version, merge

if TYPE_CHECKING:
    from sim.control.metaservice import MetaService
    from sim.control.runcheckers import Report
    from sim.serving.context import SimContext

POLL_S = 0.02  # how often a node with a pending version switch re-checks its batch


class VersionTracker:
    """Versions of every model across the cluster; see the module docstring."""

    def __init__(self, ctx: SimContext, meta: MetaService, report: Report) -> None:
        self.ctx, self.meta, self.report = ctx, meta, report
        nm = len(ctx.models)
        self.target = [0] * nm
        self.committed: list[Version | None] = [None] * nm
        self.node_epoch = [[0] * nm for _ in ctx.nodes]
        self._polling = [False] * len(ctx.nodes)
        self.pushes = self.acked = self.conflicts = self.switches = 0
        self.seen: dict[str, VectorClock] = {}
        meta.watch("chunk/model", self._on_commit)

    def push(self, m: int, writer: str) -> None:
        """Write a new version of model ``m`` from ``writer`` (see the module docstring)."""
        seen = self.seen.get(writer, VectorClock.empty())
        cur = self.committed[m]
        if cur is not None:  # the writer reads the committed version first (watch)
            seen = merge(seen, cur.clock)
        clock = seen.tick(writer)
        v = Version(clock, writer, (m, clock.as_dict()))
        self.pushes += 1

        def done(res: Any, v: Version = v) -> None:
            if isinstance(res, Version):
                self.acked += 1
                self.seen[writer] = res.clock
                if res.writer != v.writer or res.clock != v.clock:
                    self.conflicts += 1  # concurrent (or stale) push lost to another one

        self.meta.submit(writer, "chunk", f"chunk/model{m}", v, done)

    def _on_commit(self, ch: Change) -> None:
        m = int(ch.key[len("chunk/model") :])
        self.committed[m] = ch.new
        self.target[m] += 1
        for ps in self.ctx.servers:  # stale copies go; the object store has the new version
            base = self.ctx.models[m].base
            for cid in range(self.ctx.models[m].n_chunks):
                ps.dram.remove(base | cid, self.ctx.env.now)
                ps.ssd.remove(base | cid, self.ctx.env.now)
        for i in range(len(self.ctx.nodes)):
            if not self._polling[i]:
                self._polling[i] = True
                self.ctx.env.process(self._adopt(i))

    def _adopt(self, i: int) -> Generator[simpy.Event, Any, None]:
        node = self.ctx.nodes[i]
        while True:
            pending = [m for m, t in enumerate(self.target) if self.node_epoch[i][m] != t]
            for m in pending:
                if node.sched.num_decoding[m] == 0 and not any(k[0] == m for k in node.ws.inflight):
                    self.switch(i, m)
            if all(self.node_epoch[i][m] == t for m, t in enumerate(self.target)):
                self._polling[i] = False
                return
            yield self.ctx.env.timeout(POLL_S)

    def switch(self, i: int, m: int) -> None:
        """Node ``i`` adopts the target epoch of model ``m``, dropping its cached chunks."""
        node = self.ctx.nodes[i]
        if node.sched.num_decoding[m] != 0 or any(k[0] == m for k in node.ws.inflight):
            self.report(
                "mixed versions",
                f"node{i} switched model {m} with {node.sched.num_decoding[m]} requests running",
            )
        drop_model(node.ws, m, self.ctx.env.now)
        self.node_epoch[i][m] = self.target[m]
        self.switches += 1

    def summary(self) -> dict[str, Any]:
        return {
            "pushes": self.pushes,
            "acked": self.acked,
            "conflicts_resolved": self.conflicts,
            "node_switches": self.switches,
            "switches_pending": sum(
                1 for row in self.node_epoch for m, e in enumerate(row) if e != self.target[m]
            ),
        }


def drop_model(
    ws: Any, m: int, now: float, hbm: bool = True, host: bool = True, nvme: bool = True
) -> None:
    """Remove every cached (unpinned) chunk of model ``m`` from the chosen tiers of a
    :class:`sim.serving.paramstore.WeightStore`, keeping its residency counters exact (``remove`` does
    not call the eviction hook, so the counters are updated here)."""
    mr = ws.ctx.models[m]
    tiers = [t for t, on in ((ws.host, host), (ws.nvme, nvme)) if on and t is not None]
    for cid in range(mr.n_chunks):
        key = mr.base | cid
        if hbm and key in ws.hbm and ws.hbm.pin_count(key) == 0:
            layer = int(ws.chunk_layer[m][cid])
            c = ws.counts[m]
            if c[layer] == mr.layer_chunks[layer]:
                ws.full[m] -= 1
            c[layer] -= 1
            ws.resident_bytes[m] -= int(mr.chunk_size[cid])
            ws.hbm.remove(key, now)
        for tier in tiers:
            tier.remove(key, now)
    if hbm:
        ws.touches.forget(m)
