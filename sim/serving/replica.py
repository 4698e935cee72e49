"""A replica: ONE long-lived SimPy process running vLLM-style iterations of its models.

A replica is one copy of the served models on ``tp`` x ``pp`` GPUs (:mod:`sim.cluster` builds
them from servers). :class:`ComputeNode` owns the replica's state, its control surface (start,
stop, submit, abort, the KV hand-in of disaggregation) and its process: a loop that picks a
model with work that can run and runs one turn of it, or waits for a request. The work of a
turn lives in three modules, each a set of functions over the node's state:

* :mod:`sim.serving.turn` -- one turn: batch formation (decodes, prefill chunks, admissions
  within the token budget) and the timing of the iteration, or of a multi-step decode segment;
* :mod:`sim.serving.replicakv` -- the replica's KV accounting: admission, block growth, preemption,
  completion (over the engine's :class:`engine.kv.admission.KvAdmission`);
* :mod:`sim.serving.fetchpath` -- an iteration whose weights are not all in HBM: layer by layer, with
  demand fetches and prefetch.

Per model ``m`` the replica keeps queues per class (``queues[m][c]``), its *prefilling*
sequences in admission order (``pf[m]``: ``[rid, tokens left, tokens done]``) and its
*decoding* batch: ``b_n[m]`` sequences, ``b_off[m]`` steps run, ``b_base[m]`` the sum of their
context bases (a sequence's context in step ``off`` -> ``off + 1`` is ``base + off``) and
``b_heap[m]`` their finishing steps. ``qlen`` and ``running`` count queued and running
requests of all models.

Several models on one replica take turns (:meth:`ComputeNode._pick`: the current one until
``max_steps_per_turn`` steps are used, then round-robin), or, with stream isolation, run on two
streams (:mod:`sim.serving.streams`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from engine.kv.admission import IterationKind, KvAdmission
from engine.kv.allocator import KVBlockAllocator
from engine.prefetch import HeatMap, PrefetchPlanner
from sim.serving.context import SimContext
from sim.serving.metrics import N_ACC
from sim.serving.paramstore import WeightStore
from sim.serving.prefixcache import make_prefix_cache
from sim.serving.replicakv import fits
from sim.serving.replicakv import release as release_kv
from sim.serving.segcut import SegmentCut
from sim.serving.streams import pick_streams, stream_turn
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
        self.max_tokens = rc.max_num_batched_tokens
        self.chunked = rc.chunked_prefill
        self.max_steps = rc.max_steps_per_turn
        if tokens is None:
            tokens = (wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())
        self._inp: list[int] = tokens[0]  # per request: prompt tokens (plain ints)
        self._out: list[int] = tokens[1]  # per request: output tokens
        self._cls: list[int] = tokens[2]  # per request: class index
        self._model = wl.model
        self._init_batches(len(ctx.models), len(sc.workload.classes), sc.kv.block_tokens)
        self._init_kv(kv_bytes, swap_bytes)
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
        self.prefix_skip: dict[int, int] = {}
        self._handed: set[int] = set()

    def _init_batches(self, nm: int, nc: int, bt: int) -> None:
        """Queues, batches and per-request bookkeeping for ``nm`` models, ``nc`` classes and
        blocks of ``bt`` tokens (see the module docstring)."""
        self.queues: list[list[deque[int]]] = [[deque() for _ in range(nc)] for _ in range(nm)]
        self.qlen = 0
        self.running = 0
        # decoding batch per model (see the module docstring)
        self.b_n = [0] * nm
        self.b_off = [0] * nm
        self.b_base = [0.0] * nm
        self.b_heap: list[list[tuple[int, int, int]]] = [[] for _ in range(nm)]
        #: KV growth per model: decoding rids by the residue (mod block_tokens) of the steps at
        #: which each needs a new block (``(1 - base) % block_tokens``: its context crosses a
        #: block boundary then), and rids owing a block for a step already granted to the rest
        #: (a swap-in): (rid, seqno, step)
        self._res: list[list[dict[int, None]]] = [[{} for _ in range(bt)] for _ in range(nm)]
        self._lag: list[list[tuple[int, int, int]]] = [[] for _ in range(nm)]
        #: prefilling sequences per model, in admission order: [rid, tokens left, tokens done]
        self.pf: list[list[list[int]]] = [[] for _ in range(nm)]
        #: running sequences per model in admission order (preemption takes the last)
        self._order: list[dict[int, None]] = [{} for _ in range(nm)]
        #: per decoding rid: its context base (context in step off -> off + 1 = base + off)
        self._base_of: dict[int, int] = {}
        #: per running rid: its seqno (heap entries of an older life are skipped)
        self._life: dict[int, int] = {}
        self._seqno = 0
        #: tokens generated before a preemption (recompute) / KV kept on host (swap)
        self._gen: dict[int, int] = {}
        self._swapped: dict[int, tuple[int, int]] = {}
        self.cum = [np.zeros(N_ACC) for _ in range(nm)]
        # Element views for the per-turn hit counts (a memoryview element update is the same
        # float64 addition as numpy's, at half the cost). Invariant: these arrays are never
        # replaced, only updated in place.
        self._cum_mv = [c.data for c in self.cum]
        self._hits_mv = self.ctx.metrics.tier_hits.data

    def _init_kv(self, kv_bytes: int, swap_bytes: int) -> None:
        """The KV account over ``kv_bytes`` of blocks (the engine's allocator per model with
        ``kv.allocator: engine``), ``swap_bytes`` of host swap space, and the prefix cache."""
        sc = self.ctx.sc
        self.swap = sc.kv.preemption == "swap"
        self.swap_cap = swap_bytes
        self.swap_used = 0
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
        self.prefix = self.kv.prefix = make_prefix_cache(sc, self.wl, self.kv, self._inp)

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
        #: FLOPs, HBM bytes read, iterations, preemptions, swap bytes over PCIe
        self.busy = 0.0
        self.tok_s = 0.0
        self.flops = 0.0
        self.hbm_read = 0.0
        self.iterations = 0
        self.preemptions = 0
        self.swap_moved = 0
        #: what the running iteration runs (:func:`engine.kv.admission.iteration_kind`)
        self.kind: IterationKind = "decode"
        self._woke = False  # the next turn follows an idle spell (waited for a request)
        self.proc: simpy.Process | None = None
        self._cur = -1
        self._carry = 0.0
        self._quantum = 0

    def _init_streams(self) -> None:
        """Stream isolation (``cluster.replica.streams: isolated``, :mod:`sim.serving.streams`): per
        model its stream (0: models of protected classes, 1: the rest), or None (one stream);
        per stream its virtual time (GPU seconds used / its share), model and quantum used."""
        sc = self.ctx.sc
        rc = sc.cluster.replica
        self._stream: list[int] | None = None
        if rc.streams == "isolated":
            prot = set(sc.degradation.protected)
            self._stream = [0 if d.cls in prot else 1 for d in sc.deployments]
        self._share: tuple[float, float] = (rc.stream_share, 1.0 - rc.stream_share)
        self._vt: list[float] = [0.0, 0.0]
        self._s_last: list[int] = [-1, -1]
        self._s_quant: list[int] = [0, 0]
        #: seconds the priority stream ran while a non-priority iteration waited for weights
        self._lent: float = 0.0

    def _init_prefetch(self) -> None:
        """The prefetch window (0: off), order and planner of the fetch path (sim.serving.fetchpath)."""
        pre = self.ctx.sc.prefetch
        self._window = pre.window_batches if pre.enabled else 0
        #: the real engine's prefetch order (scenario field ``prefetch.order``): fetch and pin
        #: a layer, then plan the next layers' prefetch, and keep the layer pinned until that
        #: prefetch has landed
        self.hold_pins = pre.order == "after-pin"
        self._heat = HeatMap(half_life=pre.heat_half_life)
        self._planner = PrefetchPlanner(window_batches=max(self._window, 1), heat=self._heat)

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
    def load(self) -> int:
        return self.qlen + self.running

    @property
    def max_batch(self) -> int:
        """The running-batch limit (``max_num_seqs``)."""
        return self.max_seqs

    def oldest_wait(self, now: float) -> float:
        """How long the longest-waiting queued request has waited."""
        arr = self.ctx.metrics.arrival
        heads = [q[0] for per in self.queues for q in per if q]
        return now - float(min(arr[r] for r in heads)) if heads else 0.0

    def submit(self, rid: int, m: int = -1) -> None:
        """Queue request ``rid`` (of model ``m``; -1: look it up); wake the process or cut a
        fast segment short if it could join."""
        if m < 0:
            m = int(self._model[rid])
        self.queues[m][self._cls[rid]].append(rid)
        self.qlen += 1
        if self.wake is not None:
            if not self.wake.triggered:
                self.wake.succeed()
        elif self.seg_model >= 0 and (self.seg_model != m or self.b_n[m] < self.max_seqs):
            self.seg_model = -1
            assert self.proc is not None and self.seg_ev is not None
            SegmentCut(self.proc, self.seg_ev)

    def abort_all(self) -> list[int]:
        """Drop every request this replica holds (a crash): release their KV and swap space,
        close their per-request counters, and return them (queued first, then running)."""
        met = self.ctx.metrics
        held: list[int] = []
        for per in self.queues:
            for q in per:
                held.extend(q)
                q.clear()
        self.qlen = 0
        for m, order in enumerate(self._order):
            bpt = self.ctx.models[m].kv_bytes_per_token
            for rid in list(order):
                if rid in self.kv.seqs:
                    self.kv.give(rid, bpt)
                met.acc[rid] += self.cum[m]
                met.start[rid] = np.nan
                met.first[rid] = np.nan
                held.append(rid)
            order.clear()
            self.b_heap[m].clear()
            for d in self._res[m]:
                d.clear()
            self._lag[m].clear()
            self.pf[m].clear()
            self.b_n[m] = self.b_off[m] = 0
            self.b_base[m] = 0.0
        for rid in held:
            self._gen.pop(rid, None)
            self._swapped.pop(rid, None)
            self._handed.discard(rid)
            self.prefix_skip.pop(rid, None)
        self._base_of.clear()
        self._life.clear()
        self.swap_used = 0
        self.running = 0
        self.wake = None
        self.seg_model = -1
        self.seg_ev = None
        self._carry = 0.0
        self._quantum = 0
        self._cur = -1
        if self.on_unload is not None:
            self.on_unload(self)
        return held

    # -- the process ------------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        try:
            while True:
                m = self._cur  # _pick's first case, inline: the current model keeps running
                if self._stream is not None:
                    m = pick_streams(self)
                elif not self.continues(m):
                    m = self._pick()
                if m < 0:
                    self.wake = self.env.event()
                    yield self.wake
                    self.wake = None
                    self._woke = True
                    continue
                if self._stream is not None:
                    yield from stream_turn(self, m)
                else:
                    yield from self._turn(m)
        except (
            simpy.Interrupt
        ) as intr:  # killed (sim.control.degrade.kill_node cleans the state up)
            if intr.cause != "kill":
                raise

    def continues(self, m: int) -> bool:
        """Whether the process loop runs model ``m`` again at once, without picking: no
        stream isolation, ``m`` is the current model, its quantum is not used up and it has
        running sequences or prompt chunks (:func:`sim.serving.turn.turn` loops on it)."""
        return (
            m >= 0
            and m == self._cur
            and self._stream is None
            and self._quantum < self.max_steps
            and bool(self.b_n[m] or self.pf[m])
        )

    def _head(self, m: int) -> int:
        for c in self.ctx.class_order:
            q = self.queues[m][c]
            if q:
                return q[0]
        return -1

    def _runnable(self, m: int) -> bool:
        """Whether model ``m`` has work that can run now: running sequences, or a queued head
        whose blocks fit."""
        if self.b_n[m] or self.pf[m]:
            return True
        h = self._head(m)
        return h >= 0 and fits(self, h, m)

    def _pick(self) -> int:
        """The model to run next: the current one until its quantum of ``max_steps_per_turn``
        steps is used up (switching models is what evicts weights), then round-robin."""
        cur = self._cur
        if cur >= 0 and self._quantum < self.max_steps and self._runnable(cur):
            return cur
        nm = len(self.b_n)
        for i in range(1, nm + 1):
            m = (cur + i) % nm
            if self._runnable(m):
                if m != cur:
                    self._quantum = 0
                    self._cur = m
                elif self._quantum >= self.max_steps:
                    self._quantum = 0
                return m
        return -1

    def _turn(self, m: int) -> Generator[simpy.Event, Any, None]:
        """One turn of model ``m`` (:func:`sim.serving.turn.turn`)."""
        return turn(self, m)

    # -- KV hand-off (disaggregation) -----------------------------------------------------------
    def release(self, m: int, rid: int) -> None:
        """Drop running sequence ``rid`` (not decoding) without finishing it: free its blocks
        and close its per-request counters (a prefill replica handing it off)."""
        release_kv(self, m, rid)

    def accept_kv(self, rid: int, m: int, kv_tokens: int, generated: int) -> None:
        """Queue ``rid`` whose ``kv_tokens`` of KV arrived from a prefill replica
        (``generated`` tokens sampled there): admitted like a swapped-in sequence (its blocks
        taken, no prefill, no PCIe copy), it decodes from the next iteration."""
        self._swapped[rid] = (kv_tokens, generated)
        self._handed.add(rid)
        self.submit(rid, m)
