"""The control plane of a faulty run: metadata service, integrity, versions, checkers, faults.

:func:`attach` (called on a built :class:`sim.cluster.Cluster` when ``faults.enabled``) wires
:class:`sim.control.metaservice.MetaService` (Raft over the simulated network; its directory replaces
the in-process one), :class:`sim.control.integrity.Integrity`, :class:`sim.control.versions.VersionTracker`,
:class:`sim.control.degrade.Degrader` and :class:`sim.control.runcheckers.RunCheckers`, and starts ONE SimPy
process that applies the fault schedule (scenario ``faults.schedule`` plus, when enabled, the
seeded random schedule of :func:`sim.control.faults.random_schedule`) in time order. Every applied
fault is recorded (time, kind, resolved target, knobs) in :attr:`Control.applied` and in the
event trace; a fault with ``duration`` reverts itself that much later.

Semantics worth knowing (see :mod:`sim.control.faults` for the kinds):

* ``kill ps<i>`` stops the server and takes its NIC down ("drop": transfers in flight fail and
  the node retries another replica); ``restart`` with ``disk: false`` empties its DRAM and
  SSD and re-replicates its share from the object store (time = *replication recovery*).
* ``kill node<i>`` is :meth:`sim.control.degrade.Degrader.kill_node` (requests migrate).
* ``kill raft<i>`` / ``raft-leader`` crashes that Raft replica; ``disk: false`` on its
  restart makes it rejoin empty (sim.control.raft's recovering mode).
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
from collections.abc import Generator
from typing import Any

import simpy

from sim.control import faultreport
from sim.control.clusterview import ClusterView
from sim.control.degrade import Degrader
from sim.control.faultactions import FaultActions
from sim.control.faults import FaultSpec, check_faults, hosts, random_schedule
from sim.control.integrity import Integrity
from sim.control.metaservice import MetaService, RaftDirectory
from sim.control.raft.buggify import Buggify
from sim.control.raft.liveness import LivenessChecker
from sim.control.raft.nemesis import hunt_leaders
from sim.control.runcheckers import CheckerViolation, RunCheckers
from sim.control.versions import VersionTracker
from sim.simenv import STALL_EVENTS, CountingEnvironment, SimulationStalled

SETTLE_S = 1.0  # simulated seconds the healed cluster runs before the final checks


class Control(FaultActions):
    """See the module docstring. Build with :func:`attach`."""

    def __init__(self, cluster: ClusterView) -> None:
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
        """Leader hunting (figure 8 provocation, as in :mod:`sim.control.raft.nemesis`): soon after a new
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
            if node.up and not self.meta.queued(node.name):
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
        self._run_until(self.env.now + settle)

    def _run_until(self, t: float) -> None:
        """``env.run(until=t)``, guarded against a clock that stops advancing
        (:class:`sim.simenv.SimulationStalled`) when the environment is the simulator's."""
        if isinstance(self.env, CountingEnvironment):
            self.env.run(until=t, stall_events=STALL_EVENTS)
        else:
            self.env.run(until=t)

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
                self._run_until(t)
            for _ in range(STALL_EVENTS):
                if env.peek() > t:
                    break
                env.step()
            else:
                raise SimulationStalled(
                    f"simulated time stopped advancing at t={t:.9g} s: {STALL_EVENTS:,} events "
                    "in a row at that instant"
                )

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
        """The ``faults`` section of the run summary (:mod:`sim.control.faultreport`)."""
        return faultreport.summary(self, end)


def attach(cluster: ClusterView) -> Control | None:
    """Wire the control plane into a built cluster when ``faults.enabled``; else None."""
    if not cluster.ctx.sc.faults.enabled:
        return None
    check_faults(cluster.ctx.sc)
    ctl = Control(cluster)
    ctl.start()
    setattr(cluster, "control", ctl)  # noqa: B010  (Cluster has no field for it)
    return ctl
