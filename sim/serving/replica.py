"""A replica: ONE long-lived SimPy process running vLLM-style iterations of its models.

A replica is one copy of the served models on ``tp`` x ``pp`` GPUs (:mod:`sim.cluster` builds
them from servers). :class:`ComputeNode` owns the replica's state, its control surface (start,
stop, submit, abort, the KV hand-in of disaggregation) and its process: a loop that picks a
model with work that can run and runs one turn of it, or waits for a request.

Which requests run is decided by the replica's :class:`engine.sched.scheduler.Scheduler`
(``sched``: queues, prefilling and decoding requests, KV blocks, preemption), the engine's own
scheduler; the node is its :class:`engine.sched.scheduler.SchedulerHooks` (metrics, trace
events, load listeners). The node prices and times what it schedules:

* :mod:`sim.serving.turn` -- one turn: the timing of the iteration, or of a multi-step decode
  segment;
* :mod:`sim.serving.fetchpath` -- an iteration whose weights are not all in HBM: layer by
  layer, with demand fetches and prefetch.

Several models on one replica take turns (:meth:`ComputeNode.pick`: the current one until
``max_steps_per_turn`` steps are used, then round-robin), or, with stream isolation, run on two
streams (:class:`sim.serving.streams.Streams`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from engine.kv.admission import IterationKind, KvAdmission
from engine.kv.allocator import KVBlockAllocator
from engine.prefetch import HeatMap, PrefetchPlanner
from engine.sched.scheduler import Scheduler
from sim.serving.context import SimContext
from sim.serving.expertpath import ExpertState
from sim.serving.metrics import DONE, EV_ADMIT, EV_DONE, EV_PREEMPT, N_ACC
from sim.serving.paramstore import WeightStore
from sim.serving.prefixcache import make_prefix_cache
from sim.serving.segcut import SegmentCut
from sim.serving.streams import Streams
from sim.serving.turn import turn

#: the replica's KV account is the engine's admission object (one set of rules, both sides)
KvAccount = KvAdmission


class ComputeNode:
    """One replica; see the module docstring. ``submit`` hands it a request id."""

    def __init__(
        self,
        ctx: SimContext,
        idx: int,
        name: str,
        weights: WeightStore,
        kv_bytes: int,
        wl: Any,
        tokens: tuple[list[int], list[int], list[int]] | None = None,
        swap_bytes: int = 0,
    ) -> None:
        """``tokens``: ``(wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())``, shared by all
        replicas of a cluster (plain ints read faster than numpy scalars); built if not given.
        ``swap_bytes``: host swap space for ``swap`` preemption."""
        sc = ctx.sc
        self.ctx, self.env, self.idx, self.name, self.ws, self.wl = (
            ctx,
            ctx.env,
            idx,
            name,
            weights,
            wl,
        )
        rc = sc.cluster.replica
        self.max_seqs = rc.max_num_seqs
        self.max_steps = rc.max_steps_per_turn
        if tokens is None:
            tokens = (wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())
        self.inp: list[int] = tokens[0]  # per request: prompt tokens (plain ints)
        #: per request: its model index
        self.model_of = wl.model
        self._init_kv(kv_bytes, swap_bytes, tokens)
        self._init_records(len(ctx.models))
        self._init_loop()
        self._init_streams()
        self._init_prefetch()
        #: disaggregation (sim.disagg): ``prefill`` hands each prompt's KV off after its first
        #: token (``on_prefilled(node, m, rid, kv_tokens, generated)``), ``decode`` takes KV in
        #: (:meth:`accept_kv`); ``both`` is the aggregated replica. ``on_prefill_iter(node,
        #: rids, seconds)`` is told when an iteration that ends those prompts starts.
        self.role = "both"
        self.server = idx
        self.tp = ctx.sc.cluster.tp  # GPUs per pipeline stage (a disaggregated pool sets its own)
        self.on_prefilled: Callable[..., None] | None = None
        self.on_prefill_iter: Callable[..., None] | None = None
        #: per queued rid: leading prompt tokens whose KV came from a store (not prefilled)
        self.prefix_skip: dict[int, int] = self.sched.external_computed_tokens

    def _init_records(self, nm: int) -> None:
        """Per-model counters of the running requests (``cum``: what a request adds up while
        it runs, :mod:`sim.serving.metrics`)."""
        self.cum = [np.zeros(N_ACC) for _ in range(nm)]
        #: element views for the per-turn hit counts (a memoryview element update is the same
        #: float64 addition as numpy's, at half the cost). Invariant: these arrays are never
        #: replaced, only updated in place.
        self.cum_view = [c.data for c in self.cum]
        self.hits_view = self.ctx.metrics.tier_hits.data
        #: per model: its routing and expert counters when its experts are chunks
        #: (sim.serving.expertpath; set by the cluster before the run), else None
        self.experts: list[ExpertState | None] = [None] * nm

    def _init_kv(
        self, kv_bytes: int, swap_bytes: int, tokens: tuple[list[int], list[int], list[int]]
    ) -> None:
        """The scheduler over a KV account of ``kv_bytes`` of blocks (the engine's allocator
        per model with ``kv.allocator: engine``), ``swap_bytes`` of host swap space, and the
        prefix cache."""
        sc = self.ctx.sc
        self.watermark = sc.kv.admission_watermark
        allocs = None
        if sc.kv.allocator == "engine":
            allocs = [
                KVBlockAllocator(
                    block_tokens=sc.kv.block_tokens,
                    bytes_per_token=mr.kv_bytes_per_token,
                    max_bytes=max(kv_bytes, sc.kv.block_tokens * mr.kv_bytes_per_token),
                )
                if mr.kv_bytes_per_token > 0
                else None
                for mr in self.ctx.models
            ]
        self.kv = KvAdmission(kv_bytes, sc.kv.block_tokens, allocs, self.watermark)
        # [prefix caching] None unless on and the trace names its blocks (sim/serving/prefixcache.py)
        self.prefix = self.kv.prefix = make_prefix_cache(sc, self.wl, self.kv, self.inp)
        rc = sc.cluster.replica
        self.sched = Scheduler(
            self.kv,
            max_num_seqs=rc.max_num_seqs,
            max_num_batched_tokens=rc.max_num_batched_tokens,
            chunked_prefill=rc.chunked_prefill,
            kv_bytes_per_token=[mr.kv_bytes_per_token for mr in self.ctx.models],
            dense=[bool(mr.is_cnn) for mr in self.ctx.models],
            class_order=list(self.ctx.class_order),
            num_classes=len(sc.workload.classes),
            swap_capacity=swap_bytes if sc.kv.preemption == "swap" else 0,
            hooks=self,
        )
        self.sched.set_requests(tokens[0], tokens[1], tokens[2])

    def _init_loop(self) -> None:
        """The process's state and the work it has done."""
        self.wake: simpy.Event | None = None
        #: called with this node whenever its load (queued + running) falls (a completion, an
        #: abort); the least-loaded placement's heap listens here
        self.on_unload: Callable[[Any], None] | None = None
        self.seg_model = -1
        #: the timeout of the decode segment in progress (None between segments)
        self.seg_ev: simpy.Event | None = None
        self._up_watchers: list[Callable[[], None]] = []
        self._up = True
        #: accumulated work: busy seconds, token-budget integral (tokens x seconds), model
        #: FLOPs, HBM bytes read, iterations, preemptions
        self.busy = 0.0
        self.tok_s = 0.0
        self.flops = 0.0
        self.hbm_read = 0.0
        self.iterations = 0
        self.preemptions = 0
        #: what the running iteration runs (:func:`engine.kv.admission.iteration_kind`)
        self.kind: IterationKind = "decode"
        self._woke = False  # the next turn follows an idle spell (waited for a request)
        self.proc: simpy.Process | None = None
        #: the model of the current turn, and the steps it has used of its quantum
        self.cur = -1
        self.quantum = 0
        #: the rest of a decode step cut short, run before the next iteration
        self.carry = 0.0

    def _init_streams(self) -> None:
        """Stream isolation (``cluster.replica.streams: isolated``,
        :class:`sim.serving.streams.Streams`: models of protected classes on stream 0, the
        rest on stream 1), or None (one stream)."""
        sc = self.ctx.sc
        rc = sc.cluster.replica
        self.streams: Streams | None = None
        if rc.streams == "isolated":
            prot = set(sc.degradation.protected)
            stream_of = [0 if d.cls in prot else 1 for d in sc.deployments]
            self.streams = Streams(self, stream_of, rc.stream_share)
        #: seconds the priority stream ran while a non-priority iteration waited for weights
        self.lent: float = 0.0

    def _init_prefetch(self) -> None:
        """The prefetch window (0: off), order and planner of the fetch path (sim.serving.fetchpath)."""
        pre = self.ctx.sc.prefetch
        self.window = pre.window_batches if pre.enabled else 0
        #: the real engine's prefetch order (scenario field ``prefetch.order``): fetch and pin
        #: a layer, then plan the next layers' prefetch, and keep the layer pinned until that
        #: prefetch has landed
        self.hold_pins = pre.order == "after-pin"
        self.heat = HeatMap(half_life=pre.heat_half_life)
        self.planner = PrefetchPlanner(window_batches=max(self.window, 1), heat=self.heat)

    # -- control ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or restart) the replica's process."""
        self.up = True
        if self.proc is None or not self.proc.is_alive:
            self.proc = self.env.process(self._run())

    def stop(self) -> None:
        """Mark the replica down: the scheduler stops sending it work (faults)."""
        self.up = False

    @property
    def up(self) -> bool:
        """Whether the replica takes work. Setting it (``start``/``stop``, faults) calls every
        watcher (the scheduler's cached live list)."""
        return self._up

    @up.setter
    def up(self, value: bool) -> None:
        self._up = value
        for fn in self._up_watchers:
            fn()

    def watch_up(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` whenever ``up`` is set."""
        self._up_watchers.append(fn)

    @property
    def qlen(self) -> int:
        """Queued requests, all models."""
        return self.sched.num_waiting

    @property
    def running(self) -> int:
        """Running requests (prefilling or decoding), all models."""
        return self.sched.num_running

    @property
    def load(self) -> int:
        sched = self.sched
        return sched.num_waiting + sched.num_running

    @property
    def max_batch(self) -> int:
        """The running-batch limit (``max_num_seqs``)."""
        return self.max_seqs

    def oldest_wait(self, now: float) -> float:
        """How long the longest-waiting queued request has waited."""
        arr = self.ctx.metrics.arrival
        heads = [q[0] for per in self.sched.waiting for q in per if q]
        return now - float(min(arr[r] for r in heads)) if heads else 0.0

    def submit(self, rid: int, m: int = -1) -> None:
        """Queue request ``rid`` (of model ``m``; -1: look it up); wake the process or cut a
        fast segment short if it could join."""
        if m < 0:
            m = int(self.model_of[rid])
        self.sched.add_request(rid, m)
        self._wake_for(m)

    def _wake_for(self, m: int) -> None:
        """A request of model ``m`` was queued: wake the process, or cut a fast segment short
        if the request could join it."""
        if self.wake is not None:
            if not self.wake.triggered:
                self.wake.succeed()
        elif self.seg_model >= 0 and (
            self.seg_model != m or self.sched.num_decoding[m] < self.max_seqs
        ):
            self.seg_model = -1
            assert self.proc is not None and self.seg_ev is not None
            SegmentCut(self.proc, self.seg_ev)

    def abort_all(self) -> list[int]:
        """Drop every request this replica holds (a crash): release their KV and swap space,
        close their per-request counters, and return them (queued first, then running)."""
        met = self.ctx.metrics
        held, running = self.sched.abort_all()
        for m, rid in running:
            met.acc[rid] += self.cum[m]
            met.start[rid] = np.nan
            met.first[rid] = np.nan
            held.append(rid)
        self.wake = None
        self.seg_model = -1
        self.seg_ev = None
        self.carry = 0.0
        self.quantum = 0
        self.cur = -1
        if self.on_unload is not None:
            self.on_unload(self)
        return held

    # -- the process ------------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        try:
            while True:
                m = self.cur  # pick's first case, inline: the current model keeps running
                streams = self.streams
                if streams is not None:
                    m = streams.pick()
                elif not self.continues(m):
                    m = self.pick()
                if m < 0:
                    self.wake = self.env.event()
                    yield self.wake
                    self.wake = None
                    self._woke = True
                    continue
                if streams is not None:
                    yield from streams.turn(m)
                else:
                    yield from turn(self, m)
        except (
            simpy.Interrupt
        ) as intr:  # killed (sim.control.degrade.kill_node cleans the state up)
            if intr.cause != "kill":
                raise

    def take_woke(self) -> bool:
        """Whether the turn starting now follows an idle spell (the node waited for a
        request since the last turn began); reading it clears it."""
        woke, self._woke = self._woke, False
        return woke

    def continues(self, m: int) -> bool:
        """Whether the process loop runs model ``m`` again at once, without picking: no
        stream isolation, ``m`` is the current model, its quantum is not used up and it has
        running sequences or prompt chunks (:func:`sim.serving.turn.turn` loops on it)."""
        return (
            m >= 0
            and m == self.cur
            and self.streams is None
            and self.quantum < self.max_steps
            and bool(self.sched.num_decoding[m] or self.sched.prefilling[m])
        )

    def runnable(self, m: int) -> bool:
        """Whether model ``m`` has work that can run now: running sequences, or a queued head
        whose blocks fit."""
        return self.sched.can_run(m)

    def pick(self) -> int:
        """The model to run next: the current one until its quantum of ``max_steps_per_turn``
        steps is used up (switching models is what evicts weights), then round-robin."""
        cur = self.cur
        can_run = self.sched.can_run
        if cur >= 0 and self.quantum < self.max_steps and can_run(cur):
            return cur
        nm = len(self.sched.num_decoding)
        for i in range(1, nm + 1):
            m = (cur + i) % nm
            if can_run(m):
                if m != cur:
                    self.quantum = 0
                    self.cur = m
                elif self.quantum >= self.max_steps:
                    self.quantum = 0
                return m
        return -1

    def turn(self, m: int) -> Generator[simpy.Event, Any, None]:
        """One turn of model ``m`` (:func:`sim.serving.turn.turn`)."""
        return turn(self, m)

    # -- the scheduler's hooks: the records of admissions, preemptions, tokens, completions --
    def on_admit(self, m: int, rid: int) -> None:
        """``rid`` was admitted: its start (the first time) and its counters open."""
        met = self.ctx.metrics
        now = self.env.now
        v = met.start[rid]
        if v != v:  # NaN: never started before (a float test, no numpy call)
            met.start[rid] = now
        row = met.acc[rid]  # a view: subtract in place
        row -= self.cum[m]
        self.ctx.trace.rec(now, EV_ADMIT, rid, self.idx)

    def on_preempt(self, m: int, rid: int) -> None:
        """``rid`` was preempted: its counters close until it runs again."""
        met = self.ctx.metrics
        self.preemptions += 1
        met.acc[rid] += self.cum[m]
        met.n_preempted += 1
        self.ctx.trace.rec(self.env.now, EV_PREEMPT, rid, self.idx)

    def on_first_token(self, rid: int) -> None:
        """``rid``'s prefill ran: its first token now (unless recomputed after a preemption)."""
        first = self.ctx.metrics.first
        v = first[rid]
        if v != v:  # NaN: no first token yet
            first[rid] = self.env.now

    def on_finish(self, m: int, rid: int) -> None:
        """``rid`` is done: close its counters, record it, and tell the listeners
        (``on_unload``, the cluster's ``on_complete``)."""
        ctx = self.ctx
        met = ctx.metrics
        now = self.env.now
        met.end[rid] = now
        row = met.acc[rid]  # a view: add in place
        row += self.cum[m]
        met.finish(rid, DONE)
        ctx.trace.rec(now, EV_DONE, rid, self.idx)
        if self.on_unload is not None:
            self.on_unload(self)
        if ctx.on_complete is not None:
            ctx.on_complete(rid)

    def hands_off(self) -> bool:
        """Whether prefilled requests leave (a disaggregated prefill replica)."""
        return self.role == "prefill" and self.on_prefilled is not None

    def on_handoff(self, m: int, rid: int, kv_tokens: int, generated: int) -> None:
        """``rid`` left after its prefill: close its counters and hand it to ``on_prefilled``."""
        row = self.ctx.metrics.acc[rid]  # a view: add in place
        row += self.cum[m]
        assert self.on_prefilled is not None
        self.on_prefilled(self, m, rid, kv_tokens, generated)

    # -- KV hand-off (disaggregation) -----------------------------------------------------------
    def accept_kv(self, rid: int, m: int, kv_tokens: int, generated: int) -> None:
        """Queue ``rid`` whose ``kv_tokens`` of KV arrived from a prefill replica
        (``generated`` tokens sampled there): admitted like a swapped-in sequence (its blocks
        taken, no prefill, no PCIe copy), it decodes from the next iteration."""
        self.sched.add_handed_in(rid, m, kv_tokens, generated)
        self._wake_for(m)
