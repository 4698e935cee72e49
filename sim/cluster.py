"""Assembly of one simulated cluster from a validated scenario, and its run loop.

:func:`build` checks the scenario (:func:`sim.feasible.check_feasible`, re-exported here) and
wires the components: workload -> scheduler -> compute nodes (weights in tiered caches, KV
accounting) <-> network <-> parameter servers (directory on a consistent-hash ring) <->
object store. :meth:`Cluster.run` advances simulated time in slices (for a progress callback)
until every request is final or a stop condition holds (duration, stall, too many waiting).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from engine.kv.prefix import num_blocks
from sim.feasible import check_feasible, gpu_host
from sim.gcquiet import quiet_gc
from sim.rng import RngStreams
from sim.scenario import Scenario
from sim.serving.arrivals import OpenLoop
from sim.serving.context import ModelRt, SimContext
from sim.serving.expertlayout import expert_cache_bytes
from sim.serving.expertpath import attach_experts
from sim.serving.gpumemory import plan_memory
from sim.serving.metrics import EV_REJECT, REJECTED, TIERS, Metrics, TraceRecorder
from sim.serving.modelrt import model_rt
from sim.serving.network import Network
from sim.serving.paramserver import MetadataDirectory, ParamServer
from sim.serving.placement import Scheduler
from sim.serving.replicafactory import ReplicaFactory, ReplicaSpec
from sim.serving.workload import Workload, make_workload
from sim.simenv import CountingEnvironment

__all__ = ["Cluster", "CountingEnvironment", "build", "check_feasible", "replica_share"]


def replica_share(sc: Scenario) -> float:
    """The share of a server's host memory, NVMe and object-store link one replica gets (its
    GPUs over the server's; the number of servers it spans when wider than one)."""
    c = sc.cluster
    g = c.gpus_per_replica
    return g / c.gpus_per_server if g <= c.gpus_per_server else float(c.servers_per_replica)


