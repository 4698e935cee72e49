"""A replica: ONE long-lived SimPy process running vLLM-style iterations, layer by layer.

A replica is one copy of the served models on ``tp`` x ``pp`` GPUs (:mod:`sim.cluster` builds
them from servers). It keeps, per model, a running batch of *prefilling* sequences (prompts
being computed, in chunks) and *decoding* sequences. One **iteration** runs at most
``max_num_batched_tokens`` tokens: one per decoding sequence, then prefill chunks of the
prompts in admission order, then newly admitted prompts, in ONE pass over the weights
(:meth:`sim.serving.context.ModelRt.iter_cost`); at most ``max_num_seqs`` sequences run at once. A
prompt whose last chunk runs samples its first token at the end of that iteration (TTFT).

Decode state is O(1) to advance: ``off`` counts the model's iterations; a sequence that
started decoding at ``a`` finishes at ``a + out - 1`` (a min-heap of those targets), and the
decoding sequences' total context is ``base + n * off``. When nothing is prefilling, nothing
was admitted and every weight of the model is resident, nothing can change until the next
completion, KV block boundary or arrival, so the replica runs ``k`` decode steps as ONE
timeout (capped by ``max_steps_per_turn`` when other models wait); an arrival that could join
interrupts it, the step in progress finishes and the replica re-plans.

**KV** (:class:`engine.kv.admission.KvAdmission`, the engine's admission object, over
:class:`engine.kv.allocator.KVBlockAllocator`, the engine's allocator; the rules:
``docs/design/admission.md``): admission reserves the blocks of the prompt only (never the
unknown output length) and leaves ``admission_watermark`` of the blocks free; a decoding
sequence takes a new block when its context crosses a block boundary, i.e. once every ``block_tokens`` steps,
at the steps of one residue: sequences are bucketed by that residue, so a step's blocks are
one bucket, taken in one bulk allocator call. A multi-step segment is checked to fit before
it starts and takes the blocks of the steps that ran when it ends (an arrival may cut it
short). When blocks run out, the most recently admitted
sequence of the model is **preempted**: ``recompute`` frees its blocks and re-queues it at the
front (it prefills prompt + generated tokens again), ``swap`` copies its KV to host swap space
over PCIe (charged to the iteration) and back when it resumes. Nothing is lost.
With prefix caching (``kv.prefix_caching`` and a trace with block hash ids) a
:class:`sim.serving.prefixcache.PrefixCache` does ``KvAccount``'s take/give with shared prompt blocks and
admission starts a prompt's prefill after its reused prefix; its hooks here are marked
``[prefix caching]`` and are skipped when the replica has none.

Weights: an iteration whose model is not fully resident runs layer by layer
(:meth:`ComputeNode._layers`): a layer computes only once all its chunks are in HBM (pinned
while it computes), missing chunks come as one aggregated transfer per source, and the next
``window`` layers are prefetched while it computes (R7/R21/R27). Each chunk access (a layer's
chunk when the layer computes) is counted once: an HBM hit if it was resident then.

Several models on one replica take turns (:meth:`ComputeNode._pick`), or, with stream
isolation, run on two streams (:mod:`sim.serving.streams`).

Warm-up costs (off unless the cost model sets them, e.g. a calibrated engine's): see
:meth:`sim.serving.context.ModelRt.wake` and :meth:`sim.serving.context.ModelRt.rewarm`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from engine.kv.admission import IterationKind, KvAdmission, iteration_kind
from engine.kv.allocator import KVBlockAllocator
from engine.prefetch import HeatMap, PrefetchPlanner
from sim.serving.context import SimContext
from sim.serving.metrics import DONE, EV_ADMIT, EV_DONE, EV_PREEMPT, N_ACC, TIERS
from sim.serving.paramstore import WeightStore
from sim.serving.prefixcache import make_prefix_cache
from sim.serving.streams import lend, pick_streams, stream_turn

_NT = len(TIERS)
#: wait before re-requesting chunks whose transfer failed (a dropped link; faults)
FETCH_RETRY_S = 1e-3


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
        nm = len(ctx.models)
        nc = len(sc.workload.classes)
        rc = sc.cluster.replica
        self.max_seqs = rc.max_num_seqs
        self.max_tokens = rc.max_num_batched_tokens
        self.chunked = rc.chunked_prefill
        self.max_steps = rc.max_steps_per_turn
        self.swap = sc.kv.preemption == "swap"
        self.swap_cap = swap_bytes
        self.swap_used = 0
        self.watermark = sc.kv.admission_watermark
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
        bt = sc.kv.block_tokens
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
        self._hits_mv = ctx.metrics.tier_hits.data
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
                for mr in ctx.models
            ]
        self.kv = KvAdmission(kv_bytes, sc.kv.block_tokens, allocs, self.watermark)
        self.wake: simpy.Event | None = None
        #: called with this node whenever its load (queued + running) falls (a completion, an
        #: abort); the least-loaded placement's heap listens here
        self.on_unload: Callable[[Any], None] | None = None
        self.seg_model = -1
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
        #: requests the running turn admitted (0: a decode-only iteration); set at the turn's
        #: start, before its compute, so hooks on the iteration (hwbench.interference) see it
        self.admitted = 0
        #: what the running iteration runs (:func:`engine.kv.admission.iteration_kind`)
        self.kind: IterationKind = "decode"
        #: the running turn follows an idle spell (the replica waited for a request)
        self.woke = False
        self._woke = False
        self._since = 1 << 30
        self.proc: simpy.Process | None = None
        self._cur = -1
        self._carry = 0.0
        self._quantum = 0
        #: stream isolation (``cluster.replica.streams: isolated``, :mod:`sim.serving.streams`): per
        #: model its stream (0: models of protected classes, 1: the rest), or None (one stream);
        #: per stream its virtual time (GPU seconds used / its share), model and quantum used
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
        self._window = sc.prefetch.window_batches if sc.prefetch.enabled else 0
        #: the real engine's prefetch order (scenario field ``prefetch.order``): fetch and pin
        #: a layer, then plan the next layers' prefetch, and keep the layer pinned until that
        #: prefetch has landed
        self.hold_pins = sc.prefetch.order == "after-pin"
        self._heat = HeatMap(half_life=sc.prefetch.heat_half_life)
        self._planner = PrefetchPlanner(window_batches=max(self._window, 1), heat=self._heat)
        if tokens is None:
            tokens = (wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())
        self._inp: list[int] = tokens[0]  # per request: prompt tokens (plain ints)
        self._out: list[int] = tokens[1]  # per request: output tokens
        self._cls: list[int] = tokens[2]  # per request: class index
        self._model = wl.model
        # [prefix caching] None unless on and the trace names its blocks (sim/serving/prefixcache.py)
        self.prefix = self.kv.prefix = make_prefix_cache(sc, wl, self.kv, self._inp)
        #: disaggregation (sim.disagg): ``prefill`` hands each prompt's KV off after its first
        #: token (``on_prefilled(node, m, rid, kv_tokens, generated)``), ``decode`` takes KV in
        #: (:meth:`accept_kv`); ``both`` is the aggregated replica. ``on_prefill_iter(node,
        #: rids, seconds)`` is told when an iteration that ends those prompts starts.
        self.role = "both"
        self.server = idx
        self.on_prefilled: Callable[..., None] | None = None
        self.on_prefill_iter: Callable[..., None] | None = None
        #: per queued rid: leading prompt tokens whose KV came from a store (not prefilled)
        self.prefix_skip: dict[int, int] = {}
        self._handed: set[int] = set()

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
            assert self.proc is not None
            self.proc.interrupt()

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
                elif not (m >= 0 and self._quantum < self.max_steps and self._active(m)):
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

    def _active(self, m: int) -> bool:
        return bool(self.b_n[m] or self.pf[m])

    def _head(self, m: int) -> int:
        for c in self.ctx.class_order:
            q = self.queues[m][c]
            if q:
                return q[0]
        return -1

    def _runnable(self, m: int) -> bool:
        if self.b_n[m] or self.pf[m]:
            return True
        h = self._head(m)
        return h >= 0 and self._fits(h, m)

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

    # -- admission and KV -------------------------------------------------------------------
    def _kv_tokens(self, rid: int) -> int:
        """KV tokens ``rid`` needs to (re)start: its prompt plus tokens generated earlier."""
        sw = self._swapped.get(rid)
        if sw is not None:
            return sw[0]
        return self._inp[rid] + self._gen.get(rid, 0)

    def _fits(self, rid: int, m: int) -> bool:
        """Whether ``rid``'s blocks fit now, leaving the admission watermark free (a replica
        with nothing running admits anything that fits at all)."""
        bpt = self.ctx.models[m].kv_bytes_per_token
        if bpt == 0:
            return True
        kv = self.kv
        if self.prefix is None:
            need = kv.size(self._kv_tokens(rid), bpt)[0]
        else:  # [prefix caching] blocks running sequences already hold cost nothing
            need = self.prefix.need(rid, m, self._kv_tokens(rid), bpt)
        return kv.fits(need, self.running > 0)

    def _admit(self, m: int, budget: int) -> tuple[list[int], list[int]]:
        """Admit queued requests of model ``m`` (class order, head of line first) while slots,
        token ``budget`` and KV blocks allow. Returns (admitted rids, swapped-in rids)."""
        new: list[int] = []
        swapped: list[int] = []
        if not self.qlen:
            return new, swapped
        now = self.env.now
        ctx = self.ctx
        met, cum = ctx.metrics, self.cum[m]
        mr = ctx.models[m]
        bpt = mr.kv_bytes_per_token
        pf, order = self.pf[m], self._order[m]
        room = self.max_seqs - self.b_n[m] - len(pf)
        first_prompt = not pf  # unchunked: the iteration's first prompt runs whatever its size
        allows = KvAdmission.budget_allows
        self.kv.step = self.b_off[m]
        for c in ctx.class_order:
            q = self.queues[m][c]
            while q and room > 0:
                rid = q[0]
                sw = self._swapped.get(rid)
                if sw is None:
                    tokens = self._kv_tokens(rid)
                    if not mr.is_cnn and not allows(tokens, budget, first_prompt, self.chunked):
                        return new, swapped
                if not self._fits(rid, m):
                    return new, swapped  # head-of-line: never let a lower class overtake
                q.popleft()
                self.qlen -= 1
                self.running += 1
                room -= 1
                order[rid] = None
                self._seqno += 1
                self._life[rid] = self._seqno
                skip = self.kv.take(rid, m, self._kv_tokens(rid), bpt, sw is None) if bpt else 0
                v = met.start[rid]
                if v != v:  # NaN: never started before (a float test, no numpy call)
                    met.start[rid] = now
                row = met.acc[rid]  # a view: subtract in place
                row -= cum
                ctx.trace.rec(now, EV_ADMIT, rid, self.idx)
                if sw is not None:
                    swapped.append(rid)
                    continue
                tokens = self._kv_tokens(rid)
                if self.prefix_skip:  # a prefix read from the KV store (sim.disagg)
                    skip = max(skip, self.prefix_skip.pop(rid, 0))
                pf.append([rid, tokens - skip, skip])  # skip: a reused cached prefix
                new.append(rid)
                budget -= tokens - skip
                first_prompt = False
        return new, swapped

    def _preempt(self, m: int, off: int) -> float:
        """Preempt the most recently admitted sequence of model ``m``; returns the seconds its
        swap-out adds to the iteration (0 for recompute)."""
        order = self._order[m]
        rid = KvAdmission.victim(order)
        del order[rid]
        mr = self.ctx.models[m]
        bpt = mr.kv_bytes_per_token
        met = self.ctx.metrics
        self.preemptions += 1
        self.running -= 1
        del self._life[rid]
        cost = 0.0
        pf = self.pf[m]
        for i, ent in enumerate(pf):
            if ent[0] == rid:  # still prefilling: its chunks are lost
                del pf[i]
                break
        else:
            base = self._base_of.pop(rid)
            self.b_n[m] -= 1
            self.b_base[m] -= base
            self._res[m][(1 - base) % self.kv.block_tokens].pop(rid, None)
            gen = base + off - self._inp[rid]  # tokens generated so far
            kv_tok = base + off - 1  # KV written so far (the allocator may lag behind)
            nbytes = kv_tok * bpt
            if self.swap and bpt and self.swap_used + nbytes <= self.swap_cap:
                self.swap_used += nbytes
                self.swap_moved += nbytes
                self._swapped[rid] = (kv_tok, gen)
                cost = nbytes / self.ws.links["pcie"].bandwidth
            else:
                self._gen[rid] = gen
        self.kv.step = off
        self.kv.preempt(rid, bpt)
        met.acc[rid] += self.cum[m]
        met.n_preempted += 1
        self.ctx.trace.rec(self.env.now, EV_PREEMPT, rid, self.idx)
        self.queues[m][self._cls[rid]].appendleft(rid)
        self.qlen += 1
        if self.b_n[m] == 0:
            self.b_base[m] = 0.0
        return cost

    def _grow_step(self, m: int, off: int) -> bool:
        """Take the KV blocks the decoding sequences need for step ``off`` (those owing one
        for an earlier step first), all or none; False when they do not fit."""
        bucket = self._res[m][off % self.kv.block_tokens]
        lag = self._lag[m]
        if not bucket and not lag:
            return True
        kv = self.kv
        bpt = self.ctx.models[m].kv_bytes_per_token
        if lag:
            life = self._life
            lag[:] = [e for e in lag if life.get(e[0]) == e[1]]
        if not kv.can_grow(len(bucket) + len(lag), bpt):
            return False
        if lag:
            self._take_blocks(m, [(rid, s) for rid, _, s in lag])
            lag.clear()
        if bucket:
            self._take_blocks(m, [(rid, off) for rid in bucket])
        return True

    def _fit_steps(self, m: int, off: int, k: int) -> int:
        """How many of steps ``off .. off + k - 1`` (step ``off``'s blocks already taken) the
        free KV blocks cover; reads only. Every decoding sequence needs one block per
        ``block_tokens`` steps, at the steps of its residue."""
        kv = self.kv
        bt = kv.block_tokens
        block = bt * self.ctx.models[m].kv_bytes_per_token
        if block == 0 or k <= 1:
            return k
        room = kv.free_blocks(self.ctx.models[m].kv_bytes_per_token)
        if self.b_n[m] * (-(-(k - 1) // bt)) <= room:  # an upper bound fits: no walk
            return k
        res = self._res[m]
        for s in range(off + 1, off + k):
            room -= len(res[s % bt])
            if room < 0:
                return s - off
        return k

    def _grow_steps(self, m: int, lo: int, hi: int) -> None:
        """Take the blocks of steps ``lo .. hi - 1`` (checked by :meth:`_fit_steps`)."""
        if hi <= lo or not self.ctx.models[m].kv_bytes_per_token:
            return
        res, bt = self._res[m], self.kv.block_tokens
        # residue s's crossings in [lo, hi): steps s, s + bt, ...
        items = [
            (rid, t)
            for s in range(lo, min(hi, lo + bt))
            if (bucket := res[s % bt])
            for t in range(s, hi, bt)
            for rid in bucket
        ]
        if items:
            self._take_blocks(m, items)

    def _take_blocks(self, m: int, items: list[tuple[int, int]]) -> None:
        """Give each ``(rid, step)`` the one block its context crosses into at that step
        (:meth:`engine.kv.admission.KvAdmission.grow`, one bulk call)."""
        base_of = self._base_of
        self.kv.grow(
            m,
            [(rid, base_of[rid] + s, s) for rid, s in items],
            self.ctx.models[m].kv_bytes_per_token,
        )

    def _start_decoding(
        self, m: int, rid: int, off: int, kv_tokens: int, gen: int, granted: bool = False
    ) -> None:
        """``rid`` (holding ``kv_tokens`` of KV, ``gen`` tokens generated) decodes from step
        ``off`` on; it finishes after ``out - gen`` more steps. ``granted``: step ``off``'s
        blocks were already taken for the others (it then owes its own until the next turn)."""
        base = kv_tokens + 1 - off
        self._base_of[rid] = base
        self.b_base[m] += base
        self.b_n[m] += 1
        seq = self._life[rid]
        heapq.heappush(self.b_heap[m], (off + self._out[rid] - gen, rid, seq))
        bt = self.kv.block_tokens
        if self.ctx.models[m].kv_bytes_per_token:
            # its blocks are exact (num_blocks(kv_tokens)), so its first new block is due at
            # the first step >= off of its residue
            q = (1 - base) % bt
            self._res[m][q][rid] = None
            if granted and off % bt == q:
                self._lag[m].append((rid, seq, off))

    # -- one turn -------------------------------------------------------------------------------
    def _turn(self, m: int) -> Generator[simpy.Event, Any, None]:
        env, mr, ws, met = self.env, self.ctx.models[m], self.ws, self.ctx.metrics
        off = self.b_off[m]
        extra = 0.0
        # 1. the decoding sequences' next block (preempting the newest while none is free)
        while self.b_n[m] and not self._grow_step(m, off):
            extra += self._preempt(m, off)
        n = self.b_n[m]
        # 2. prefill chunks of running prompts, then newly admitted ones, within the budget
        pf = self.pf[m]
        new, swapped = self._admit(m, self.max_tokens - n - sum(e[1] for e in pf))
        for rid in swapped:
            kv_tok, gen = self._swapped.pop(rid)
            if rid in self._handed:  # KV moved in from a prefill replica (sim.disagg)
                self._handed.discard(rid)
                self._start_decoding(m, rid, off, kv_tok, gen)
                continue
            self.swap_used -= kv_tok * mr.kv_bytes_per_token
            self.swap_moved += kv_tok * mr.kv_bytes_per_token
            bw = ws.links["pcie"].bandwidth
            extra += kv_tok * mr.kv_bytes_per_token / bw
            self._start_decoding(m, rid, off, kv_tok, gen, granted=True)
        n = self.b_n[m]
        self.admitted = len(new)
        woke, self._woke = self._woke, False
        self.woke = woke
        used = ws.hbm.used + self.kv.reserved
        if used > met.peak_hbm:
            met.peak_hbm = used
        resident = ws.all_resident(m)  # a pure read; nothing below changes it before a yield
        if pf or mr.is_cnn or not resident or extra > 0:
            left = self.max_tokens - n
            ptok = 0
            sq = 0.0
            ends: list[list[int]] = []
            chunks: list[tuple[list[int], int]] = []
            for ent in pf:
                if left <= 0:
                    break
                c = ent[1] if (mr.is_cnn or not self.chunked) else min(ent[1], left)
                if not self.chunked and chunks and c > left:
                    break
                p = ent[2]
                ptok += c
                sq += c * c + 2.0 * c * p
                left -= c
                chunks.append((ent, c))
                if c == ent[1]:
                    ends.append(ent)
            ctx_tok = self.b_base[m] + n * off
            t, fl, by = mr.iter_cost(ptok, sq, len(ends), n, ctx_tok)
            self.kind = iteration_kind(ptok, n)
            t += extra
            if mr.warm_on:  # warm-up costs (sim.serving.context.ModelRt.rewarm): one iteration
                if woke:
                    t += mr.wake(t)
                if ptok:
                    self._since = 0
                else:
                    t += mr.rewarm(self._since, 1)
                    self._since += 1
            carry, self._carry = self._carry, 0.0
            if ends and self.on_prefill_iter is not None:
                self.on_prefill_iter(self, [e[0] for e in ends], carry + t)
            if resident:  # _execute's all-resident case, inline (hot path)
                yield env.timeout(carry + t)
                self.busy += t
                met.busy += t
                c = mr.n_chunks
                self._hits_mv[0] += c
                self._cum_mv[m][1] += c
                met.accesses += c
                ws.touch(m, env.now)
                spent = t
            else:
                t0, lent = env.now, self._lent
                yield from self._execute(m, t, n + len(chunks), carry)
                spent = env.now - t0 - (self._lent - lent)  # [streams] less the time lent
            self.tok_s += (ptok + n) * spent
            self.flops += fl
            self.hbm_read += by
            self.iterations += 1
            self._quantum += 1
            off += 1
            self.b_off[m] = off
            now = env.now
            first = met.first
            for ent, c in chunks:
                ent[1] -= c
                ent[2] += c
            if self.prefix is not None and chunks:  # [prefix caching] computed blocks
                self.prefix.computed(m, chunks)
            for ent in ends:
                rid = ent[0]
                pf.remove(ent)
                v = first[rid]
                if v != v:  # NaN: no first token yet
                    first[rid] = now
                # the prefill samples one token (a CNN: its first pass; it then runs one pass
                # per step for its remaining `output_tokens`, as the model has always charged)
                gen = self._gen.pop(rid, 0) + 1
                if gen >= self._out[rid]:
                    self._finish(m, rid, now)
                    continue
                if self.role == "prefill" and self.on_prefilled is not None:
                    self.release(m, rid)
                    self.on_prefilled(self, m, rid, ent[2], gen)
                    continue
                self._start_decoding(m, rid, off, ent[2], gen)
        else:
            # invariant: a model is picked only with work that can run (_runnable), and the
            # one whose blocks the first step needed was preempted only for a fitting restart
            assert n > 0, f"replica {self.idx}: model {m} picked with nothing to run"
            k = self.b_heap[m][0][0] - off
            if self.qlen or self._others_running(m):
                k = min(k, max(self.max_steps - self._quantum, 1))
            k = self._fit_steps(m, off, k)
            self.kind = iteration_kind(0, n)
            t_step, fl, by = mr.iter_cost(0, 0.0, 0, n, self.b_base[m] + n * (off + (k - 1) / 2.0))
            if mr.warm_on:  # spread over the k steps (an interrupted segment pays its share)
                t_step += (mr.rewarm(self._since, k) + (mr.wake(t_step) if woke else 0.0)) / k
            if self._carry > 0:  # the interrupted step still has to finish
                carry, self._carry = self._carry, 0.0
                yield env.timeout(carry)
            t0 = env.now
            self.seg_model = m
            try:
                yield env.timeout(k * t_step)
                steps = k
            except simpy.Interrupt as intr:
                if intr.cause is not None:  # a kill, not an arrival: leave the process
                    raise
                steps = min(k, int((env.now - t0) / t_step) + 1)
                rest = max(t0 + steps * t_step - env.now, 0.0)
                if steps == k:  # completions are due at that boundary: wait for it here
                    yield env.timeout(rest)
                else:  # nothing completes: the next iteration starts after `rest` (one event)
                    self._carry = rest
            self.seg_model = -1
            self._grow_steps(m, off + 1, off + steps)  # the blocks of the steps that ran
            if mr.warm_on:
                self._since += steps
            self._quantum += steps
            self.b_off[m] = off = off + steps
            self.busy += steps * t_step
            met.busy += steps * t_step
            self.tok_s += n * steps * t_step
            self.flops += fl * steps
            self.hbm_read += by * steps
            self.iterations += steps
            c = mr.n_chunks * steps
            self._hits_mv[0] += c
            self._cum_mv[m][1] += c
            met.accesses += c
            ws.touch(m, env.now)
        self._complete(m, off)

    def release(self, m: int, rid: int) -> None:
        """Drop running sequence ``rid`` (not decoding) without finishing it: free its blocks
        and close its per-request counters (a prefill replica handing it off)."""
        bpt = self.ctx.models[m].kv_bytes_per_token
        if bpt and rid in self.kv.seqs:
            self.kv.give(rid, bpt)
        del self._order[m][rid]
        del self._life[rid]
        self.running -= 1
        row = self.ctx.metrics.acc[rid]  # a view: add in place
        row += self.cum[m]

    def accept_kv(self, rid: int, m: int, kv_tokens: int, generated: int) -> None:
        """Queue ``rid`` whose ``kv_tokens`` of KV arrived from a prefill replica
        (``generated`` tokens sampled there): admitted like a swapped-in sequence (its blocks
        taken, no prefill, no PCIe copy), it decodes from the next iteration."""
        self._swapped[rid] = (kv_tokens, generated)
        self._handed.add(rid)
        self.submit(rid, m)

    def _others_running(self, m: int) -> bool:
        b_n = self.b_n
        return len(b_n) > 1 and any(b for i, b in enumerate(b_n) if i != m)

    def _finish(self, m: int, rid: int, now: float) -> None:
        """``rid`` is done: release its blocks, close its counters, record it."""
        ctx = self.ctx
        met = ctx.metrics
        kv = self.kv
        kv.step = self.b_off[m]
        kv.finish(rid, ctx.models[m].kv_bytes_per_token)
        del self._order[m][rid]
        del self._life[rid]
        self.running -= 1
        met.end[rid] = now
        row = met.acc[rid]  # a view: add in place
        row += self.cum[m]
        met.finish(rid, DONE)
        ctx.trace.rec(now, EV_DONE, rid, self.idx)
        if self.on_unload is not None:
            self.on_unload(self)
        if ctx.on_complete is not None:
            ctx.on_complete(rid)

    def _complete(self, m: int, off: int) -> None:
        heap = self.b_heap[m]
        if not heap or heap[0][0] > off:
            return
        now = self.env.now
        life = self._life
        res, bt = self._res[m], self.kv.block_tokens
        while heap and heap[0][0] <= off:
            _, rid, seq = heapq.heappop(heap)
            if life.get(rid) != seq:
                continue  # preempted since: an entry of an older life
            self.b_n[m] -= 1
            base = self._base_of.pop(rid)
            self.b_base[m] -= base
            res[(1 - base) % bt].pop(rid, None)
            self._finish(m, rid, now)
        if self.b_n[m] == 0:
            self.b_base[m] = 0.0

    # -- one iteration ---------------------------------------------------------------------------
    def _execute(
        self, m: int, t: float, nb: int, carry: float = 0.0
    ) -> Generator[simpy.Event, Any, None]:
        """One iteration of compute ``t`` for a batch of ``nb``, after ``carry`` seconds that
        finish an interrupted decode step (already accounted as busy)."""
        if self.ws.all_resident(m):
            yield self.env.timeout(carry + t)
            self.busy += t
            met = self.ctx.metrics
            met.busy += t
            c = self.ctx.models[m].n_chunks
            self._hits_mv[0] += c
            self._cum_mv[m][1] += c
            met.accesses += c
            self.ws.touch(m, self.env.now)
        else:
            if carry > 0:
                yield self.env.timeout(carry)
            yield from self._layers(m, t, nb)

    def _layers(self, m: int, t_total: float, nb: int) -> Generator[simpy.Event, Any, None]:
        env, ws, mr = self.env, self.ws, self.ctx.models[m]
        met = self.ctx.metrics
        cum = self.cum[m]
        share = 1.0 / max(nb, 1)

        def charge(tier: int, count: int, nbytes: int) -> None:
            met.tier_hits[tier] += count
            met.tier_bytes[tier] += nbytes
            cum[1 + tier] += count
            cum[1 + _NT + tier] += nbytes * share

        t_start, lent = env.now, self._lent
        wait = 0.0
        log = met.layer_log
        counts = ws.counts[m]
        for layer in range(mr.n_layers):
            dt = t_total * float(mr.layer_frac[layer])
            nch = mr.layer_chunks[layer]
            if nch:
                # each chunk of the layer is accessed once, now: a hit if resident in HBM
                hit = counts[layer]
                met.tier_hits[0] += hit
                cum[1] += hit
                met.accesses += nch
                # hold_pins (the real engine's order): fetch the layer, pin it, then plan the
                # prefetch, so the prefetch overlaps the compute only; else plan first
                early = self._window and not self.hold_pins
                pf = self._prefetch(m, layer, charge) if early else []
                # the engine's rule: resident chunks pinned first, demand chunks as they land
                held: list[int] = []
                ws.pin_resident(m, layer, held)
                while len(held) < nch:
                    ev = ws.fetch(m, layer, ws.missing(m, layer), 0, charge, pin_into=held)
                    if ev is None:  # cannot happen: a missing chunk is in HBM or in flight
                        raise AssertionError(
                            f"layer {layer} of model {m} neither resident nor in flight"
                        )
                    if self._stream is not None and self._stream[m]:  # [streams] lend the SMs
                        yield from lend(self, ev)
                    t0 = env.now
                    ok = yield ev
                    if ok is False:  # a link on the path dropped: back off, then retry
                        met.fetch_retries += 1
                        yield env.timeout(FETCH_RETRY_S)
                    wait += env.now - t0
                    ws.pin_resident(m, layer, held)  # chunks an earlier prefetch brought
                if log is not None:
                    arrived = max(
                        (
                            ws.arrived_at.get(mr.base | c, -1.0)
                            for c in range(
                                int(mr.layer_start[layer]), int(mr.layer_start[layer + 1])
                            )
                        ),
                        default=-1.0,
                    )
                    log.append((env.now, self.idx, m, layer, arrived))
                if self._window:
                    lo, hi = int(mr.layer_start[layer]), int(mr.layer_start[layer + 1])
                    self._heat.record([mr.base | c for c in range(lo, hi)], env.now)
                if self._window and self.hold_pins:
                    pf = self._prefetch(m, layer, charge)
                yield env.timeout(dt)
                if self.hold_pins and pf:  # the real engine's rule (engine.runtime, hold_pins)
                    t0 = env.now
                    yield simpy.AllOf(env, pf)
                    wait += env.now - t0
                ws.unpin(held)
            elif dt > 0:
                yield env.timeout(dt)
        ws.touch(m, env.now)
        spent = env.now - t_start - (self._lent - lent)
        self.busy += spent
        met.busy += spent
        met.param_wait += wait
        cum[0] += wait

    def _prefetch(self, m: int, layer: int, charge: Any) -> list[simpy.Event]:
        """Plan the next ``window`` layers (wrapping into the next iteration) with the shared
        :class:`engine.prefetch.PrefetchPlanner` and start one fetch per planned layer, nearest
        first (priority = distance in layers; R7/R27)."""
        ws, mr = self.ws, self.ctx.models[m]
        base, ls, nl = mr.base, mr.layer_start, mr.n_layers
        layers = [(layer + d) % nl for d in range(1, self._window + 1)]
        upcoming = [[base | c for c in range(int(ls[j]), int(ls[j + 1]))] for j in layers]
        plan = self._planner.plan(upcoming, ws.hbm, ws.inflight_keys, self.env.now)
        by_dist: dict[int, list[int]] = {}
        for dist, key in plan:
            by_dist.setdefault(dist, []).append(int(key) & 0xFFFFFFFF)  # type: ignore[call-overload]
        issued: list[simpy.Event] = []
        for dist in sorted(by_dist):
            ev = ws.fetch(m, layers[dist], by_dist[dist], dist + 1, charge)
            if ev is not None:
                issued.append(ev)
        return issued
