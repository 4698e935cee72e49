"""The control plane of a faulty run: metadata service, integrity, versions, checkers, faults.

:func:`attach` (called on a built :class:`sim.cluster.Cluster` when ``faults.enabled``) wires
:class:`sim.metaservice.MetaService` (Raft over the simulated network; its directory replaces
the in-process one), :class:`sim.integrity.Integrity`, :class:`sim.versions.VersionTracker`,
:class:`sim.degrade.Degrader` and :class:`sim.checkers.RunCheckers`, and starts ONE SimPy
process that applies the fault schedule (scenario ``faults.schedule`` plus, when enabled, the
seeded random schedule of :func:`sim.faults.random_schedule`) in time order. Every applied
fault is recorded (time, kind, resolved target, knobs) in :attr:`Control.applied` and in the
event trace; a fault with ``duration`` reverts itself that much later.

Semantics worth knowing (see :mod:`sim.faults` for the kinds):

* ``kill ps<i>`` stops the server and takes its NIC down ("drop": transfers in flight fail and
  the node retries another replica); ``restart`` with ``disk: false`` empties its DRAM and
  SSD and re-replicates its share from the object store (time = *replication recovery*).
* ``kill node<i>`` is :meth:`sim.degrade.Degrader.kill_node` (requests migrate).
* ``kill raft<i>`` / ``raft-leader`` crashes that Raft replica; ``disk: false`` on its
  restart makes it rejoin empty (sim.raft's recovering mode).
* ``pause`` of a compute node stops new work to it and holds its transfers; of a parameter
  server, it is skipped by routing; Raft messages to the host wait until it resumes.
* ``slow`` / ``degrade`` scale the host's links; reverting restores their original bandwidth.

:meth:`Control.finish` (after the cluster ran) scrubs for corrupt copies, runs the final
checks, and returns the ``faults`` summary section plus the combined trace hash (cluster
trace + Raft trace + applied schedule).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Generator
from typing import Any

import simpy

from sim import faultreport
from sim.checkers import CheckerViolation, RunCheckers
from sim.degrade import Degrader
from sim.faults import KINDS, FaultSpec, check_faults, hosts, partition_cuts, random_schedule
from sim.integrity import Integrity
from sim.metaservice import MetaService, RaftDirectory
from sim.raft.buggify import Buggify
from sim.raft.chaos import hunt_leaders
from sim.raft.liveness import LivenessChecker
from sim.versions import VersionTracker

EV_FAULT = 32  # trace event kinds EV_FAULT + KINDS.index(kind)
SETTLE_S = 1.0  # simulated seconds the healed cluster runs before the final checks


class Control:
    """See the module docstring. Build with :func:`attach`."""

    def __init__(self, cluster: Any) -> None:
        self.cl = cluster
        ctx = self.ctx = cluster.ctx
        self.env = ctx.env
        sc = ctx.sc
        cfg = self.cfg = sc.faults
        c = sc.cluster
        self.hosts = hosts(c.param_servers, len(ctx.nodes))
        self.meta = MetaService(ctx, cfg, self.hosts, ctx.rngs.get("raft"))
        self.checkers = RunCheckers(self.env, cfg.stop_on_violation, cfg.linearizability_max_ops)
        self.integrity = Integrity(ctx, cfg.verify)
        self.integrity.report = self.checkers.report
        self.directory = RaftDirectory(ctx.directory, self.meta, self.integrity)
        ctx.directory = self.directory
        self.versions = VersionTracker(ctx, self.meta, self.checkers.report)
        self.degrader = Degrader(cluster, cfg.deadline)
        sched = list(cfg.schedule)
        if cfg.random.enabled:
            sched += random_schedule(
                cfg.random,
                ctx.rngs.get("faults"),
                c.param_servers,
                len(ctx.nodes),
                cfg.raft.replicas,
            )
        self.schedule: list[FaultSpec] = sorted(sched, key=lambda f: f.at)  # stable
        self.rng = ctx.rngs.get("fault-targets")
        self.applied: list[dict[str, Any]] = []
        self._base_bw: dict[str, float] = {}
        self._pause_was_up: dict[str, list[bool]] = {}
        #: when the latest-reverting fault applied so far reverts (scheduled or hunted)
        self._faults_end = 0.0
        self.replication_recovery: list[float] = []
        self.liveness = (
            LivenessChecker(self.env, self.meta.group, self.checkers.report, cfg.liveness)
            if cfg.liveness > 0
            else None
        )
        bcfg = cfg.random.buggify()
        self.buggify = (
            Buggify(bcfg, ctx.rngs.get("buggify")) if cfg.random.enabled and bcfg.active else None
        )

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.buggify is not None:
            for x in self.meta.group.nodes:
                x.buggify = self.buggify
        self.meta.start()
        if self.liveness is not None:
            self.liveness.start()
        for s in self.ctx.servers:
            self.meta.submit(s.name, "put", f"ring/{s.name}", 1)
        if self.cfg.raft.lease_interval > 0:
            for host in (*self.ctx.servers, *self.ctx.nodes):
                self.env.process(self._lease(host))
        self.env.process(self._inject())
        if self.cfg.random.enabled and self.cfg.random.hunt > 0:
            self.env.process(self._hunt())

    def _hunt(self) -> Generator[simpy.Event, Any, None]:
        """Leader hunting (figure 8 provocation, as in :mod:`sim.raft.chaos`): soon after a new
        leader appears, crash it or cut its replication links (clients still reach it, so it
        appends entries no other replica has); see ``faults.random.hunt``."""
        cfg, g, env = self.cfg.random, self.meta.group, self.env
        rng = self.ctx.rngs.get("fault-hunt")

        def strike(lead: int) -> None:
            dur = float(rng.uniform(*cfg.duration))
            if float(rng.random()) < 0.5:
                spec = FaultSpec(
                    at=env.now,
                    kind="partition",
                    shape="replica",
                    target=f"raft{lead}",
                    duration=dur,
                )
            else:
                spec = FaultSpec(at=env.now, kind="kill", target=f"raft{lead}", duration=dur)
            self.apply(spec)

        return hunt_leaders(env, g, rng, cfg.until, cfg.hunt, cfg.hunt_delay, strike)

    def _lease(self, node: Any) -> Generator[simpy.Event, Any, None]:
        """Membership lease renewals of one host, server or compute node, while it is up
        (the metadata service's steady write load); every third tick it reads the next
        host's lease instead (membership lookup), so the linearizability checker sees reads
        and writes of shared keys."""
        k = 0
        names = self.hosts
        peer = names[(names.index(node.name) + 1) % len(names)]
        while True:
            yield self.env.timeout(self.cfg.raft.lease_interval)
            q = self.meta._queues.get(node.name)
            if node.up and not q:
                k += 1
                if k % 3 == 0:
                    self.meta.submit(node.name, "get", f"ring/{peer}")
                else:
                    self.meta.submit(node.name, "put", f"ring/{node.name}", k)

    def _inject(self) -> Generator[simpy.Event, Any, None]:
        for f in self.schedule:
            dt = f.at - self.env.now
            if dt > 0:
                yield self.env.timeout(dt)
            self.apply(f)

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
        """One handler per kind of :data:`sim.faults.KINDS` (a test checks the keys match)."""
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
                # can lose committed entries with any protocol: keep the disk (sim.raft.chaos)
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
            if all(self._pause_was_up.pop(h, [True])) and self.ctx.nodes[idx].proc is not None:
                self.ctx.nodes[idx].up = self.ctx.nodes[idx].proc.is_alive
        self.meta.transport.resume(h)

    def _push(self, f: FaultSpec) -> None:
        m = min(f.model, len(self.ctx.models) - 1)
        self._record(f, f.writer, model=m)
        self.versions.push(m, f.writer)

    # -- end of run ----------------------------------------------------------------------------
    def finish(self, end: float, cluster_hash: str) -> dict[str, Any]:
        """Final checks and the summary section; raises :class:`CheckerViolation` for a
        violation when ``stop_on_violation``. Returns ``{"faults": ..., "trace_hash": ...}``."""
        self.wind_down()
        if self.liveness is not None:
            self.liveness.final(self.checkers.record)
        self.checkers.final(self.meta, self.integrity)
        combined = self.combined_hash(cluster_hash)
        if self.checkers.findings and self.cfg.stop_on_violation:
            raise CheckerViolation(self.checkers.findings[0])
        return {"faults": self.summary(end), "trace_hash": combined}

    def wind_down(self) -> None:
        """Let the fault window pass, heal everything (cuts, pauses, degradation, dead
        servers, nodes and replicas come back with their disks), scrub for corrupt copies,
        then let the cluster settle for ``SETTLE_S`` so replicas catch up and repairs land.

        The fault window ends when the last scheduled fault reverts and, with leader
        hunting on, when the hunt stops (``random.until``: it strikes only before) and its
        last strike reverts -- so no fault lands after the final heal."""
        self._pass_fault_window()
        self._heal_all()
        self.integrity.scrub()
        for x in self.meta.group.nodes:  # BUGGIFY ends with the faults
            x.buggify = None
        settle = SETTLE_S
        if self.liveness is not None:
            b = self.liveness.bound
            self.liveness.healed(self.meta.client_on(self.hosts[0], timeout=0.1, give_up=b))
            settle = max(settle, b + 0.02)
        self.env.run(until=self.env.now + settle)

    def _pass_fault_window(self) -> None:
        """Run until the last scheduled fault (and the leader hunt) is over, then once more
        until every strike applied meanwhile has reverted, events due at that instant
        included (``run(until=t)`` stops before them)."""
        env = self.env
        rnd = self.cfg.random
        last = max((f.at + (f.duration or 0.0) for f in self.schedule), default=0.0)
        if rnd.enabled and rnd.hunt > 0:
            last = max(last, rnd.until)
        for t in (last, 0.0):
            t = max(t, self._faults_end)
            if env.now < t:
                env.run(until=t)
            while env.peek() <= t:
                env.step()

    def _heal_all(self) -> None:
        """Undo every fault still in force, in a fixed order: network cuts, pauses,
        degradation, link bandwidths; then dead servers, compute nodes and Raft replicas come
        back with their disks. Recorded as one ``heal`` of target ``all``."""
        r = self.meta.reach
        r.cuts = set()
        r.cut_replicas = set()
        for h in sorted(r.paused):
            r.paused[h] = 1
            self._resume(h)
        for h in sorted(set(r.extra_latency) | set(r.loss) | set(r.duplicate)):
            self._undegrade(h)
        for name in sorted(self._base_bw):
            for lk in (x for h in self.hosts for x in self._links(h)):
                if lk.name == name:
                    lk.set_bandwidth(self._base_bw[name])
        for s in self.ctx.servers:
            if not s.up:
                s.links["nic"].set_up()
                s.start()
        for i, n in enumerate(self.ctx.nodes):
            if not n.up:
                self.degrader.restart_node(i, True)
        for x in self.meta.group.nodes:
            if not x.alive:
                self.meta.group.restart(x.id, with_disk=True)
        self.applied.append({"at": float(self.env.now), "kind": "heal", "target": "all"})

    def combined_hash(self, cluster_hash: str) -> str:
        """Hash of the cluster's event trace, the Raft trace and the applied schedule."""
        h = hashlib.blake2b(digest_size=16)
        h.update(cluster_hash.encode())
        h.update(self.meta.group.trace_hash().encode())
        h.update(json.dumps(self.applied, sort_keys=True, default=str).encode())
        return h.hexdigest()

    def state(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the control plane and the cluster (``replay --until``)."""
        return faultreport.state(self)

    def summary(self, end: float) -> dict[str, Any]:
        """The ``faults`` section of the run summary (:mod:`sim.faultreport`)."""
        return faultreport.summary(self, end)


def _split(target: str) -> tuple[str, int]:
    for p in ("raft", "node", "ps"):
        if target.startswith(p) and target[len(p) :].isdigit():
            return p, int(target[len(p) :])
    raise ValueError(f"bad fault target {target!r}")


def attach(cluster: Any) -> Control | None:
    """Wire the control plane into a built cluster when ``faults.enabled``; else None."""
    if not cluster.ctx.sc.faults.enabled:
        return None
    check_faults(cluster.ctx.sc)
    ctl = Control(cluster)
    ctl.start()
    setattr(cluster, "control", ctl)  # noqa: B010  (Cluster has no field for it)
    return ctl