class Cluster:
    """A built cluster; use :func:`build`. ``run`` may be called once."""

    def __init__(self, ctx: SimContext, wl: Workload, scheduler: Scheduler, horizon: float) -> None:
        self.ctx, self.wl, self.scheduler, self.horizon = ctx, wl, scheduler, horizon
        self.env: CountingEnvironment = ctx.env  # type: ignore[assignment]
        self._next = 0
        self._rejected: np.ndarray | None = None  # rejected_mask(), computed on first use
        self._never: tuple[np.ndarray, np.ndarray] | None = None  # _never_runs(), once
        #: why the run stopped with requests unfinished (None: every request is final)
        self.stop_reason: str | None = None
        #: work counters at the start (``w0``) and end (``w1``) of the steady window
        self.snaps: dict[str, dict[str, float]] = {}
        #: the replica factory of each pool (``both``: aggregated; ``prefill``, ``decode``),
        #: set by :func:`build`; the autoscaler makes its replicas with them
        self.factories: dict[str, ReplicaFactory] = {}

    # -- arrivals ------------------------------------------------------------------------------
    def rejected_mask(self) -> np.ndarray:
        """Per request: True if it can never run (longer than its model's max context, or a
        KV reservation larger than a node's whole KV capacity). Vectorised, exact integer
        arithmetic (int64) of :meth:`sim.serving.replica.KvAccount.size`."""
        too_long, too_big = self._never_runs()
        return np.asarray(too_long | too_big, dtype=bool)

    def rejected_reasons(self) -> dict[str, int]:
        """How many requests are rejected for each reason: ``too_long`` (prompt plus
        output longer than the model's context window) and ``kv_too_large`` (within the
        window, but its KV needs more than a replica's whole KV capacity)."""
        too_long, too_big = self._never_runs()
        return {
            "too_long": int(too_long.sum()),
            "kv_too_large": int((too_big & ~too_long).sum()),
        }

    def _never_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """Per request: longer than its model's context window; KV larger than a replica's
        whole KV capacity (the two reasons of :meth:`rejected_mask`; computed once)."""
        if self._never is None:
            self._never = self._compute_never_runs()
        return self._never

    def _compute_never_runs(self) -> tuple[np.ndarray, np.ndarray]:
        ctx, wl = self.ctx, self.wl
        kv = min((n.kv for n in ctx.nodes), key=lambda k: k.capacity)  # pools may differ
        bpt = np.array([m.kv_bytes_per_token for m in ctx.models], dtype=np.int64)[wl.model]
        limit = [min(int(m.max_context), 1 << 62) for m in ctx.models]
        max_ctx = np.array(limit, dtype=np.int64)[wl.model]
        tokens = wl.inp.astype(np.int64) + wl.out.astype(np.int64)
        bt = kv.block_tokens
        need = num_blocks(tokens, bt) * bt * bpt
        return tokens > max_ctx, need > kv.capacity

    def _reject_or_dispatch(self, rid: int) -> None:
        if self._rejected is None:
            self._rejected = self.rejected_mask()
        if self._rejected[rid]:
            self._reject(rid)
        else:
            self.scheduler.dispatch(rid)

    def _reject(self, rid: int) -> None:
        ctx = self.ctx
        met = ctx.metrics
        met.arrival[rid] = ctx.env.now
        met.n_arrived += 1
        met.finish(rid, REJECTED)
        ctx.trace.rec(ctx.env.now, EV_REJECT, rid, 0)
        if ctx.on_complete is not None:
            ctx.on_complete(rid)

    def _closed_next(self, rid: int) -> None:
        if self._next >= self.wl.n:
            return
        nxt = self._next
        self._next += 1
        assert self.wl.think is not None
        ev = self.env.timeout(float(self.wl.think[nxt]))
        ev.callbacks.append(lambda _e: self._reject_or_dispatch(nxt))

    def _sampler(self, interval: float) -> Any:
        """Append one row of cluster-wide figures to ``metrics.samples`` every ``interval``
        simulated seconds. A row costs one pass over the replicas (O(replicas)); the number
        of rows is fixed by the horizon (``metrics.interval``, default horizon / 200), not
        by the number of events, so it adds no per-request or per-event work. Sums run in
        replica order, as ``sum`` over each figure would."""
        env, ctx = self.env, self.ctx
        met = ctx.metrics
        while True:
            qlen = running = hbm = kv = preempt = 0
            busy = tok_s = 0.0
            frag: list[float] = []
            for n in ctx.nodes:
                qlen += n.qlen
                running += n.running
                hbm += n.ws.hbm.used
                kv += n.kv.reserved
                frag.append(n.kv.fragmentation())
                busy += n.busy
                tok_s += n.tok_s
                preempt += n.preemptions
            met.samples.append(
                (
                    env.now,
                    met.n_arrived,
                    met.n_final,
                    qlen,
                    running,
                    *met.tier_hits.tolist(),
                    *met.tier_bytes.tolist(),
                    hbm,
                    kv,
                    float(np.mean(frag)),
                    met.accesses,
                    busy,
                    tok_s,
                    preempt,
                )
            )
            yield env.timeout(interval)

    # -- the steady window ----------------------------------------------------------------------
    def window(self) -> tuple[float, float]:
        """The steady window ``(start, end)`` in simulated seconds: requests arriving in it
        make the headline figures. Open loops: ``[warmup, last arrival - cooldown]`` (warmup
        defaults to 10% of the arrival span); closed loops: ``[warmup, end of run]``."""
        mc = self.ctx.sc.metrics
        wl = self.wl
        if wl.closed_loop or wl.n == 0:
            w0 = mc.warmup or 0.0
            return w0, max(float(self.env.now), w0)
        last = float(wl.arrival[-1])
        first = float(wl.arrival[0])
        w0 = mc.warmup if mc.warmup is not None else first + 0.1 * (last - first)
        w1 = last - mc.cooldown
        if w1 <= w0:
            return first, last
        return w0, w1

    def snapshot(self) -> dict[str, float]:
        """Cumulative work counters now (the summary differences two of them over the
        steady window): per-replica sums and link bytes carried by kind."""
        ctx, now = self.ctx, self.env.now
        nodes = ctx.nodes
        met = ctx.metrics
        snap = {
            "t": float(now),
            "busy": sum(n.busy for n in nodes),
            "tok_s": sum(n.tok_s for n in nodes),
            "flops": sum(n.flops for n in nodes),
            "hbm_read": sum(n.hbm_read for n in nodes),
            "iterations": float(sum(n.iterations for n in nodes)),
            "preemptions": float(sum(n.preemptions for n in nodes)),
            "accesses": float(met.accesses),
        }
        for i, tier in enumerate(TIERS):
            snap[f"hits_{tier}"] = float(met.tier_hits[i])
            snap[f"bytes_{tier}"] = float(met.tier_bytes[i])
        for kind in ("pcie", "nic", "nvme"):
            snap[f"{kind}_bytes"] = sum(n.ws.links[kind].carried(now) for n in nodes)
            snap[f"{kind}_bw"] = sum(n.ws.links[kind].bandwidth for n in nodes)
        for kind in ("nic", "ssd"):
            snap[f"ps_{kind}_bytes"] = sum(s.links[kind].carried(now) for s in ctx.servers)
            snap[f"ps_{kind}_bw"] = sum(s.links[kind].bandwidth for s in ctx.servers)
        return snap

    def _snap_at(self, t: float) -> Any:
        yield self.env.timeout(max(t - self.env.now, 0.0))
        self.snaps["w0" if "w0" not in self.snaps else "w1"] = self.snapshot()

    # -- run ----------------------------------------------------------------------------------------
    def run(self, progress: Callable[[float, float], None] | None = None) -> float:
        """Simulate until every request is final; returns the end time.

        Nothing is cut off silently: the run also stops at the scenario's ``duration`` (when
        set) or when no request has arrived or finished for ``metrics.stall_timeout``
        simulated seconds while some are unfinished; ``stop_reason`` then says which, and the
        unfinished requests stay ``pending`` in the results."""
        self._start()
        with quiet_gc():  # sim.gcquiet: the built cluster frozen, fewer young collections
            self.stop_reason = self._advance(progress)
        if "w0" not in self.snaps:
            self.snaps["w0"] = self.snapshot()
        if "w1" not in self.snaps or self.wl.closed_loop:
            self.snaps["w1"] = self.snapshot()
        return self._end_time()

    def _start(self) -> None:
        """Start the replicas, the arrivals (open or closed loop), the sampler, the hot-shard
        process when enabled and the snapshots at the steady window's ends, in that order."""
        ctx, env = self.ctx, self.env
        sc = ctx.sc
        for node in ctx.nodes:
            node.start()
        if self.wl.closed_loop:
            ctx.on_complete = self._closed_next
            for _ in range(min(self.wl.clients, self.wl.n)):
                self._closed_next(-1)
        else:
            if self._rejected is None:
                self._rejected = self.rejected_mask()
            wl = self.wl
            OpenLoop(
                env, wl.arrival, wl.model, self._rejected, self.scheduler.dispatch, self._reject
            ).start()
        interval = sc.metrics.interval or max(self.horizon / 200.0, 1e-3)
        env.process(self._sampler(interval))
        if sc.hot_shards.enabled:
            env.process(ctx.directory.hot_shard_process())
        w0, w1 = self.window()
        env.process(self._snap_at(w0))
        if not self.wl.closed_loop:
            env.process(self._snap_at(w1))

    def _advance(self, progress: Callable[[float, float], None] | None) -> str | None:
        """Run the environment in slices until every request is final (returns None) or a
        stop condition holds (returns why: duration, stall, too many waiting)."""
        ctx, env = self.ctx, self.env
        sc = ctx.sc
        cap = sc.duration if sc.duration > 0 else float("inf")
        stall = sc.metrics.stall_timeout
        max_waiting = sc.metrics.max_waiting
        step = max(min(self.horizon / 100.0, stall / 4), 1e-3)
        n = self.wl.n
        met = ctx.metrics
        seen, seen_at = -1, 0.0
        # more events than this at one instant: simulated time cannot advance (a request's
        # arrival makes a few events, and every request may arrive at one instant)
        stall_events = 1_000_000 + 8 * n
        while met.n_final < n:
            if env.now >= cap:
                return f"the scenario's duration ({cap:g} s) ended the run"
            mark = met.n_final + met.n_arrived
            if mark != seen:
                seen, seen_at = mark, float(env.now)
            elif env.now - seen_at >= stall:
                return (
                    f"no request arrived or finished for {stall:g} simulated seconds "
                    "(metrics.stall_timeout)"
                )
            env.run(until=min(env.now + step, cap), stall_events=stall_events)
            if max_waiting is not None and sum(nd.qlen for nd in ctx.nodes) > max_waiting:
                return (
                    f"more than {max_waiting} requests waited (metrics.max_waiting): the "
                    "replicas cannot keep up"
                )
            if progress is not None:
                progress(met.n_final / n, env.now)
        return None

    def _end_time(self) -> float:
        met = self.ctx.metrics
        ends = met.end[~np.isnan(met.end)]
        last = float(ends.max()) if ends.size else float(self.env.now)
        return min(last, float(self.env.now)) if met.n_final == self.wl.n else float(self.env.now)


