"""Engine probe: serve short workloads on the real engine and log its iterations.

The op tables (:mod:`hwbench.opprobe`) time single kernels. A whole engine iteration also
pays what no kernel shows: the interpreter's dispatch per layer, temporaries, the serving
loop between iterations, a cold start after an idle spell, and the copy thread's weight
reads competing with the compute. This probe serves calibration workloads on the engine
(the calibration decoder, :func:`hwbench.validation_models.decoder_config`, weights through
the tier stack, prefetcher on) and returns what :mod:`hwbench.engine_fit` fits those terms
on:

* :func:`engine_probe` -- closed runs (requests arriving together; all weights resident):
  every iteration's prefill tokens, prompts, decode batch and context, its time and its
  **overhead**, grouped by shape (:class:`PassPoint`). Every op runs through an
  :class:`hwbench.insitu_probe.OpTimer` on the model's op hook, so each iteration's op
  seconds are measured in place; its overhead is its seconds less those op seconds: the
  serving loop's batch set-up and sampling, and each layer's weight pin, tensor views and
  prefetch planning. The timer's own cost is measured on an empty op before the runs
  (:func:`hook_cost`) and taken out of both the iteration and the op seconds;
* :func:`fetch_probe` -- open-loop runs with HBM holding 60% of the weights (layers stream
  host -> device every iteration) and the same arrivals with every weight resident: the
  bytes per second the engine's copy thread achieved while the engine computed, and the
  resident runs' iteration logs (serving-loop gaps, iterations after idle).

The calibration workloads are not the validation suite's (:mod:`hwbench.workloads`): other
arrivals, other lengths, cache fractions 0.6 and 1.5 only, and the small decoder only.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from engine import backend
from engine.runtime.engine import IterationRecord
from hwbench.insitu_probe import OpTimer
from hwbench.opprobe import op_clock
from hwbench.probes import syncer
from hwbench.validation_engine import engine_for, engine_parts, run_engine, workload_for
from hwbench.workloads import ValidationWorkload

__all__ = [
    "IDLE_GAP_S",
    "PassPoint",
    "ProbeRun",
    "StreamProbe",
    "after_idle",
    "engine_probe",
    "fetch_probe",
    "hook_cost",
]


@dataclass(frozen=True)
class PassPoint:
    """Engine iterations of one shape: ``tokens`` prompt tokens prefilled (0: none) in
    ``prompts`` prompts whose squared lengths sum to ``sq_tokens`` (causal attention's work;
    the mean over the group), and one decode step of ``batch`` sequences holding ``context``
    tokens in all (``batch`` 0: none); ``mean_s`` is the mean of ``count`` measured
    iterations (a request's latency is a sum of iteration times, which converges to the mean,
    OS pauses included) and ``overhead_s`` the mean overhead (seconds outside the ops,
    measured in place; module docstring) of the ``overhead_count`` of them that did not
    follow an idle spell (:func:`after_idle`: a cold start is ``wake_s``'s), ``None`` where
    none was measured."""

    tokens: int
    batch: int
    context: int
    mean_s: float
    count: int
    prompts: int = 1
    sq_tokens: float | None = None  # None: one prompt of ``tokens`` (tokens ** 2)
    overhead_s: float | None = None
    overhead_count: int = 0  # iterations ``overhead_s`` averages (those not after idle)
    #: ``(op name, mean seconds per iteration)`` of the ops timed in place (engine names:
    #: :data:`sim.serving.opcost.iteration.OP_NAMES` and ``residual_add``); empty: not timed
    op_s: tuple[tuple[str, float], ...] = ()

    @property
    def sq(self) -> float:
        return float(self.tokens) ** 2 if self.sq_tokens is None else float(self.sq_tokens)

    def row(self) -> dict[str, float]:
        return {
            "tokens": float(self.tokens),
            "prompts": float(self.prompts),
            "sq_tokens": self.sq,
            "batch": float(self.batch),
            "context": float(self.context),
            "mean_s": self.mean_s,
            "count": float(self.count),
            "overhead_count": float(self.overhead_count),
            **{f"op_s.{name}": secs for name, secs in self.op_s},
        } | ({} if self.overhead_s is None else {"overhead_s": self.overhead_s})


#: iterations grouped by shape (see :func:`_collect`): (seconds, sum of squared prompt lengths,
#: overhead seconds)
Groups = dict[tuple[int, int, int, int], list[tuple[float, float, float]]]

#: probe runs: (requests arriving together, prompt tokens each, output tokens each)
QUICK_RUNS: tuple[tuple[int, int, int], ...] = (
    (1, 64, 48),
    (2, 128, 32),
    (4, 96, 32),
    (8, 128, 24),
    (16, 64, 16),
    (1, 16, 1),
    (1, 128, 1),
    (1, 256, 1),
    (1, 384, 1),
    (1, 512, 1),
)
#: the smallest set (``pdsim calibrate --tiny``, tests): decode batches and two prefills
TINY_RUNS: tuple[tuple[int, int, int], ...] = ((1, 64, 12), (4, 96, 8), (1, 256, 1))


def engine_probe(
    xp: ModuleType = np,
    *,
    runs: tuple[tuple[int, int, int], ...] = QUICK_RUNS,
    repeats: int = 2,
    mixed: int = 1,
    workdir: Path | None = None,
) -> list[PassPoint]:
    """Serve short probe workloads on the real engine (the validation decoder, all weights
    resident, prefetch on, exactly as ``pdsim validate`` runs it, its ops timed in place) and
    return its iterations grouped by shape (total decode context in buckets of 64 tokens),
    with their measured overheads (module docstring)."""
    rows: Groups = {}
    op_rows: dict[tuple[int, int, int, int], list[dict[str, float]]] = {}
    timer = OpTimer(op_clock(xp), syncer(xp))
    outside, inside = hook_cost(timer)
    with tempfile.TemporaryDirectory(prefix="pdsim-engine-probe-", dir=workdir) as tmp:
        w0 = ValidationWorkload("probe", "engine probe", requests=1, hbm_fraction=1.5)
        parts = engine_parts(w0, Path(tmp), xp)
        probes: list[tuple[bool, ValidationWorkload]] = []
        for rep in range(-1, repeats):  # round -1 warms caches and allocator; not kept
            for i, (n, inp, out) in enumerate(runs):
                w = replace(
                    w0,
                    requests=n,
                    rate=1e9,
                    input_low=inp,
                    input_high=inp,
                    output_low=out,
                    output_high=out,
                    max_batch=max(n, 1),
                    max_batch_tokens=1 << 20,
                    seed=100 * (rep + 1) + i,
                )
                probes.append((rep >= 0, w))
        # A mixed open-loop run: Poisson arrivals, prefill and decode in the same iterations,
        # idle gaps -- the engine as it serves (not the validation suite's workloads).
        for seed in range(mixed):
            w = replace(
                w0,
                requests=30,
                rate=6.0,
                input_low=16,
                input_high=512,
                output_low=1,
                output_high=40,
                seed=1000 + seed,
            )
            probes.append((True, w))
        for keep, w in probes:
            log = _timed_run(w, parts, timer, outside, inside)
            if keep:
                _collect(rows, [r for r, _, _ in log], [o for _, o, _ in log])
                for rec, _, ops in log:
                    op_rows.setdefault(_key(rec), []).append(ops)
    return [_point(k, v, op_rows.get(k, [])) for k, v in sorted(rows.items())]


def _point(
    key: tuple[int, int, int, int],
    group: list[tuple[float, float, float]],
    ops: Sequence[dict[str, float]] = (),
) -> PassPoint:
    ovh = [o for _, _, o in group if o == o]  # NaN: after idle, or not measured
    names = sorted({name for it in ops for name in it})
    return PassPoint(
        key[0],
        key[2],
        key[3],
        float(np.mean([dt for dt, _, _ in group])),
        len(group),
        prompts=key[1],
        sq_tokens=float(np.mean([sq for _, sq, _ in group])) if key[0] else 0.0,
        overhead_s=float(np.mean(ovh)) if ovh else None,
        overhead_count=len(ovh),
        op_s=tuple((n, float(np.mean([it.get(n, 0.0) for it in ops]))) for n in names),
    )


def hook_cost(timer: OpTimer, calls: int = 20_000) -> tuple[float, float]:
    """What timing one op through ``timer`` costs, on an empty op: ``(outside, inside)``
    seconds per call, where ``outside`` is what the timed call adds to its caller's time
    over a plain call (the clock readings, device synchronisations and bookkeeping) and
    ``inside`` the part of that which the timer records as the op's own seconds."""

    def noop() -> None:
        return None

    clock = timer.clock
    timer.take()
    t0 = clock()
    for _ in range(calls):
        noop()
    plain = clock() - t0
    t0 = clock()
    for _ in range(calls):
        timer("hook", noop)
    hooked = clock() - t0
    inside = timer.take().get("hook", 0.0) / calls
    timer.calls = 0
    return max(hooked - plain, 0.0) / calls, inside


def _timed_run(
    w: ValidationWorkload, parts: Any, timer: OpTimer, outside: float, inside: float
) -> list[tuple[IterationRecord, float, dict[str, float]]]:
    """Serve ``w`` with every op timed by ``timer``: each iteration's record (its seconds
    less the timer's own cost, ``outside`` per op), its overhead (those seconds less the
    ops' recorded seconds, less ``inside`` per op) and its op seconds by name."""
    eng = engine_for(w, parts)
    eng.model.op = timer  # type: ignore[union-attr]
    timer.take()
    timer.calls = 0
    out: list[tuple[IterationRecord, float, dict[str, float]]] = []

    def on_iteration(rec: IterationRecord) -> None:
        ops = timer.take()
        ops_s, calls = sum(ops.values()), timer.calls
        timer.calls = 0
        secs = float(rec.seconds) - calls * outside
        out.append((rec._replace(seconds=secs), secs - (ops_s - calls * inside), ops))

    eng.on_iteration = on_iteration
    eng.run(workload_for(w))
    return out


def _collect(rows: Groups, log: list[Any], overheads: Sequence[float] | None = None) -> None:
    """Group iterations (:class:`engine.runtime.engine.IterationRecord`) by (prompt tokens,
    prompts, decode batch, decode context), tokens in buckets (32 and 64 tokens, bucket
    centres); each entry keeps (seconds, sum of squared prompt lengths, overhead), the
    overhead NaN for an iteration after an idle spell (:func:`after_idle`) or where
    ``overheads`` is not given."""
    idle = after_idle(log)
    for i, rec in enumerate(log):
        ovh = float("nan") if overheads is None or idle[i] else float(overheads[i])
        row = (float(rec.seconds), float(rec.prompt_sq_tokens), ovh)
        rows.setdefault(_key(rec), []).append(row)


def _key(rec: Any) -> tuple[int, int, int, int]:
    """An iteration's group (:func:`_collect`)."""
    ptok, nd, ctx = int(rec.prompt_tokens), int(rec.decode_batch), int(rec.decode_context)
    p = ptok // 32 * 32 + 16 if ptok else 0
    return (p, int(rec.new) if ptok else 0, nd, ctx // 64 * 64 + 32 if nd else 0)


class ProbeRun(NamedTuple):
    """One fetch-probe run: the workload served with weights streaming (``stream``) and the
    same arrivals with every weight resident (``resident``), and the engine's iterations on
    each (:class:`engine.runtime.engine.IterationRecord`); on the streaming run, the bytes
    every host -> device read moved (``fetched_bytes``: the copy thread's prefetches and the
    engine thread's demand reads), their copy rate (B/s: those bytes over the reading
    threads' CPU seconds on NumPy, wall seconds on a GPU) and the copy thread's jobs
    (``(service seconds, bytes moved)``, :attr:`engine.runtime.prefetcher.Prefetcher.job_log`;
    :attr:`prefetched_bytes` is theirs alone)."""

    stream: Any
    stream_log: tuple[Any, ...]
    resident: Any
    resident_log: tuple[Any, ...]
    fetched_bytes: int = 0
    copy_rate: float = 0.0
    jobs: tuple[tuple[float, int], ...] = ()
    #: the streaming run's device weight cache, bytes
    pool_bytes: int = 0

    @property
    def prefetched_bytes(self) -> int:
        """The bytes the copy thread's prefetch jobs moved (demand reads left out)."""
        return sum(size for _, size in self.jobs)

    @property
    def resident_s(self) -> float:
        """The engine's busy seconds on the resident run."""
        return float(sum(r.seconds for r in self.resident_log))


#: an engine iteration that starts this long after the previous one ended follows an idle
#: spell (the engine slept until an arrival); back-to-back iterations are microseconds apart
IDLE_GAP_S = 1e-3


def after_idle(log: Sequence[Any]) -> list[bool]:
    """Per iteration of an engine run's ``iteration_log``: does it start more than
    :data:`IDLE_GAP_S` after the previous one ended (the first one does)?"""
    out: list[bool] = []
    prev_end = -math.inf
    for rec in log:
        out.append(float(rec.start) - prev_end > IDLE_GAP_S)
        prev_end = float(rec.start) + float(rec.seconds)
    return out


@dataclass(frozen=True)
class StreamProbe:
    """What :func:`fetch_probe` measured: the copy thread's achieved host -> device
    ``bandwidth`` (B/s, while the engine computed) and the probe runs."""

    bandwidth: float
    runs: tuple[ProbeRun, ...]


#: the fetch probe's HBM eviction policies, taken in turn by its runs: LRU thrashes a cyclic
#: layer scan evenly; LRU-K keeps some layers and re-fetches others within an iteration, so
#: demand fetches and prefetches mix differently
PROBE_POLICIES: tuple[str, ...] = ("lru", "lru-k")
#: load multipliers (rate and request count) the runs take in turn after each policy round:
#: light load, and twice it (larger batches: a layer's compute grows against its copy)
PROBE_LOADS: tuple[float, ...] = (1.0, 2.0)
#: the device weight cache of the streaming runs, as fractions of the model, taken in turn
#: by consecutive runs. Both hold the layer in use plus the prefetch window (3 of the probe
#: decoder's 2.79 MB layers: 50% of it), so every streamed byte crosses once per iteration,
#: as in a server. A smaller cache evicts prefetched layers before their turn and fetches
#: them again within the iteration: at 30% the probe moved 33.5 MB an iteration (twice the
#: model) and its copies, of bytes just copied, ran at 85-91 GB/s, against 11-12 GB/s from
#: 45% to 80% and 9-11 GB/s at 90% (2026-12-02); a knot there priced a 45% cache's copies
#: at twice their rate. The validation fractions 0.45 (below the lowest knot: its value)
#: and 0.8 (between them) stay unseen.
PROBE_FRACTIONS: tuple[float, ...] = (0.6, 0.9)


def fetch_probe(
    xp: ModuleType = np,
    *,
    requests: int = 20,
    rate: float = 4.0,
    seeds: int = 2,
    workdir: Path | None = None,
) -> StreamProbe:
    """Serve probe workloads (``requests`` Poisson arrivals at ``rate``/s, prompts of 32-256
    and outputs of 4-32 tokens; ``seeds`` draws, the HBM holding each fraction of
    :data:`PROBE_FRACTIONS` of the weights in turn (layers stream host -> device every
    iteration), after each round of fractions the HBM policy the next of
    :data:`PROBE_POLICIES` and, after each round of policies, the load the next of
    :data:`PROBE_LOADS`) on the engine, and again with every weight resident.

    ``bandwidth`` = bytes the weight reads moved over the time they took, while the engine
    computed (:mod:`hwbench.engine_fit` compares it with the idle link's rate): on NumPy the
    reading threads' CPU time (``TieredWeights.fetch_cpu_s``; a host -> device copy is CPU
    work, and the engine's clock leaves the copy thread's run-queue waits out too,
    :func:`hwbench.validation_engine.excludes_cpu_wait`), on a GPU wall time."""
    w = ValidationWorkload(
        "probe-stream",
        "engine fetch probe",
        requests=requests,
        rate=rate,
        hbm_fraction=PROBE_FRACTIONS[0],
        input_low=32,
        input_high=256,
        output_low=4,
        output_high=32,
        seed=500,
    )
    runs: list[ProbeRun] = []
    fetch_s, fetch_bytes = 0.0, 0
    with tempfile.TemporaryDirectory(prefix="pdsim-fetch-probe-", dir=workdir) as tmp:
        for k in range(seeds + 1):  # run 0 warms the interpreter and allocator; not kept
            nfr, npol = len(PROBE_FRACTIONS), len(PROBE_POLICIES)
            frac = PROBE_FRACTIONS[(k - 1) % nfr] if k else 0.6
            pol = PROBE_POLICIES[(k - 1) // nfr % npol] if k else "lru"
            load = PROBE_LOADS[(k - 1) // (nfr * npol) % len(PROBE_LOADS)] if k else 1.0
            ws = replace(
                w,
                seed=w.seed + k,
                policy=pol,
                rate=rate * load,
                requests=max(1, round(requests * load)),
                hbm_fraction=frac,
            )
            wres = replace(ws, name="probe-resident", hbm_fraction=1.5)
            # Fresh, warmed stacks for every run, as `pdsim validate` serves each workload:
            # a reused stack would carry the last run's cache times into the next run.
            sdir, rdir = Path(tmp) / f"stream{k}", Path(tmp) / f"resident{k}"
            parts = engine_parts(ws, sdir, xp)
            eng = engine_for(ws, parts)
            es, weights = eng.run(workload_for(ws)), parts[1]
            er, _ = run_engine(wres, rdir, engine_parts(wres, rdir, xp))
            if k:
                secs = weights.fetch_s if backend.is_gpu(xp) else weights.fetch_cpu_s
                jobs = tuple(eng.prefetcher.job_log) if eng.prefetcher is not None else ()
                runs.append(
                    ProbeRun(
                        ws,
                        tuple(es.iteration_log),
                        wres,
                        tuple(er.iteration_log),
                        fetched_bytes=weights.fetch_bytes,
                        copy_rate=weights.fetch_bytes / max(secs, 1e-9),
                        jobs=jobs,
                        pool_bytes=int(parts[2].hbm_weights),
                    )
                )
                fetch_s += secs
                fetch_bytes += weights.fetch_bytes
    return StreamProbe(fetch_bytes / max(fetch_s, 1e-9), tuple(runs))
