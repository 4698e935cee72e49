"""Run a workload on the real engine in real time and record every request.

:class:`Engine` serves requests that arrive at given times (seconds after the start) with
continuous batching by the replica scheduler the simulator's replicas use
(:class:`engine.sched.scheduler.Scheduler`, ``docs/design/replica-scheduler.md``): each
*iteration* runs the batch its ``schedule()`` returns -- the running sequences' new KV blocks
taken (preempting the most recently admitted while they do not fit: recompute, the preempted
request prefills its prompt and generated tokens again later), what fits admitted, the prompts'
prefill and one decode step per decoding sequence -- then hands it back to ``complete()``. The
iteration runs every layer once: fetch the layer's weights (prefetching the next ``window``
layers on a background thread), run the prefill part (each prompt gets its first token) and
the decode part (one more token for every decoding request). A request is done when it has
``output_tokens`` tokens; a dense (no-KV) model produces its one output in the iteration that
runs its input. The simulator's replica runs the same scheduler, so both form the same
batches for the same arrivals.

Records (:meth:`EngineResult.frame`) have the columns of the simulator's ``requests.parquet``
(:func:`sim.serving.metrics.requests_frame`): arrival, start, first_token, end, tokens, status,
``param_wait_s`` and ``hits_<tier>`` / ``bytes_<tier>``. Per-request counters follow the
simulator's rule: a request adds up the counters of every iteration it took part in; bytes
fetched in an iteration are split evenly over that iteration's batch.

Clock: :class:`~engine.runtime.clock.RunClock` from the run's start (wall time, or wall time
minus the engine thread's waits for a CPU); it is handed as ``now`` to the weights (caches)
and the prefetcher, never read by policy code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from engine import backend
from engine.config import PrefetchCfg
from engine.kv.admission import IterationKind, iteration_kind
from engine.runtime.clock import RunClock
from engine.runtime.heap import keep_freed_memory
from engine.runtime.model import DecoderModel, DenseModel, unpack
from engine.runtime.prefetcher import Prefetcher
from engine.runtime.weights import TIER_NAMES, TieredWeights, WeightSource
from engine.sched.scheduler import Batch, BatchRecord, Scheduler

__all__ = ["Engine", "EngineResult", "EngineWorkload", "IterationRecord"]

_NT = len(TIER_NAMES)
SPIN_S = 0.003  # the last seconds before an arrival are spun, not slept


@dataclass
class EngineWorkload:
    """Requests (arrival order): arrival seconds, prompt and output lengths; ``seed`` draws
    each prompt's token ids (request ``i`` from ``default_rng([seed, i])``)."""

    arrival: np.ndarray
    inp: np.ndarray
    out: np.ndarray
    seed: int = 0

    @property
    def n(self) -> int:
        return int(self.arrival.shape[0])


class IterationRecord(NamedTuple):
    """One engine iteration: when it started and how long it took (run-clock seconds), what
    it computed (new prompts, their tokens and sum of squared lengths -- causal attention's
    work --, the decode batch and its total context tokens) and its parameter wait."""

    start: float
    seconds: float
    new: int
    prompt_tokens: int
    prompt_sq_tokens: int
    decode_batch: int
    decode_context: int
    param_wait: float
    #: :func:`engine.kv.admission.iteration_kind` of the iteration
    kind: IterationKind = "decode"
    #: when the iteration became due: the arrival check its batch was scheduled after, or,
    #: when the engine idled before it, the arrival it woke for (run-clock seconds)
    due: float = math.nan
    #: the engine's next arrival check after it (arrivals after it wait for the next
    #: iteration); the last iteration's own end. A replay charges ``settled - due``
    settled: float = math.nan


