"""The autoscaler's control loop in the simulated cluster (one long-lived SimPy process).

Every ``interval`` it reads what a real autoscaler can read (:meth:`Autoscaler.observe`:
replicas by state, queued and running requests, KV in use, the arrival rate over the last
interval, recent P90 TTFT and mean TPOT), asks its policy
(:data:`sim.control.autoscale.policies.POLICIES`) for a replica count, and lets the
:class:`sim.control.autoscale.controller.Controller` turn the ask into an action:

* **scale-out**: the pool's :class:`sim.serving.replicafactory.ReplicaFactory` makes each new
  replica with empty tiers, out of service (``up`` False), and a
  :class:`sim.serving.coldstart.ColdStart` takes the group through provisioning and loading;
  a replica enters service (its process starts, placement sees it) when the cold start says
  ``serving``.
* **scale-in**: the youngest serving replicas stop taking requests (``up`` False) and
  *drain*: they keep running until every request they hold has finished, then their
  process ends and their GPUs are released. So no request is lost to scaling: a request
  placed on a replica is finished there (count in = count out; tested).

Replica states: ``provisioning`` -> ``loading`` -> ``serving`` -> ``draining`` ->
``released``; the replicas the cluster starts with are ``serving`` at 0. Every decision is
recorded (the event trace: ``EV_SCALE`` with the signed count and the size after it,
``EV_REPLICA_STATE`` per state change; and :attr:`Autoscaler.events`), and every tick adds
a row to :attr:`Autoscaler.timeline`.

The loop's cost per tick is one pass over the replicas held (O(replicas)) plus the recent
requests of the signal window; it adds no per-request work.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import simpy

from sim.control.autoscale.controller import Controller
from sim.control.autoscale.policies import POLICIES, Observation
from sim.control.autoscale.section import AutoscaleCfg, resolved_source
from sim.serving.coldstart import ColdStart
from sim.serving.metrics import EV_REPLICA_STATE, EV_SCALE

if TYPE_CHECKING:
    from sim.serving.context import SimContext
    from sim.serving.placement import Scheduler
    from sim.serving.replica import ComputeNode
    from sim.serving.replicafactory import ReplicaFactory
    from sim.serving.workload import Workload

STATES: tuple[str, ...] = ("provisioning", "loading", "serving", "draining", "released")
#: how often a draining replica is checked for its last request, as a share of ``interval``
DRAIN_POLL = 0.05
#: timeline columns, in row order
TIMELINE = (
    "t",
    "provisioning",
    "loading",
    "serving",
    "draining",
    "gpus",
    "queued",
    "running",
    "arrival_rate",
    "desired",
    "utilisation",
    "ttft_p90",
)


class ScalableCluster(Protocol):
    """A built cluster as the autoscaler sees it (:class:`sim.cluster.Cluster` is one)."""

    ctx: SimContext
    scheduler: Scheduler
    wl: Workload
    factories: dict[str, ReplicaFactory]


class Autoscaler:
    """See the module docstring; :func:`sim.control.autoscale.attach` builds and starts it."""

    def __init__(self, cluster: ScalableCluster, profile_cold: Any) -> None:
        """``profile_cold``: the profile's :class:`sim.serving.costmodel.ColdStartProfile`."""
        ctx = cluster.ctx
        sc = ctx.sc
        self.cluster = cluster
        self.ctx, self.env = ctx, ctx.env
        self.cfg: AutoscaleCfg = sc.autoscale
        cs = self.cfg.cold_start
        self.provision_s = cs.provision if cs.provision is not None else profile_cold.provision_s
        self.warmup_s = cs.warmup if cs.warmup is not None else profile_cold.warmup_s
        self.source = resolved_source(self.cfg, sc.mode)
        slos = [c.ttft_slo for c in sc.workload.classes if c.ttft_slo]
        horizon = self.cfg.horizon
        if horizon is None:
            horizon = self.provision_s + self.warmup_s + 10.0
        self.policy = POLICIES[self.cfg.policy](self.cfg, min(slos) if slos else None, horizon)
        self.controller = Controller(self.cfg)
        self.factory = cluster.factories["both"]
        self.gpus_per_replica = sc.cluster.gpus_per_replica
        shares = [d.share for d in sc.deployments]
        self.order = sorted(range(len(shares)), key=lambda j: (-shares[j], j))
        #: per replica index: its state, and when it got and gave back its GPUs
        self.state: dict[int, str] = {n.idx: "serving" for n in ctx.nodes}
        self.acquired: dict[int, float] = {n.idx: 0.0 for n in ctx.nodes}
        self.released: dict[int, float] = {}
        #: scale decisions: ``{t, action: out|in, replicas, nodes, size_after, desired}``
        self.events: list[dict[str, Any]] = []
        self.timeline: list[tuple[float, ...]] = []
        self.cold_starts: list[ColdStart] = []
        self._arrived_at_tick = 0

    def start(self) -> simpy.Process:
        """Start the control loop (first decision one ``interval`` in)."""
        return self.env.process(self._loop())

    def replica_seconds(self, t0: float, t1: float) -> float:
        """Replica-seconds held (from the decision that added a replica, or 0, to its
        release) within ``[t0, t1]``."""
        total = 0.0
        for i, a in self.acquired.items():
            b = self.released.get(i, t1)
            total += max(min(b, t1) - max(a, t0), 0.0)
        return total

    # -- signals ------------------------------------------------------------------------------
    def count(self, state: str) -> int:
        """Replicas in ``state``."""
        return sum(1 for s in self.state.values() if s == state)

    def serving_nodes(self) -> list[ComputeNode]:
        """The replicas in service, in index order."""
        nodes = self.ctx.nodes
        return [nodes[i] for i, s in sorted(self.state.items()) if s == "serving"]

    def observe(self) -> Observation:
        """The signals at ``now`` (see the module docstring)."""
        ctx, now, cfg = self.ctx, float(self.env.now), self.cfg
        met = ctx.metrics
        queued = running = 0
        kv_used = kv_cap = 0
        for i, s in self.state.items():
            if s in ("serving", "draining"):
                n = ctx.nodes[i]
                queued += n.qlen
                running += n.running
                if s == "serving":
                    kv_used += n.kv.reserved
                    kv_cap += n.kv.capacity
        rate = (met.n_arrived - self._arrived_at_tick) / cfg.interval
        self._arrived_at_tick = met.n_arrived
        ttft, tpot = self._recent(now)
        return Observation(
            t=now,
            serving=self.count("serving"),
            starting=self.count("provisioning") + self.count("loading"),
            draining=self.count("draining"),
            queued=queued,
            running=running,
            max_num_seqs=ctx.sc.cluster.replica.max_num_seqs,
            kv_use=kv_used / kv_cap if kv_cap else 0.0,
            arrival_rate=rate,
            ttft_p90=ttft,
            tpot_mean=tpot,
        )

    def _recent(self, now: float) -> tuple[float | None, float | None]:
        """P90 TTFT of the requests that arrived in the last ``signal_window`` seconds (a
        request still waiting counts its wait so far, as a real one's queue age) and the
        mean TPOT of those finished; None without such requests (closed loops: None)."""
        wl, met = self.cluster.wl, self.ctx.metrics
        if wl.closed_loop or wl.n == 0:
            return None, None
        lo = int(np.searchsorted(wl.arrival, now - self.cfg.signal_window, side="left"))
        hi = int(np.searchsorted(wl.arrival, now, side="right"))
        arr = met.arrival[lo:hi]
        seen = ~np.isnan(arr)
        if not seen.any():
            return None, None
        first = met.first[lo:hi][seen]
        a = arr[seen]
        ttft = np.where(np.isnan(first), now - a, first - a)
        end = met.end[lo:hi][seen]
        out = wl.out[lo:hi][seen]
        done = ~np.isnan(end) & ~np.isnan(first) & (out > 1)
        tpot = float(np.mean((end[done] - first[done]) / (out[done] - 1))) if done.any() else None
        return float(np.percentile(ttft, 90)), tpot

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env, cfg = self.env, self.cfg
        while True:
            yield env.timeout(cfg.interval)
            obs = self.observe()
            desired = self.policy.desired(obs)
            act = self.controller.decide(obs.t, desired, obs.current, obs.starting, obs.draining)
            if act > 0:
                self.scale_out(act, desired)
            elif act < 0:
                self.scale_in(-act, desired)
            self._row(obs, desired)

    def _row(self, obs: Observation, desired: int) -> None:
        held = sum(1 for s in self.state.values() if s != "released")
        self.timeline.append(
            (
                obs.t,
                self.count("provisioning"),
                self.count("loading"),
                self.count("serving"),
                self.count("draining"),
                held * self.gpus_per_replica,
                obs.queued,
                obs.running,
                obs.arrival_rate,
                desired,
                obs.utilisation,
                obs.ttft_p90 if obs.ttft_p90 is not None else float("nan"),
            )
        )

    def _set(self, node: ComputeNode, state: str) -> None:
        self.state[node.idx] = state
        self.ctx.trace.rec(self.env.now, EV_REPLICA_STATE, node.idx, STATES.index(state))

    def _record(self, action: str, nodes: list[int], desired: int) -> None:
        size = self.count("serving") + self.count("provisioning") + self.count("loading")
        now, k = float(self.env.now), len(nodes)
        self.events.append(
            {
                "t": now,
                "action": action,
                "replicas": k,
                "nodes": nodes,
                "size_after": size,
                "desired": desired,
            }
        )
        self.ctx.trace.rec(now, EV_SCALE, k if action == "out" else -k, size)

    # -- scale-out ----------------------------------------------------------------------------
    def scale_out(self, k: int, desired: int = 0) -> ColdStart:
        """Add ``k`` replicas now: made by the pool's factory, out of service, and taken
        through one :class:`sim.serving.coldstart.ColdStart`. Returns it."""
        ctx, now = self.ctx, float(self.env.now)
        new: list[ComputeNode] = []
        for _ in range(k):
            node = self.factory.make(len(ctx.nodes), preload=False)
            node.up = False  # out of service until the cold start says serving
            ctx.nodes.append(node)
            self.cluster.scheduler.add_node(node)
            self.acquired[node.idx] = now
            self._set(node, "provisioning")
            new.append(node)
        cs = ColdStart(
            new,
            self.source,
            self.provision_s,
            self.warmup_s,
            self.order,
            self._on_cold_state,
            self.serving_nodes,
            self.factory.rdma_latency(),
        )
        self.cold_starts.append(cs)
        self._record("out", [n.idx for n in new], desired)
        cs.start()
        return cs

    def _on_cold_state(self, node: ComputeNode, state: str) -> None:
        self._set(node, state)
        if state == "serving":
            node.start()  # its process runs; placement's live list now includes it

    # -- scale-in -----------------------------------------------------------------------------
    def scale_in(self, k: int, desired: int = 0) -> list[int]:
        """Drain the ``k`` youngest serving replicas (never the last one); returns their
        indices."""
        serving = self.serving_nodes()
        k = min(k, len(serving) - 1)
        picked = sorted(serving, key=lambda n: -n.idx)[: max(k, 0)]
        for node in picked:
            self._set(node, "draining")
            node.stop()  # placement stops sending it requests
            self.env.process(self._drain(node))
        if picked:
            self._record("in", [n.idx for n in picked], desired)
        return [n.idx for n in picked]

    def _drain(self, node: ComputeNode) -> Generator[simpy.Event, Any, None]:
        """Wait until ``node`` holds no request, then end its process and release it."""
        poll = self.cfg.interval * DRAIN_POLL
        while node.load > 0:
            yield self.env.timeout(poll)
        if node.proc is not None and node.proc.is_alive:
            node.proc.interrupt("kill")
        self.released[node.idx] = float(self.env.now)
        self._set(node, "released")