def _network_terms(sc: Scenario, profile: Any) -> tuple[float, float, float, float]:
    """``(rdma bandwidth of a replica, rdma latency, object-store bandwidth, its latency)``:
    the scenario's ``cluster.network`` figures where given, else the profile's links; a
    replica has one NIC per GPU."""
    n, L = sc.cluster.network, profile.links
    rdma_bw = (n.rdma or L.rdma.bandwidth) * sc.cluster.gpus_per_replica
    rdma_lat = n.rdma_latency if n.rdma_latency is not None else L.rdma.latency
    obj_bw = n.object_store or L.object_store.bandwidth
    obj_lat = (
        n.object_store_latency if n.object_store_latency is not None else L.object_store.latency
    )
    return rdma_bw, rdma_lat, obj_bw, obj_lat


def build(
    sc: Scenario,
    seed: int,
    catalogue: dict[str, Any],
    profile: Any,
    cost_cls: Any,
    base_dir: Path | None = None,
) -> Cluster:
    """Wire a cluster for ``sc`` (validated and feasible) with root seed ``seed``.

    Order (it fixes link and random-stream creation, so it is part of the trace): workload,
    models and memory plan, context and network, parameter servers and directory, the
    disaggregated pools or the replicas, then the scheduler."""
    check_feasible(sc, catalogue, profile)
    env = CountingEnvironment()
    rngs = RngStreams(seed)
    shares = [d.share for d in sc.deployments]
    cnames = [cl.name for cl in sc.workload.classes]
    forced = [cnames.index(d.cls) if d.cls is not None else None for d in sc.deployments]
    wl = make_workload(sc.workload, shares, rngs.get("workload"), base_dir, forced)
    specs = [catalogue[d.model] for d in sc.deployments]
    hbm, host = gpu_host(sc, profile)
    if sc.disaggregation.enabled:
        from sim.disagg.build import base_models, build_pools

        pool_models, pool_mems = base_models(sc, specs, profile, cost_cls)
        models = pool_models["prefill"]
        weight_cap, kv_bytes = 0, 0
    else:
        mem = plan_memory(sc, specs, hbm, profile.name)
        weight_cap, kv_bytes = mem.weight_cache, mem.kv
        if sc.experts.enabled:  # an expert budget sizes the weight cache (expertlayout)
            weight_cap = expert_cache_bytes(sc, specs, weight_cap)
        models = [model_rt(i, s, sc, profile, cost_cls, kv_bytes) for i, s in enumerate(specs)]
    ctx = _context(env, sc, models, wl, rngs)
    _add_param_servers(ctx, profile, shares)
    tokens = (wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())  # shared by every replica
    if sc.disaggregation.enabled:
        ctx.disagg = build_pools(
            ctx, sc, profile, wl, tokens, pool_models, pool_mems, host, base_dir
        )
        factories = ctx.disagg.factories
    else:
        factory = replica_factory(ctx, profile, wl, tokens, (weight_cap, host, kv_bytes), shares)
        factories = {"both": factory}
        _add_replicas(ctx, factory)
        if sc.experts.enabled:
            attach_experts(ctx, base_dir)
    if sc.metrics.check_invariants:
        ctx.metrics.layer_log = []
    horizon = float(wl.arrival[-1]) if not wl.closed_loop and wl.n else 1.0
    if wl.closed_loop:
        horizon = max(wl.n / max(wl.clients, 1) * (sc.workload.think_time + 0.5), 1.0)
    if ctx.disagg is not None:
        from sim.disagg.coordinator import DisaggScheduler

        sched: Scheduler = DisaggScheduler(ctx, rngs.get("scheduler"), ctx.disagg)
    else:
        sched = Scheduler(ctx, rngs.get("scheduler"))
    cl = Cluster(ctx, wl, sched, max(horizon, 1e-3))
    cl.factories = factories
    return cl