@dataclass
class EngineResult:
    """Per-request arrays plus run totals (``tier_hits``/``tier_bytes`` like the simulator's)."""

    arrival: np.ndarray
    start: np.ndarray
    first: np.ndarray
    end: np.ndarray
    status: np.ndarray  # 1 done, 3 rejected
    acc: np.ndarray  # [n, 1 + 2 * tiers]: param wait, hits per tier, bytes per tier
    inp: np.ndarray
    out: np.ndarray
    tier_hits: np.ndarray
    tier_bytes: np.ndarray
    wall_s: float
    busy_s: float
    param_wait_s: float
    iterations: int
    clock_excludes_cpu_wait: bool = False
    #: sequences preempted (recompute) because the KV blocks ran out
    preemptions: int = 0
    #: one row per iteration: the shapes the simulator's cost model charges
    iteration_log: list[IterationRecord] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logits: list[list[np.ndarray]] = field(default_factory=list)
    #: the scheduler's batch log (:attr:`Scheduler.batch_log`) when it kept one, else None
    batch_log: list[BatchRecord] | None = None

    def frame(self, model: str, cls: str = "normal") -> Any:
        """The records as a pandas DataFrame in the simulator's schema."""
        import pandas as pd

        n = self.arrival.shape[0]
        df = pd.DataFrame(
            {
                "request_id": np.arange(n, dtype=np.int64),
                "model": pd.Categorical([model] * n),
                "cls": pd.Categorical([cls] * n),
                "arrival": self.arrival,
                "start": self.start,
                "first_token": self.first,
                "end": self.end,
                "input_tokens": self.inp.astype(np.int32),
                "output_tokens": self.out.astype(np.int32),
                "status": pd.Categorical.from_codes(
                    self.status.astype(np.int64), categories=["pending", "done", "shed", "rejected"]
                ),
                "node": np.zeros(n, dtype=np.int32),
                "param_wait_s": self.acc[:, 0],
            }
        )
        for i, t in enumerate(TIER_NAMES):
            df[f"hits_{t}"] = self.acc[:, 1 + i]
        for i, t in enumerate(TIER_NAMES):
            df[f"bytes_{t}"] = self.acc[:, 1 + _NT + i]
        return df


