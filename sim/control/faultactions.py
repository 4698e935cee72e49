"""What each fault kind does to the cluster: one handler per kind and its revert.

:class:`FaultActions` is the part of :class:`sim.control.faultinject.Control` that applies faults
(:meth:`FaultActions.apply`, dispatched through :meth:`FaultActions._handlers`, one entry per
kind of :data:`sim.control.faults.KINDS`); the semantics of each kind are in
:mod:`sim.control.faultinject`'s docstring. Every applied fault is recorded (time, kind, resolved
target, knobs, the Raft leader and term then) in ``applied`` and in the event trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from sim.control.degrade import Degrader
from sim.control.faults import KINDS, FaultSpec, partition_cuts
from sim.control.integrity import Integrity
from sim.control.metaservice import MetaService, RaftDirectory
from sim.control.versions import VersionTracker

if TYPE_CHECKING:
    from sim.serving.context import SimContext

EV_FAULT = 32  # trace event kinds EV_FAULT + KINDS.index(kind)


class FaultActions:
    """The fault handlers of :class:`sim.control.faultinject.Control` (which sets these fields)."""

    env: simpy.Environment
    ctx: SimContext
    meta: MetaService
    directory: RaftDirectory
    integrity: Integrity
    versions: VersionTracker
    degrader: Degrader
    hosts: list[str]
    rng: np.random.Generator
    applied: list[dict[str, Any]]
    _base_bw: dict[str, float]
    _pause_was_up: dict[str, list[bool]]
    _faults_end: float
    replication_recovery: list[float]

    # -- applying ------------------------------------------------------------------------------
    def _record(self, f: FaultSpec, target: str | None, **extra: Any) -> dict[str, Any]:
        rec = {"at": float(self.env.now), "kind": f.kind, "target": target, **extra}
        if f.duration is not None:
            rec["duration"] = f.duration
        lead = self.meta.group.leader()
        rec["leader"] = lead
        rec["term"] = -1 if lead is None else self.meta.group.nodes[lead].current_term
        self.applied.append(rec)
        tid = self.hosts.index(target) if target in self.hosts else -1
        if target is not None and target.startswith("raft") and target[4:].isdigit():
            tid = 1000 + int(target[4:])
        self.ctx.trace.rec(self.env.now, EV_FAULT + KINDS.index(f.kind), tid, len(self.applied))
        return rec

    def _later(self, delay: float, fn: Any) -> None:
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _e: fn())

    def apply(self, f: FaultSpec) -> None:
        """Apply one fault now (see the module docstring)."""
        if f.duration is not None:
            self._faults_end = max(self._faults_end, self.env.now + f.duration)
        self._handlers()[f.kind](f)

    def _handlers(self) -> dict[str, Callable[[FaultSpec], None]]:
        """One handler per kind of :data:`sim.control.faults.KINDS` (a test checks the keys match)."""
        return {
            "kill": self._kill,
            "restart": self._restart,
            "partition": self._partition,
            "heal": self._heal,
            "degrade": self._degrade,
            "slow": self._slow,
            "corrupt": self._corrupt,
            "pause": self._pause,
            "push": self._push,
        }

    def _resolve(self, target: str | None) -> str | None:
        if target == "raft-leader":
            lead = self.meta.group.leader()
            return None if lead is None else f"raft{lead}"
        return target

    def _kill(self, f: FaultSpec) -> None:
        target = self._resolve(f.target)
        rec = self._record(f, target, disk=f.disk)
        if target is None:
            rec["skipped"] = "no leader"
            return
        if not self._down(target):
            rec["skipped"] = "already down"
            return
        if f.duration is not None:
            self._later(
                f.duration,
                lambda: self._restart(FaultSpec(at=0, kind="restart", target=target, disk=f.disk)),
            )

    def _down(self, target: str) -> bool:
        kind, idx = _split(target)
        if kind == "ps":
            s = self.ctx.servers[idx]
            if not s.up:
                return False
            s.stop()
            s.links["nic"].set_down("drop")
        elif kind == "node":
            if not self.ctx.nodes[idx].up:
                return False
            self.degrader.kill_node(idx)
        else:
            x = self.meta.group.nodes[idx]
            if not x.alive:
                return False
            self.meta.group.crash(idx)
        return True

    def _restart(self, f: FaultSpec) -> None:
        target = self._resolve(f.target)
        rec = self._record(f, target, disk=f.disk)
        if target is None:
            rec["skipped"] = "no target"
            return
        kind, idx = _split(target)
        if kind == "ps":
            s = self.ctx.servers[idx]
            if s.up:
                rec["skipped"] = "already up"
                return
            if not f.disk:
                self._wipe_server(idx)
            s.links["nic"].set_up()
            s.start()
        elif kind == "node":
            self.degrader.restart_node(idx, f.disk)
        else:
            x = self.meta.group.nodes[idx]
            if x.alive:
                rec["skipped"] = "already up"
                return
            disk = f.disk
            others = [y for y in self.meta.group.nodes if y.id != idx]
            if not disk and not all(y.alive and not y.recovering for y in others):
                # losing a second replica's data while another one is down or rebuilding
                # can lose committed entries with any protocol: keep the disk (sim.control.raft.nemesis)
                disk = True
                rec["disk"] = True
                rec["note"] = "disk kept: another replica is down or recovering"
            self.meta.group.restart(idx, with_disk=disk)

    def _wipe_server(self, idx: int) -> None:
        """A server restarted without its disk: empty, then re-replicate its share."""
        s, now = self.ctx.servers[idx], self.env.now
        for cache in (s.dram, s.ssd):
            for key in list(cache):
                cache.remove(key, now)
        total = 0
        items: list[tuple[int, int]] = []
        for m, mr in enumerate(self.ctx.models):
            for cid in range(mr.n_chunks):
                if idx in self.directory.replicas(m, cid):
                    items.append((mr.base | cid, int(mr.chunk_size[cid])))
                    total += int(mr.chunk_size[cid])
        if not items:
            return
        ev = self.ctx.network.transfer([s.links["object"], s.links["ssd"]], total, 3)
        ev.callbacks.append(lambda e: self._rereplicated(e, s, items, now))

    def _rereplicated(self, ev: Any, s: Any, items: list[tuple[int, int]], t0: float) -> None:
        if not ev.ok:
            ev.defused = True
            return
        now = self.env.now
        for key, size in items:
            if key not in s.ssd and s.ssd.used + size <= s.ssd.capacity:
                s.ssd.admit(key, size, now)
        self.replication_recovery.append(now - t0)

    def _partition(self, f: FaultSpec) -> None:
        if f.shape == "replica":
            target = self._resolve(f.target)
            r = self.meta.reach
            r.cut_replicas = set() if target is None else {_split(target)[1]}
            self._record(f, target, shape=f.shape)
            if f.duration is not None:
                self._later(f.duration, lambda: self._heal(FaultSpec(at=0, kind="heal")))
            return
        target = self._host_of(f.target) if f.target else None
        cuts = partition_cuts(f.shape, self.hosts, target, self.meta.replica_host, f.one_way)
        self.meta.reach.cuts = set(cuts)
        self._record(f, target, shape=f.shape, one_way=f.one_way, cuts=len(cuts))
        if f.duration is not None:
            self._later(f.duration, lambda: self._heal(FaultSpec(at=0, kind="heal")))

    def _heal(self, f: FaultSpec) -> None:
        self.meta.reach.cuts = set()
        self.meta.reach.cut_replicas = set()
        self._record(f, None)

    def _links(self, host: str) -> list[Any]:
        kind, idx = _split(host)
        if kind == "ps":
            lk = self.ctx.servers[idx].links
            return [lk["nic"], lk["ssd"]]
        if kind == "node":
            lk = self.ctx.nodes[idx].ws.links
            return [lk["nic"], lk["pcie"], lk["nvme"]]
        return []

    def _scale(self, host: str, factor: float) -> None:
        for lk in self._links(host):
            base = self._base_bw.setdefault(lk.name, lk.bandwidth)
            lk.set_bandwidth(base * factor)

    def _unscale(self, host: str) -> None:
        for lk in self._links(host):
            if lk.name in self._base_bw:
                lk.set_bandwidth(self._base_bw[lk.name])

    def _host_of(self, target: str | None) -> str:
        t = self._resolve(target) or ""
        if t.startswith("raft"):
            return self.meta.replica_host[int(t[4:])]
        return t

    def _degrade(self, f: FaultSpec) -> None:
        h = self._host_of(f.target)
        r = self.meta.reach
        r.extra_latency[h], r.loss[h], r.duplicate[h] = f.latency, f.loss, f.duplicate
        if f.bandwidth < 1.0:
            self._scale(h, f.bandwidth)
        self._record(f, h, latency=f.latency, loss=f.loss, duplicate=f.duplicate)
        if f.duration is not None:
            self._later(f.duration, lambda: self._undegrade(h))

    def _undegrade(self, h: str) -> None:
        r = self.meta.reach
        for d in (r.extra_latency, r.loss, r.duplicate):
            d.pop(h, None)
        self._unscale(h)

    def _slow(self, f: FaultSpec) -> None:
        h = self._host_of(f.target)
        self._scale(h, f.factor)
        self._record(f, h, factor=f.factor)
        if f.duration is not None:
            self._later(f.duration, lambda: self._unscale(h))

    def _corrupt(self, f: FaultSpec) -> None:
        _, ps = _split(f.target or "ps0")
        key: int | None = None
        if f.chunk is not None and f.model < len(self.ctx.models):
            mr = self.ctx.models[f.model]
            key = mr.base | min(f.chunk, mr.n_chunks - 1)
        else:
            held = [
                mr.base | cid
                for m, mr in enumerate(self.ctx.models)
                for cid in range(mr.n_chunks)
                if ps in self.directory.replicas(m, cid)
                and (ps, mr.base | cid) not in self.integrity.bad
                and not self.integrity.under_repair(ps, mr.base | cid)
            ]
            if held:
                key = held[int(self.rng.integers(len(held)))]
        rec = self._record(f, f"ps{ps}", bits=f.bits, chunk=None if key is None else hex(key))
        if key is None:
            rec["skipped"] = "no chunk on that server"
            return
        if not self.integrity.corrupt(ps, key, f.bits, self.rng):
            rec["skipped"] = "copy under repair"

    def _pause(self, f: FaultSpec) -> None:
        h = self._host_of(f.target)
        r = self.meta.reach
        r.paused[h] = r.paused.get(h, 0) + 1
        kind, idx = _split(h)
        if kind == "node":
            n = self.ctx.nodes[idx]
            self._pause_was_up.setdefault(h, []).append(n.up)
            n.up = False
            for lk in self._links(h):
                lk.set_down("hold")
        self._record(f, h)
        if f.duration is not None:
            self._later(f.duration, lambda: self._resume(h))

    def _resume(self, h: str) -> None:
        r = self.meta.reach
        if h not in r.paused:  # already resumed by the final heal
            return
        r.paused[h] -= 1
        if r.paused[h] > 0:
            return
        del r.paused[h]
        kind, idx = _split(h)
        if kind == "node":
            for lk in self._links(h):
                lk.set_up()
            proc = self.ctx.nodes[idx].proc
            if all(self._pause_was_up.pop(h, [True])) and proc is not None:
                self.ctx.nodes[idx].up = proc.is_alive
        self.meta.transport.resume(h)

    def _push(self, f: FaultSpec) -> None:
        m = min(f.model, len(self.ctx.models) - 1)
        self._record(f, f.writer, model=m)
        self.versions.push(m, f.writer)


def _split(target: str) -> tuple[str, int]:
    for p in ("raft", "node", "ps"):
        if target.startswith(p) and target[len(p) :].isdigit():
            return p, int(target[len(p) :])
    raise ValueError(f"bad fault target {target!r}")