def _context(
    env: simpy.Environment, sc: Scenario, models: list[ModelRt], wl: Workload, rngs: RngStreams
) -> SimContext:
    """The shared context with its network (random stream ``network``), empty metrics and
    trace, and the class order: protected workload classes first."""
    cnames = [cl.name for cl in sc.workload.classes]
    protected = [n in sc.degradation.protected for n in cnames]
    order = [i for i in range(len(cnames)) if protected[i]] + [
        i for i in range(len(cnames)) if not protected[i]
    ]
    return SimContext(
        env=env,
        sc=sc,
        models=models,
        network=Network(env, rng=rngs.get("network")),
        metrics=Metrics(wl.n),
        trace=TraceRecorder(),
        rngs=rngs,
        class_order=order,
        protected=protected,
    )


def _add_param_servers(ctx: SimContext, profile: Any, shares: list[float]) -> None:
    """Add the parameter servers (NIC, SSD and object-store links each) and the metadata
    directory over them, warmed up with the deployments' ``shares`` when enabled."""
    sc, net = ctx.sc, ctx.network
    c, L = sc.cluster, profile.links
    _, rdma_lat, obj_bw, obj_lat = _network_terms(sc, profile)
    for p in range(c.param_servers):
        name = f"ps{p}"
        links = {
            "nic": net.add_link(f"{name}.nic", c.ps.nic, rdma_lat),
            "ssd": net.add_link(f"{name}.ssd", c.ps.ssd_bandwidth, L.nvme.latency),
            "object": net.add_link(f"{name}.object", obj_bw, obj_lat),
        }
        ctx.servers.append(ParamServer(ctx, p, name, links))
    ctx.directory = MetadataDirectory(ctx)
    if sc.warmup.enabled:
        ctx.directory.warm_up(shares, sc.warmup.ps_fraction, 0.0)


def replica_factory(
    ctx: SimContext,
    profile: Any,
    wl: Workload,
    tokens: tuple[list[int], list[int], list[int]],
    memory: tuple[int, int, int],
    shares: list[float],
) -> ReplicaFactory:
    """The aggregated pool's :class:`sim.serving.replicafactory.ReplicaFactory` (``memory`` =
    HBM weight cache per replica, host memory per server, KV bytes per replica)."""
    c = ctx.sc.cluster
    weight_cap, host, kv_bytes = memory
    spec = ReplicaSpec(
        ctx=ctx,
        profile=profile,
        gpus=c.gpus_per_replica,
        share=replica_share(ctx.sc),
        weight_cache=weight_cap,
        kv=kv_bytes,
        host=host,
        tp=c.tp,
        shares=tuple(shares),
    )
    return ReplicaFactory(spec, wl, tokens)


def _add_replicas(ctx: SimContext, factory: ReplicaFactory) -> None:
    """Add the aggregated replicas (``cluster.replicas`` of them), made by ``factory``:
    preloaded in coupled mode or with ``warmup.node_hbm``."""
    preload = factory.preloads()
    for i in range(ctx.sc.cluster.replicas):
        ctx.nodes.append(factory.make(i, preload))