class Engine:
    """One engine node: a model, its weights, a scheduler, an optional prefetch window.

    ``model`` is a :class:`DecoderModel` or :class:`DenseModel`; ``scheduler`` a one-model
    :class:`~engine.sched.scheduler.Scheduler` (:meth:`Scheduler.single`), whose hooks the
    engine is while it runs. ``weights`` is any
    :class:`WeightSource`; with :class:`TieredWeights` hits/bytes are counted and, when
    ``window > 0``, a :class:`Prefetcher` fetches ahead. ``keep_logits`` stores every logits
    row (tests compare runs with it). ``hold_pins``: a layer stays pinned until the prefetches
    planned at its start have landed (deterministic victims whatever the threads' timing;
    else they land when the copy thread gets to them). ``exclude_cpu_wait``: the run's clock
    leaves out time the engine thread waited for a CPU (:class:`~engine.runtime.clock.RunClock`).
    ``prefetch``: the simulator's config section (:class:`engine.config.PrefetchCfg`); when
    given it sets ``window`` (``window_batches``, 0 when disabled), ``hold_pins`` (order
    ``after-pin``) and the heat map's half-life, and ``window``/``hold_pins`` must be left out.
    """

    def __init__(
        self,
        model: DecoderModel | DenseModel,
        weights: WeightSource,
        scheduler: Scheduler,
        *,
        window: int = 0,
        keep_logits: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        hold_pins: bool = False,
        exclude_cpu_wait: bool = False,
        prefetch: PrefetchCfg | None = None,
    ) -> None:
        self.heat_half_life = PrefetchCfg().heat_half_life
        if prefetch is not None:
            if window or hold_pins:
                raise ValueError("give either prefetch (a PrefetchCfg) or window/hold_pins")
            window = prefetch.window_batches if prefetch.enabled else 0
            hold_pins = prefetch.order == "after-pin"
            self.heat_half_life = prefetch.heat_half_life
        self.model = model
        self.weights = weights
        self.sched = scheduler
        self.window = window
        self.keep_logits = keep_logits
        self._sleep = sleep
        self.hold_pins = hold_pins
        self.on_iteration: Callable[[IterationRecord], None] | None = None
        self.exclude_cpu_wait = exclude_cpu_wait
        self.xp = model.xp
        self.layouts = [model.cfg.layout(i) for i in range(model.cfg.n_layers)]
        if isinstance(model, DecoderModel):
            scheduler.bind(model.kv)  # block tables in the model's allocator (its KV storage)
        else:
            scheduler.dense[0] = True  # whole inputs, outside the token budget
        #: requests the scheduler finished in the current iteration
        self._done: list[int] = []
        #: when the iteration about to run became due (IterationRecord.due), and the arrival
        #: the engine last idled until (NaN: it has not idled since the last iteration)
        self._due = math.nan
        self._woke_for = math.nan

    # -- the run ------------------------------------------------------------------------------
    def run(self, wl: EngineWorkload) -> EngineResult:
        """Serve ``wl`` in real time; returns when every request is done or rejected.
        Fixes the process's allocator regime first (:func:`keep_freed_memory`)."""
        keep_freed_memory()
        n = wl.n
        run_clock = RunClock(self.exclude_cpu_wait)
        self.run_clock = run_clock
        clock = run_clock
        self.clock = clock
        res = EngineResult(
            arrival=wl.arrival.astype(np.float64).copy(),
            start=np.full(n, np.nan),
            first=np.full(n, np.nan),
            end=np.full(n, np.nan),
            status=np.zeros(n, dtype=np.int8),
            acc=np.zeros((n, 1 + 2 * _NT)),
            inp=wl.inp.copy(),
            out=wl.out.copy(),
            tier_hits=np.zeros(_NT),
            tier_bytes=np.zeros(_NT),
            wall_s=0.0,
            busy_s=0.0,
            param_wait_s=0.0,
            iterations=0,
            tokens=[[] for _ in range(n)],
            logits=[[] for _ in range(n)],
        )
        self.res = res
        self.cum = np.zeros(1 + 2 * _NT)
        self._share = 1.0
        self._prompts = [
            np.random.default_rng([wl.seed, i]).integers(0, self._vocab(), int(wl.inp[i]))
            for i in range(n)
        ]
        tw = self.weights if isinstance(self.weights, TieredWeights) else None
        if tw is not None:
            tw.on_charge = self._charge
        pf = (
            Prefetcher(tw, self.window, clock, half_life=self.heat_half_life)
            if tw is not None and self.window > 0
            else None
        )
        self.prefetcher = pf
        if pf is not None:
            pf.start()
        sched = self.sched
        sched.set_requests([int(x) for x in wl.inp], [int(x) for x in wl.out], [0] * n)
        sched.hooks = self
        seq = [int(a) + int(b) for a, b in zip(wl.inp, wl.out, strict=False)]
        nxt = 0
        final = 0
        self._woke_for = float(wl.arrival[0]) if n else math.nan  # a run starts idle
        try:
            while final < n:
                check = self._settle(clock())
                nxt, rejected = self._arrive(wl, nxt, check, seq)
                final += rejected
                if not sched.num_running and not sched.num_waiting:
                    if nxt < n:
                        self._woke_for = float(wl.arrival[nxt])
                        self._wait_until(self._woke_for, clock)
                    continue
                batch = sched.schedule(0)
                for rid in batch.preempted:  # preempted (recompute): counters close
                    res.acc[rid] += self.cum
                if not batch.chunks and not batch.num_decodes:
                    continue  # cannot happen (fits_alone); guards an endless loop
                now = clock()
                for rid in batch.admitted:
                    if res.start[rid] != res.start[rid]:  # NaN: first admission
                        res.start[rid] = now
                    res.acc[rid] -= self.cum
                self._become_due(check)
                final += self._iteration(batch)
        finally:
            end_clock = clock()  # before close(): a closed clock no longer subtracts waits
            self._settle(math.nan)
            run_clock.close()
            if pf is not None:
                pf.stop()
            if tw is not None:
                tw.on_charge = None
            sched.hooks = None
        res.wall_s = end_clock
        res.preemptions = self.sched.kv.preemptions
        res.batch_log = list(sched.batch_log) if sched.batch_log is not None else None
        res.clock_excludes_cpu_wait = run_clock.exclude_cpu_wait
        return res

    def _arrive(self, wl: EngineWorkload, nxt: int, now: float, seq: list[int]) -> tuple[int, int]:
        """Submit the requests from ``nxt`` on that have arrived by ``now``, marking those
        whose whole sequence can never fit rejected (status 3); returns the next request
        still to arrive and how many were rejected."""
        rejected = 0
        while nxt < wl.n and wl.arrival[nxt] <= now:
            if self.sched.fits_alone(seq[nxt]):
                self.sched.add_request(nxt)
            else:
                self.res.status[nxt] = 3
                rejected += 1
            nxt += 1
        return nxt, rejected

    def _settle(self, check: float) -> float:
        """An arrival check at run-clock ``check``: the first after an iteration settles it
        (:attr:`IterationRecord.settled`); at the run's end (``check`` NaN) the last one
        settles at its own end. Returns ``check``."""
        log = self.res.iteration_log
        if log and log[-1].settled != log[-1].settled:  # NaN: not settled yet
            last = log[-1]
            when = check if check == check else last.start + last.seconds
            log[-1] = last._replace(settled=when)
        return check

    def _become_due(self, check: float) -> None:
        """The iteration about to run was scheduled after the arrival check ``check``; it
        became due then, or at the arrival the engine idled until before it."""
        woke = self._woke_for
        self._due = check if woke != woke else min(woke, check)
        self._woke_for = math.nan

    def _wait_until(self, t: float, clock: Callable[[], float]) -> None:
        """Idle until ``t``: sleep, then spin the last ``SPIN_S`` (a sleeping thread wakes
        late on a busy machine, and that lateness would add to every request's latency)."""
        dt = t - clock()
        if dt > SPIN_S:
            self._sleep(dt - SPIN_S)
        while clock() < t:
            pass

    def _vocab(self) -> int:
        cfg = self.model.cfg
        return int(getattr(cfg, "vocab", 1 << 16))

    def _charge(self, tier: int, count: int, nbytes: int) -> None:
        self.res.tier_hits[tier] += count
        self.res.tier_bytes[tier] += nbytes
        self.cum[1 + tier] += count
        self.cum[1 + _NT + tier] += nbytes * self._share

    # -- one iteration ------------------------------------------------------------------------
    # -- the scheduler's hooks (SchedulerHooks) -------------------------------------------------
    def on_admit(self, m: int, rid: int) -> None:
        """Admissions are recorded from the batch (:meth:`run`)."""

    def on_preempt(self, m: int, rid: int) -> None:
        """Preemptions are recorded from the batch (:meth:`run`)."""

    def on_first_token(self, rid: int) -> None:
        """First tokens are recorded when sampled (:meth:`_iteration`)."""

    def on_finish(self, m: int, rid: int) -> None:
        """``rid`` finished in the current iteration."""
        self._done.append(rid)

    def hands_off(self) -> bool:
        """The engine keeps every request to its end."""
        return False

    def on_handoff(self, m: int, rid: int, kv_tokens: int, generated: int) -> None:
        raise AssertionError("the engine never hands a request off")

    # -- one iteration ------------------------------------------------------------------------
    def _iteration(self, batch: Batch) -> int:
        """Run ``batch`` (its prompts' prefill, one decode step of every decoding request);
        returns how many completed."""
        res, sched = self.res, self.sched
        new = [p.request_id for p, _ in batch.chunks]
        running = sched.decoding(0)
        self._share = 1.0 / max(len(running) + len(new), 1)
        t_start = self.clock()
        state, plens = self._begin(new, running)
        state, wait = self._layers(state)
        computed = self.clock()
        if isinstance(self.weights, TieredWeights):
            self.weights.touch(computed)  # the caches see the compute's end (the simulator's)
        ctx = sum(len(self._prompts[r]) + len(res.tokens[r]) for r in running)
        firsts = self._sample(state, new, running)
        # A token exists once it is sampled: the iteration (and its requests' first-token and
        # end times) ends after the sampling, which the engine probe then measures too.
        now = self.clock()
        for r in firsts:
            res.first[r] = now
        record = IterationRecord(
            t_start,
            now - t_start,
            len(new),
            sum(plens),
            sum(p * p for p in plens),
            len(running),
            ctx,
            wait,
            iteration_kind(sum(plens), len(running)),
            self._due,
        )
        res.iteration_log.append(record)
        if self.on_iteration is not None:
            self.on_iteration(record)
        res.iterations += 1
        res.busy_s += now - t_start
        res.param_wait_s += wait
        self.cum[0] += wait
        done = self._done
        done.clear()
        sched.complete(batch)  # finished requests free their blocks in the model's allocator
        for r in done:
            res.end[r] = now
            res.status[r] = 1
            res.acc[r] += self.cum
        return len(done)

    def _begin(self, new: list[int], running: list[int]) -> tuple[Any, list[int]]:
        """The iteration's input state (prefills of ``new``, decodes of ``running``) and the
        tokens each of ``new`` prefills."""
        if isinstance(self.model, DecoderModel):
            prefill = [(r, self._prefill_tokens(r)) for r in new]
            decode = [(r, self.res.tokens[r][-1]) for r in running]
            pos = [self.sched.num_computed_tokens(0, r) for r in running]
            state = self.model.begin(prefill, decode, positions=pos)
            return state, [len(toks) for _, toks in prefill]
        width = self.model.cfg.widths[0]
        rows = [np.random.default_rng([7, r]).standard_normal(width) for r in new]
        state = self.xp.asarray(np.asarray(rows, dtype=np.float32))
        return state, [len(self._prompts[r]) for r in new]

    def _layers(self, state: Any) -> tuple[Any, float]:
        """Run every layer over ``state``, each with its weights pinned until it is done;
        returns the state after the last layer and the time spent waiting for weights."""
        wait = 0.0
        pf = self.prefetcher
        for layer in range(self.model.cfg.n_layers):
            t = self.clock()
            flat = self.weights.layer(layer, t)  # pinned until release(): never a victim
            wait += self.clock() - t
            if pf is not None:
                # After the pin, as in the simulator (its prefetches land while the current
                # layer computes, pinned), so prefetch admissions evict the same victims.
                pf.plan_from(layer)
            w = unpack(self.layouts[layer], flat, self.xp)
            if isinstance(self.model, DecoderModel):
                self.model.run_layer(state, layer, w)
            else:
                state = self.model.run_layer(state, layer, w)
            if pf is not None and self.hold_pins:
                wait += self._hold_for_prefetches(pf)
            self.weights.release(layer)
        return state, wait

    def _hold_for_prefetches(self, pf: Prefetcher) -> float:
        """Wait (the current layer still pinned) until the prefetches planned at it have
        landed, so they evict the same victims whatever the threads' timing; returns the
        wait, which counts as parameter wait.

        While blocked here, the copy thread's own waits for a CPU are the machine's business,
        not the engine's: the run clock leaves them out."""
        t, w0, p0 = self.clock(), pf.cpu_wait(), time.perf_counter()
        pf.wait_idle()
        # run-queue time is booked when the thread gets the CPU back, so it may include a
        # wait begun before this block: never exclude more than the block
        blocked = time.perf_counter() - p0
        self.run_clock.exclude(min(pf.cpu_wait() - w0, blocked))
        return self.clock() - t

    def _sample(self, state: Any, new: list[int], running: list[int]) -> list[int]:
        """Append each request's next token (greedy) from the iteration's logits; returns
        the requests that got their first token."""
        res, xp = self.res, self.xp
        if isinstance(self.model, DecoderModel):
            outs = [(r, state.logits_p, i) for i, r in enumerate(new)]
            outs += [(r, state.logits_d, i) for i, r in enumerate(running)]
        else:
            outs = [(r, state, i) for i, r in enumerate(new)]
        firsts: list[int] = []
        for r, logits, i in outs:
            row = logits[i]
            res.tokens[r].append(int(xp.argmax(row)))
            if self.keep_logits:
                res.logits[r].append(backend.to_numpy(row).copy())
            if len(res.tokens[r]) == 1:
                firsts.append(r)
        return firsts

    def _prefill_tokens(self, r: int) -> np.ndarray:
        """What request ``r`` prefills: its prompt, then the tokens it generated before a
        recompute preemption."""
        gen = self.res.tokens[r]
        if not gen:
            return self._prompts[r]
        return np.concatenate([self._prompts[r], np.asarray(gen, dtype=self._prompts[r].dtype)])
