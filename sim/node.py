"""A compute node: ONE long-lived SimPy process doing continuous batching, layer by layer.

Per model the node keeps one running batch. Batch state is O(1) to advance: ``off`` counts the
decode steps the batch has taken; a request whose first token came at step ``a`` finishes at
step ``a + out - 1`` (a min-heap of those targets), and the batch's total context is
``base + n * off``. One *iteration* = prefill of newly admitted requests plus one decode step
of the others. When no request was admitted and every weight of the model is resident in HBM,
nothing can change until the next completion, so the node runs ``k`` decode steps as ONE
timeout (``k`` = steps to the next completion, capped by ``max_steps_per_turn`` when other
models wait) using the mean context over the ``k`` steps. An arrival that could join the node
interrupts that timeout; the node then finishes the step in progress and re-plans.

Otherwise the iteration runs layer by layer (:meth:`ComputeNode._layers`): a layer computes
only once all its chunks are resident in HBM (invariant; pinned while it computes), missing
chunks are fetched as one aggregated transfer per source, and the next ``window`` layers are
prefetched while the current one computes (R7/R21/R27), wrapping into the next iteration.

Warm-up costs (off unless the model's cost model sets them, e.g. a calibrated engine's
:class:`hwbench.engine_probe.EngineCostModel`): the first iteration after the node sat idle
costs ``wake_s`` more, less ``wake_hide`` times its own compute (cold caches, clocks ramping
up; a long prefill's compute hides part of it), and the ``j``-th decode step after an
iteration that admitted prompts costs ``rewarm_s * rewarm_decay ** (j - 1)`` more (the
prefill evicted the decode's working set from the caches); :meth:`ModelRt.rewarm`.

KV accounting is :class:`KvAccount` (block counts in bytes, reserved for the whole sequence
at admission so a running request never stalls). It is an adapter: the KV core's allocator
can replace it without touching the node.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from engine.kv.allocator import KVBlockAllocator
from engine.prefetch import HeatMap, PrefetchPlanner
from sim.context import SimContext
from sim.metrics import DONE, EV_ADMIT, EV_DONE, N_ACC, TIERS
from sim.weights import WeightStore

_NT = len(TIERS)
#: wait before re-requesting chunks whose transfer failed (a dropped link; faults)
FETCH_RETRY_S = 1e-3


class KvAccount:
    """KV cache accounting of one node: bytes reserved in whole blocks of ``block_tokens``.

    With ``allocators`` (one :class:`engine.kv.allocator.KVBlockAllocator` per model, or
    ``None`` for models without KV), every reservation is also a real block-table allocation
    in the KV core's allocator (block ids only, no bytes), so the simulator exercises the same
    allocator as the engine; the byte total here bounds all models' pools together.

    Invariant: ``0 <= reserved <= capacity``; ``needed <= reserved`` (tokens actually held).
    """

    def __init__(
        self, capacity: int, block_tokens: int, allocators: list[Any] | None = None
    ) -> None:
        self.capacity = capacity
        self.block_tokens = block_tokens
        self.reserved = 0
        self.needed = 0
        self.allocators = allocators

    def size(self, tokens: int, bytes_per_token: int) -> tuple[int, int]:
        """(reserved bytes in whole blocks, exact bytes) for a ``tokens``-token sequence."""
        bt = self.block_tokens
        return -(-tokens // bt) * bt * bytes_per_token, tokens * bytes_per_token

    def can(self, nbytes: int) -> bool:
        return self.reserved + nbytes <= self.capacity

    def take(self, nbytes: int, exact: int, rid: int = -1, m: int = 0, tokens: int = 0) -> None:
        allocs = self.allocators
        if allocs is not None and (a := allocs[m]) is not None:
            a.allocate(rid, tokens)
        self.reserved += nbytes
        self.needed += exact

    def give(self, nbytes: int, exact: int, rid: int = -1, m: int = 0) -> None:
        allocs = self.allocators
        if allocs is not None and (a := allocs[m]) is not None:
            a.free(rid)
        self.reserved -= nbytes
        self.needed -= exact

    def fragmentation(self) -> float:
        """Internal fragmentation of the reserved blocks (0 when nothing is reserved)."""
        return 1.0 - self.needed / self.reserved if self.reserved else 0.0


class ComputeNode:
    """One GPU node; see the module docstring. ``submit`` hands it a request id."""

    def __init__(
        self,
        ctx: SimContext,
        idx: int,
        name: str,
        weights: WeightStore,
        kv_bytes: int,
        wl: Any,
        tokens: tuple[list[int], list[int], list[int]] | None = None,
    ) -> None:
        """``tokens``: ``(wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())``, shared by all
        nodes of a cluster (plain ints read faster than numpy scalars); built here if not given."""
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
        self.max_batch = sc.cluster.node.max_batch
        self.max_tokens = sc.cluster.node.max_batch_tokens
        self.max_steps = sc.cluster.node.max_steps_per_turn
        self.queues: list[list[deque[int]]] = [[deque() for _ in range(nc)] for _ in range(nm)]
        self.qlen = 0
        self.running = 0
        self.b_n = [0] * nm
        self.b_off = [0] * nm
        self.b_base = [0.0] * nm
        self.b_heap: list[list[tuple[int, int]]] = [[] for _ in range(nm)]
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
        self.kv = KvAccount(kv_bytes, sc.kv.block_tokens, allocs)
        self._kv_of: dict[int, tuple[int, int]] = {}
        self.wake: simpy.Event | None = None
        self.seg_model = -1
        self._up_watchers: list[Callable[[], None]] = []
        self._up = True
        self.busy = 0.0
        #: requests the running turn admitted (0: a decode-only iteration); set at the turn's
        #: start, before its compute, so hooks on the iteration (hwbench.interference) see it
        self.admitted = 0
        #: the running turn follows an idle spell (the node waited for a request); set with
        #: ``admitted``
        self.woke = False
        #: warm-up state (models whose cost model charges it, ModelRt.warm_on): the node sat
        #: idle before this turn; decode steps since the last iteration that admitted prompts
        self._woke = False
        self._since = 1 << 30
        self.proc: simpy.Process | None = None
        self._cur = -1
        self._carry = 0.0
        self._quantum = 0
        self._window = sc.prefetch.window_batches if sc.prefetch.enabled else 0
        #: the real engine's deterministic mode (set by hwbench.validate, off by default):
        #: fetch and pin a layer, then plan the next layers' prefetch, and keep the layer
        #: pinned until that prefetch has landed
        self.hold_pins = False
        self._heat = HeatMap(half_life=sc.prefetch.heat_half_life)
        self._planner = PrefetchPlanner(window_batches=max(self._window, 1), heat=self._heat)
        if tokens is None:
            tokens = (wl.inp.tolist(), wl.out.tolist(), wl.cls.tolist())
        self._inp: list[int] = tokens[0]  # per request: prompt tokens (plain ints)
        self._out: list[int] = tokens[1]  # per request: output tokens
        self._cls: list[int] = tokens[2]  # per request: class index
        self._model = wl.model

    # -- control ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or restart) the node's process."""
        self.up = True
        if self.proc is None or not self.proc.is_alive:
            self.proc = self.env.process(self._run())

    def stop(self) -> None:
        """Mark the node down: the scheduler stops sending it work (faults, issue 5)."""
        self.up = False

    @property
    def up(self) -> bool:
        """Whether the node takes work. Setting it (``start``/``stop``, faults) calls every
        watcher (the scheduler's cached live-node list)."""
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
        elif self.seg_model >= 0 and (self.seg_model != m or self.b_n[m] < self.max_batch):
            self.seg_model = -1
            assert self.proc is not None
            self.proc.interrupt()

    # -- the process ------------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        try:
            while True:
                m = self._cur  # _pick's first case, inline: the current model keeps running
                if not (m >= 0 and self._quantum < self.max_steps and self.b_n[m]):
                    m = self._pick()
                if m < 0:
                    self.wake = self.env.event()
                    yield self.wake
                    self.wake = None
                    self._woke = True
                    continue
                yield from self._turn(m)
        except simpy.Interrupt as intr:  # killed (sim.degrade.kill_node cleans the state up)
            if intr.cause != "kill":
                raise

    def _head(self, m: int) -> int:
        for c in self.ctx.class_order:
            q = self.queues[m][c]
            if q:
                return q[0]
        return -1

    def _kv_need(self, rid: int) -> tuple[int, int]:
        mr = self.ctx.models[int(self._model[rid])]
        return self.kv.size(int(self._inp[rid]) + int(self._out[rid]), mr.kv_bytes_per_token)

    def _runnable(self, m: int) -> bool:
        if self.b_n[m]:
            return True
        h = self._head(m)
        return h >= 0 and self.kv.can(self._kv_need(h)[0])

    def _pick(self) -> int:
        """The model to run next: the current one until its quantum of ``max_steps_per_turn``
        steps is used up (switching models is what evicts weights), then round-robin."""
        cur = self._cur
        if cur >= 0 and self._quantum < self.max_steps and (self.b_n[cur] or self._runnable(cur)):
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

    def _admit(self, m: int) -> list[int]:
        if not self.qlen:  # nothing queued for any model (the common case mid-batch)
            return []
        new: list[int] = []
        tokens = 0
        now = self.env.now
        ctx = self.ctx
        met, kv, inp, out, cum = ctx.metrics, self.kv, self._inp, self._out, self.cum[m]
        bpt = ctx.models[m].kv_bytes_per_token  # queues[m] holds only requests of model m
        room = self.max_batch - self.b_n[m]
        per = self.queues[m]
        for c in ctx.class_order:
            q = per[c]
            while q and len(new) < room:
                rid = q[0]
                t = inp[rid]
                total = t + out[rid]
                need, exact = kv.size(total, bpt)  # == self._kv_need(rid)
                if not kv.can(need) or (new and tokens + t > self.max_tokens):
                    return new  # head-of-line: never let a lower class overtake
                q.popleft()
                kv.take(need, exact, rid, m, total)
                self._kv_of[rid] = (need, exact)
                tokens += t
                new.append(rid)
                met.start[rid] = now
                row = met.acc[rid]  # a view: subtract in place
                row -= cum
                ctx.trace.rec(now, EV_ADMIT, rid, self.idx)
        return new

    def _turn(self, m: int) -> Generator[simpy.Event, Any, None]:
        env, mr, ws, met = self.env, self.ctx.models[m], self.ws, self.ctx.metrics
        new = self._admit(m)
        self.admitted = len(new)
        woke, self._woke = self._woke, False
        self.woke = woke
        if new:
            self.qlen -= len(new)
            self.running += len(new)
        used = ws.hbm.used + self.kv.reserved
        if used > met.peak_hbm:
            met.peak_hbm = used
        n = self.b_n[m]
        off = self.b_off[m]
        resident = ws.all_resident(m)  # a pure read; nothing below changes it before a yield
        if new or mr.is_cnn or not resident:
            ptok = sq = 0
            inp = self._inp
            xs: list[int] = []
            for rid in new:
                x = inp[rid]
                xs.append(x)
                ptok += x
                sq += x * x
            t = mr.iter_time(ptok, len(new), n, self.b_base[m] + n * off, sq)
            if mr.warm_on:  # warm-up costs (sim.context.ModelRt.rewarm): one iteration
                if woke:
                    t += mr.wake(t)
                if new:
                    self._since = 0
                else:
                    t += mr.rewarm(self._since, 1)
                    self._since += 1
            carry, self._carry = self._carry, 0.0
            if resident:  # _execute's all-resident case, inline (hot path)
                yield env.timeout(carry + t)
                self.busy += t
                met.busy += t
                c = mr.n_chunks  # == self._hbm_hits(m, mr.n_chunks)
                self._hits_mv[0] += c
                self._cum_mv[m][1] += c
                ws.touch(m, env.now)
            else:
                yield from self._execute(m, t, n + len(new), carry)
            self._quantum += 1
            off += 1
            self.b_off[m] = off
            now = env.now
            heap, out, first = self.b_heap[m], self._out, met.first
            for rid, x in zip(new, xs, strict=True):
                first[rid] = now
                heapq.heappush(heap, (off + out[rid] - 1, rid))
                self.b_base[m] += x + 1 - off
            self.b_n[m] = n + len(new)
        else:
            k = self.b_heap[m][0][0] - off
            if self.qlen or self._others_running(m):
                k = min(k, max(self.max_steps - self._quantum, 1))
            t_step = mr.iter_time(0, 0, n, self.b_base[m] + n * (off + (k - 1) / 2.0))
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
            if mr.warm_on:
                self._since += steps
            self._quantum += steps
            self.b_off[m] = off = off + steps
            self.busy += steps * t_step
            met.busy += steps * t_step
            c = mr.n_chunks * steps  # == self._hbm_hits(m, mr.n_chunks * steps)
            self._hits_mv[0] += c
            self._cum_mv[m][1] += c
            ws.touch(m, env.now)
        self._complete(m, off)

    def _others_running(self, m: int) -> bool:
        b_n = self.b_n
        return len(b_n) > 1 and any(b for i, b in enumerate(b_n) if i != m)

    def _hbm_hits(self, m: int, count: int) -> None:
        self._hits_mv[0] += count  # == ctx.metrics.tier_hits[0] += count
        self._cum_mv[m][1] += count  # == self.cum[m][1] += count

    def _complete(self, m: int, off: int) -> None:
        heap = self.b_heap[m]
        if not heap or heap[0][0] > off:
            return
        now = self.env.now
        ctx = self.ctx
        met = ctx.metrics
        cum = self.cum[m]
        acc, end, rec, give, kv_of = met.acc, met.end, ctx.trace.rec, self.kv.give, self._kv_of
        inp, out = self._inp, self._out
        while heap and heap[0][0] <= off:
            target, rid = heapq.heappop(heap)
            need, exact = kv_of.pop(rid)
            give(need, exact, rid, m)  # KvAccount.give
            self.b_n[m] -= 1
            self.running -= 1
            # its share of base was inp + 1 - a, with a = target - out + 1 (first-token step)
            self.b_base[m] -= inp[rid] + 1 - (target - out[rid] + 1)
            end[rid] = now
            row = acc[rid]  # a view: add in place
            row += cum
            met.finish(rid, DONE)
            rec(now, EV_DONE, rid, self.idx)
            if ctx.on_complete is not None:
                ctx.on_complete(rid)
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
            self.ctx.metrics.busy += t
            self._hbm_hits(m, self.ctx.models[m].n_chunks)
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

        self._hbm_hits(m, sum(ws.counts[m]))
        t_start = env.now
        wait = 0.0
        log = met.layer_log
        for layer in range(mr.n_layers):
            dt = t_total * float(mr.layer_frac[layer])
            if mr.layer_chunks[layer]:
                # hold_pins (the real engine's order): fetch the layer, pin it, then plan the
                # prefetch, so the prefetch overlaps the compute only; else plan first
                early = self._window and not self.hold_pins
                pf = self._prefetch(m, layer, charge) if early else []
                while not ws.layer_resident(m, layer):
                    ev = ws.fetch(m, layer, ws.missing(m, layer), 0, charge)
                    if ev is None:  # cannot happen: a missing chunk is in HBM or in flight
                        raise AssertionError(
                            f"layer {layer} of model {m} neither resident nor in flight"
                        )
                    t0 = env.now
                    ok = yield ev
                    if ok is False:  # a link on the path dropped: back off, then retry
                        met.fetch_retries += 1
                        yield env.timeout(FETCH_RETRY_S)
                    wait += env.now - t0
                if log is not None:
                    mr_ = self.ctx.models[m]
                    arrived = max(
                        (
                            ws.arrived_at.get(mr_.base | c, -1.0)
                            for c in range(
                                int(mr_.layer_start[layer]), int(mr_.layer_start[layer + 1])
                            )
                        ),
                        default=-1.0,
                    )
                    log.append((env.now, self.idx, m, layer, arrived))
                if self._window:
                    lo, hi = int(mr.layer_start[layer]), int(mr.layer_start[layer + 1])
                    self._heat.record([mr.base | c for c in range(lo, hi)], env.now)
                ws.pin_layer(m, layer, True)
                if self._window and self.hold_pins:
                    pf = self._prefetch(m, layer, charge)
                yield env.timeout(dt)
                if self.hold_pins and pf:  # the real engine's rule (engine.runtime, hold_pins)
                    t0 = env.now
                    yield simpy.AllOf(env, pf)
                    wait += env.now - t0
                ws.pin_layer(m, layer, False)
            elif dt > 0:
                yield env.timeout(dt)
        ws.touch(m, env.now)
        spent = env.now - t_start
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
