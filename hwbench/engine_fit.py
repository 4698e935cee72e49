"""The engine's own terms, measured on whole iterations with the measured op tables held fixed.

:func:`fit_engine_terms` takes a profile whose ``ops`` section carries the measured op tables
(:mod:`hwbench.opprobe`) and the engine probe's iterations (:mod:`hwbench.engine_probe`) and
returns :class:`sim.serving.opcost.EngineTerms` plus ``ops.roofline.iteration_overhead_s``:

* ``iteration_overhead_s`` (s per iteration): **measured**, not fitted: the count-weighted
  mean of the closed runs' in-place overheads of their decode iterations
  (:class:`hwbench.engine_probe.PassPoint` ``overhead_s``: an iteration's seconds less its
  ops' seconds, each op timed inside the engine's layer loop, iterations after an idle
  spell left to ``wake_s``; every iteration's when the probe ran no pure decode). It is the
  engine's work per iteration outside the ops: the serving loop's batch set-up and
  sampling, and each layer's weight pin, tensor views and prefetch planning. A fitted
  overhead (least squares of the iteration times against ``ops + overhead``) absorbed
  whatever the op tables missed and moved from 0.35 to 1.87 ms across calibrations on the
  same machine; the report keeps that solution (``raw_iteration_overhead_s``), and the
  two-term one with a share per layer and part (``raw_part_overhead_s``), as evidence. The
  op sum ``ops`` is :class:`sim.serving.opcost.OpCostModel`'s with the engine's shape
  :data:`ENGINE_SHAPE` (a prefill part plus a decode part, q/k/v and gate/up as separate
  GEMMs); ``layer_overhead_s`` stays 0;
* ``prompt_overhead_s_per_token`` (s/token): what a prompt token in the iteration costs the
  engine beyond the op tables' price and ``iteration_overhead_s``: the least-squares slope,
  through the origin and on relative error, of the prompt-carrying iterations' measured
  seconds less their op-table price and the iteration overhead, over their prompt tokens
  (floored at 0). Two things grow with the prompt: the engine's own work between ops (pins,
  views, planning) runs on caches the prompt's large ops have just evicted (on the 2-core
  VM 0.5 ms after a decode step, 1.8 ms after a 496-token prefill: the same code 2-3x
  slower), and the prompt's ops themselves run 5-20% slower in the serving loop than in the
  probes that time the tables (the engine's in-place op times against the tables, per op:
  ``op_ratio.*``); a slope of the overheads outside the ops alone misses the second;
* ``iter_gap_s``: the median gap between back-to-back iterations of the resident open-loop
  runs (measured, not fitted);
* ``wake_s``: the median extra (measured - modelled) of the iterations that follow an idle
  spell in those runs, floored at 0;
* ``copy_contention``: ``link / achieved - 1``, the idle host -> device link's measured
  bandwidth (``links.pcie``) over what the engine's copy thread achieved while the engine
  computed, floored at 0 (the simulator then runs weight copies ``1 + copy_contention``
  times slower than the link); ``copy_contention_knots``: the same per device weight cache
  size of the streaming runs (on the 2-core VM the copies ran at 11-12 GB/s with 45-80% of
  the weights resident, 9-11 GB/s at 90%, against the idle link's 34 GB/s;
  :data:`hwbench.engine_probe.PROBE_FRACTIONS` says why the runs keep above 50%);
* ``prefetch_compute_s_per_byte`` (s/B): what the copy thread's prefetches cost the
  compute, on the streaming runs against their resident twins: the streamed iterations'
  seconds less parameter wait, less ``r`` times the model's price of the same iterations
  (``r``: the resident twins' seconds over their price), over the bytes the copy thread's
  prefetch jobs moved (not the engine thread's own demand reads, which are parameter wait
  and which the simulator does not charge this term on; in the probe runs of 2026-12-02
  the prefetcher moved every byte, so the two counts agreed); floored at 0. On the 2-core
  VM a streamed decode iteration computed 2.2-3.0x its resident time, and the excess grew
  with the bytes streamed (a dimensionless stretch measured at one cache fraction missed
  another's by 30-40%). The simulator adds it, times
  the bytes prefetched at a layer, to that layer's compute. ``prefetch_compute_knots``:
  the same figure per device weight cache size of the runs (bytes, s/B), when the runs
  cover two or more (the simulator interpolates between them by the replica's cache);
* ``prefetch_handoff_s`` (s): the mean, over the streaming runs' prefetch jobs, of the
  job's service time (planned, or the previous job's end, to landed) less its bytes at the
  copy thread's own rate: the wait for the copy thread to wake and take its turn (on
  NumPy, 0.4-0.6 ms a job against 0.2-0.35 ms of copying). The mean, not the median: the
  engine waits for every job, and the lags are skewed (a thread that misses its turn waits
  for the interpreter's switch interval), so the median job's lag undercounted the holds
  by 0.1 ms a layer. The simulator starts each prefetch that much later.

The profile's ``fitted`` tables keep the evidence: ``engine_pass`` (every iteration shape:
tokens, prompts, batch, context, measured mean and count, and the model's seconds
``model_s``) and ``engine_fit_report`` (:class:`FitReport`).

Measured hardware terms (the op tables, link bandwidths, memory bandwidth, FLOP rate) are
inputs here and never change. :class:`ImpossibleFit` rejects a result that cannot describe
the machine: no in-place overhead measured, an overhead negative or below
:data:`MIN_OVERHEAD_S`, an error of ``ops + overhead`` against the measured iteration times
over :data:`MAX_FIT_ERROR` (the op tables then do not time what the engine runs), or an
achieved copy rate above both the link's own measured rate and the link probe's fastest copy
of a chunk or more by more than :data:`MAX_ABOVE_PEAK`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

import numpy as np

from engine.chunks import MIN_CHUNK_BYTES
from hwbench.engine_probe import (
    TINY_RUNS,
    PassPoint,
    ProbeRun,
    StreamProbe,
    after_idle,
    engine_probe,
    fetch_probe,
)
from hwbench.validation_models import decoder_config, sim_catalogue
from sim.serving.costmodel import Profile
from sim.serving.models import ModelSpec
from sim.serving.opcost import EngineTerms, OpCostModel

__all__ = [
    "MAX_ABOVE_PEAK",
    "MAX_FIT_ERROR",
    "MIN_OVERHEAD_S",
    "FitReport",
    "ImpossibleFit",
    "calibrate_engine",
    "fit_engine_terms",
    "furthest_ops",
    "op_ratios",
    "with_engine",
]

#: the smallest per-iteration or per-layer overhead a Python engine can have (1 us): a fit
#: below it traded the overhead away against an op table and describes no real engine
MIN_OVERHEAD_S = 1e-6
#: the largest weighted RMS relative error of the closed runs' iteration times accepted
MAX_FIT_ERROR = 0.15
#: how far above the link's own measured rate the engine's copy rate may come out (timer
#: granularity on small reads); more is not a measurement of this machine
MAX_ABOVE_PEAK = 0.10


#: how pdsim's engine runs an iteration (facts of :mod:`engine.runtime.model`, not fitted):
#: a prefill part and a decode part per layer, and q/k/v and gate/up as separate GEMMs
class EngineShape(TypedDict):
    """The :class:`sim.serving.opcost.EngineTerms` fields that say how an engine runs an
    iteration."""

    fused_iterations: bool
    split_projections: bool


ENGINE_SHAPE: EngineShape = {"fused_iterations": False, "split_projections": True}


class ImpossibleFit(Exception):
    """A calibration result that cannot describe the machine; the message says why."""


def with_engine(profile: Profile, terms: EngineTerms, iteration_overhead_s: float) -> Profile:
    """``profile`` with ``ops.engine = terms`` and ``ops.roofline.iteration_overhead_s``."""
    if profile.ops is None:
        raise ValueError("profile has no ops section (measured op tables) to add terms to")
    rl = profile.ops.roofline.model_copy(update={"iteration_overhead_s": iteration_overhead_s})
    ops = profile.ops.model_copy(update={"roofline": rl, "engine": terms})
    return profile.model_copy(update={"ops": ops})


class FitReport(dict[str, float]):
    """The calibration's figures: ``rms_rel_error`` and ``max_rel_error`` of ``ops +
    iteration_overhead_s`` against the measured iteration times, ``points``, the measured
    ``iteration_overhead_s`` and the iterations it averages (``overhead_iterations``), the
    least-squares solution ``raw_iteration_overhead_s`` and the two-term solution's per-part
    coefficient ``raw_part_overhead_s`` (evidence only), ``ops_share`` (mean op-table
    seconds over measured seconds) and, per op timed in place, ``op_ratio.NAME``
    (:func:`op_ratios`)."""


def _tables_only(profile: Profile, spec: ModelSpec) -> OpCostModel:
    """The op tables' prices of the engine's iterations (its shape, no overheads)."""
    return OpCostModel(with_engine(profile, EngineTerms(**ENGINE_SHAPE), 0.0), spec)


def _shape(p: PassPoint) -> tuple[int, int, int, int, float]:
    """A point's iteration as :meth:`OpCostModel.iteration_time` takes it."""
    return p.tokens, round(p.sq), p.prompts if p.tokens else 0, p.batch, float(p.context)


def _base_times(cost: OpCostModel, points: Sequence[PassPoint]) -> np.ndarray:
    """Op-table seconds of each point's iteration (``cost``: :func:`_tables_only`)."""
    return np.array([cost.iteration_time(*_shape(p)) for p in points])


def _measured_overhead(points: Sequence[PassPoint]) -> tuple[float, int]:
    """The count-weighted mean of the decode iterations' in-place overheads (of every
    iteration's where none is a pure decode), and the iterations it averages (module
    docstring)."""
    ovh = [(p.overhead_s, p.overhead_count) for p in points if p.overhead_s is not None]
    decode = [
        (p.overhead_s, p.overhead_count)
        for p in points
        if p.overhead_s is not None and not p.tokens
    ]
    if sum(c for _, c in decode) > 0:
        ovh = decode
    n = sum(c for _, c in ovh)
    if n <= 0:
        raise ImpossibleFit(
            "the engine probe measured no iteration overhead in place (no iteration that "
            "did not follow an idle spell had its ops timed)"
        )
    return sum(o * c for o, c in ovh) / n, n


def _prompt_overhead(
    tok: np.ndarray, count: np.ndarray, base: np.ndarray, meas: np.ndarray, a: float
) -> tuple[float, int]:
    """``prompt_overhead_s_per_token`` (module docstring): the least-squares slope, through
    the origin and on relative error (weights: count over measured seconds squared), of the
    prompt-carrying iterations' measured seconds less their op-table price ``base`` and the
    iteration overhead ``a``, over their prompt tokens ``tok`` (iterations: ``count``),
    floored at 0; and the iterations it rests on (0 s/token when none)."""
    has = tok > 0
    if not has.any():
        return 0.0, 0
    w = count[has] / meas[has] ** 2
    excess = meas[has] - base[has] - a
    slope = float(np.sum(w * tok[has] * excess) / np.sum(w * tok[has] ** 2))
    return max(slope, 0.0), int(count[has].sum())


def _fit_overheads(
    base: np.ndarray,
    meas: np.ndarray,
    calls: np.ndarray,
    count: np.ndarray,
    a: float,
    extra: np.ndarray,
) -> FitReport:
    """The error of ``meas = base + a + extra`` (``a`` and the per-prompt-token ``extra``
    measured), and for the record the weighted least-squares solutions on relative error of
    ``base + a1`` and of ``base + a2 + b2 * calls`` (module docstring)."""
    w2 = count / count.sum() / meas**2
    a1 = float(np.sum(w2 * (meas - base)) / np.sum(w2))
    rel = (base + a + extra) / meas - 1.0
    w = np.sqrt(w2)
    design = np.column_stack([np.ones_like(base), calls]) * w[:, None]
    (_, b2), *_ = np.linalg.lstsq(design, (meas - base) * w, rcond=None)
    report = FitReport(
        rms_rel_error=float(np.sqrt(np.sum(count * rel**2) / count.sum())),
        max_rel_error=float(np.max(np.abs(rel))),
        points=float(len(meas)),
        iteration_overhead_s=a,
        raw_iteration_overhead_s=a1,
        raw_part_overhead_s=float(b2),
        ops_share=float(np.sum(count * base / meas) / count.sum()),
    )
    return report


def _serving(cost: OpCostModel, probe: StreamProbe) -> tuple[float, float]:
    """``(iter_gap_s, wake_s)`` from the resident open-loop runs (module docstring)."""
    gaps: list[float] = []
    extra: list[float] = []
    for run in probe.runs:
        log: tuple[Any, ...] = run.resident_log
        prev_end = None
        for rec, idle in zip(log, after_idle(log), strict=True):
            if not idle and prev_end is not None:
                gaps.append(max(float(rec.start) - prev_end, 0.0))
            if idle:
                extra.append(float(rec.seconds) - _price(cost, rec))
            prev_end = float(rec.start) + float(rec.seconds)
    gap = float(np.median(gaps)) if gaps else 0.0
    wake = max(float(np.median(extra)), 0.0) if extra else 0.0
    return gap, wake


def _price(cost: OpCostModel, rec: Any) -> float:
    return cost.iteration_time(
        int(rec.prompt_tokens), round(rec.prompt_sq_tokens), int(rec.new),
        int(rec.decode_batch), float(rec.decode_context),
    )  # fmt: skip


#: engine op names priced by another op's table: the residual adds are in the norm tables
#: (``input_norm`` and ``post_attn_norm``: a residual add and an RMSNorm each)
_PRICED_AS = {"residual_add": "norms", "input_norm": "norms", "post_attn_norm": "norms"}


def op_ratios(profile: Profile, spec: ModelSpec, points: Sequence[PassPoint]) -> dict[str, float]:
    """Per op, the op tables' seconds over the same ops' seconds timed in place, summed over
    the points' iterations (count-weighted; ``norms``: both norms and the residual adds);
    only ops timed in place and priced above 0."""
    zero = _tables_only(profile, spec)
    table: dict[str, float] = {}
    inplace: dict[str, float] = {}
    for p in points:
        if not p.op_s:
            continue
        priced = zero.iteration_ops(*_shape(p))
        for name, secs in p.op_s:
            key = _PRICED_AS.get(name, name)
            inplace[key] = inplace.get(key, 0.0) + p.count * secs
        for name, secs in priced.items():
            key = _PRICED_AS.get(name, name)
            table[key] = table.get(key, 0.0) + p.count * secs
    return {k: table[k] / v for k, v in sorted(inplace.items()) if v > 0 and table.get(k, 0) > 0}


def furthest_ops(ratios: dict[str, float], n: int = 3) -> str:
    """The ``n`` ops whose tables are furthest from their in-place times (by the log of
    :func:`op_ratios`' ratio), as ``"name 0.67x, ..."``."""
    worst = sorted(ratios.items(), key=lambda kv: -abs(np.log(kv[1])))[:n]
    return ", ".join(f"{name} {r:.2f}x" for name, r in worst)


def _per_byte(cost: OpCostModel, runs: Sequence[ProbeRun]) -> float | None:
    """What a prefetched byte cost the compute on ``runs`` (module docstring), floored at 0;
    None when they prefetched nothing or their resident twins are not priced. The bytes are
    the copy thread's (:attr:`hwbench.engine_probe.ProbeRun.prefetched_bytes`), the ones the
    simulator charges the term on; the engine thread's demand reads are parameter wait."""
    res_s = sum(float(r.seconds) for run in runs for r in run.resident_log)
    res_price = sum(_price(cost, r) for run in runs for r in run.resident_log)
    nbytes = sum(run.prefetched_bytes for run in runs)
    if res_price <= 0 or nbytes <= 0:
        return None
    ratio = res_s / res_price
    extra = sum(
        float(r.seconds) - float(r.param_wait) - ratio * _price(cost, r)
        for run in runs
        for r in run.stream_log
    )
    return max(extra / nbytes, 0.0)


def _prefetch_terms(
    cost: OpCostModel, probe: StreamProbe
) -> tuple[float, list[tuple[float, float]], float]:
    """``(prefetch_compute_s_per_byte, prefetch_compute_knots, prefetch_handoff_s)`` from the
    streaming runs and their resident twins (module docstring): the per-byte cost over all
    runs and per device weight cache size; 0 (or no knots) for what the runs cannot
    measure."""
    per_byte = _per_byte(cost, probe.runs) or 0.0
    knots: list[tuple[float, float]] = []
    for pool, runs in _by_pool(probe.runs):
        value = _per_byte(cost, runs)
        if value is not None:
            knots.append((pool, value))
    lags = [
        secs - size / run.copy_rate
        for run in probe.runs
        if run.copy_rate > 0
        for secs, size in run.jobs
    ]
    handoff = max(float(np.mean(lags)), 0.0) if lags else 0.0
    return per_byte, knots if len(knots) > 1 else [], handoff


def _contention(link: float, achieved: float) -> float:
    """``link / achieved - 1`` in [0, 4] (module docstring); 0 when nothing was copied."""
    return min(max(link / achieved - 1.0, 0.0), 4.0) if achieved > 0 else 0.0


def _contention_knots(link: float, probe: StreamProbe) -> list[tuple[float, float]]:
    """The copy contention per device weight cache size of the streaming runs (their bytes
    over their copy seconds), when they cover two or more sizes; else none."""
    knots: list[tuple[float, float]] = []
    for pool, runs in _by_pool(probe.runs):
        copied = [r for r in runs if r.copy_rate > 0]
        nbytes = sum(r.fetched_bytes for r in copied)
        secs = sum(r.fetched_bytes / r.copy_rate for r in copied)
        if nbytes > 0 and secs > 0:
            knots.append((pool, _contention(link, nbytes / secs)))
    return knots if len(knots) > 1 else []


def _by_pool(runs: Sequence[ProbeRun]) -> list[tuple[float, list[ProbeRun]]]:
    """The streaming runs grouped by their device weight cache (bytes, ascending; runs
    without one left out)."""
    pools = sorted({run.pool_bytes for run in runs if run.pool_bytes > 0})
    return [(float(p), [run for run in runs if run.pool_bytes == p]) for p in pools]


def _probe_peak(profile: Profile) -> float:
    """The fastest host->device copy of a chunk or more (:data:`MIN_CHUNK_BYTES`) the link
    probe timed (``fitted.copy_host_to_device``: bytes over its fastest repeat), B/s; 0 when
    the profile keeps none. A copy whose source and destination sit in the last-level cache
    runs above the link's fitted rate, which large copies set (on the 2-core VM: 50 GB/s at
    4 MiB, 10 GB/s at 64 MiB), and so may the engine's chunk copies."""
    rows: list[Any] = list(profile.fitted.get("copy_host_to_device", []))
    rates = [
        float(r["bytes"]) / float(r["min_s"])
        for r in rows
        if float(r.get("bytes", 0)) >= MIN_CHUNK_BYTES and float(r.get("min_s", 0)) > 0
    ]
    return max(rates, default=0.0)


def fit_engine_terms(
    profile: Profile,
    spec: ModelSpec,
    points: Sequence[PassPoint],
    probe: StreamProbe,
) -> tuple[Profile, FitReport]:
    """``profile`` (with measured op tables) plus the engine's terms measured on ``points``
    and ``probe`` (module docstring), and the report. :class:`ImpossibleFit` when the
    result cannot describe the machine."""
    if not points:
        raise ImpossibleFit("the engine probe logged no iterations")
    base = _base_times(_tables_only(profile, spec), points)
    meas = np.array([p.mean_s for p in points])
    calls = np.array([spec.n_layers * (2 if p.tokens and p.batch else 1) for p in points])
    count = np.array([float(p.count) for p in points])
    a, measured_n = _measured_overhead(points)
    if a < MIN_OVERHEAD_S:
        raise ImpossibleFit(
            f"measured iteration_overhead_s = {a:.3g} s per iteration: negative or near zero "
            f"(allowed: >= {MIN_OVERHEAD_S:g}); the in-place op times exceed the engine's "
            "iteration times, so the timer's own cost was not taken out"
        )
    tok = np.array([float(p.tokens) for p in points])
    per_tok, prompt_n = _prompt_overhead(tok, count, base, meas, a)
    extra = per_tok * tok
    report = _fit_overheads(base, meas, calls, count, a, extra)
    report["overhead_iterations"] = float(measured_n)
    report["prompt_overhead_s_per_token"] = per_tok
    report["prompt_overhead_iterations"] = float(prompt_n)
    ratios = op_ratios(profile, spec, points)
    report.update({f"op_ratio.{k}": v for k, v in ratios.items()})
    if report["rms_rel_error"] > MAX_FIT_ERROR:
        worst = points[int(np.argmax(np.abs((base + a + extra) / meas - 1.0)))]
        raise ImpossibleFit(
            f"engine iteration error {report['rms_rel_error']:.1%} (RMS, relative) is over "
            f"the {MAX_FIT_ERROR:.0%} allowed: op tables plus the measured overhead "
            f"({a * 1e6:.0f} us) do not describe "
            f"this engine's iterations (largest error {report['max_rel_error']:.0%}, at "
            f"{worst.tokens} prompt tokens and {worst.batch} decodes of {worst.context:.0f} "
            f"context tokens; op tables cover {report['ops_share']:.0%} of a measured "
            "iteration on average"
            + (f"; tables over the ops timed in place: {furthest_ops(ratios)}" if ratios else "")
            + ")"
        )
    link = profile.links.pcie.bandwidth
    achieved = probe.bandwidth
    ceiling = max(link, _probe_peak(profile))
    if achieved > ceiling * (1.0 + MAX_ABOVE_PEAK):
        raise ImpossibleFit(
            f"the engine's copies ran at {achieved:.3g} B/s, above the host->device link's "
            f"own measured {link:.3g} B/s and its fastest probe copy of a chunk or more "
            f"({ceiling:.3g} B/s) by more than {MAX_ABOVE_PEAK:.0%}"
        )
    contention = _contention(link, achieved)
    terms = EngineTerms(
        **ENGINE_SHAPE,
        copy_contention=contention,
        copy_contention_knots=_contention_knots(link, probe),
        prompt_overhead_s_per_token=per_tok,
    )
    fitted = with_engine(profile, terms, a)
    cost = OpCostModel(fitted, spec)
    gap, wake = _serving(cost, probe)
    per_byte, knots, handoff = _prefetch_terms(cost, probe)
    terms = terms.model_copy(
        update={
            "iter_gap_s": gap,
            "wake_s": wake,
            "prefetch_compute_s_per_byte": per_byte,
            "prefetch_compute_knots": knots,
            "prefetch_handoff_s": handoff,
        }
    )
    report["copy_rate_Bps"] = achieved
    out = with_engine(profile, terms, a)
    pred = base + a + extra
    tables = dict(out.fitted)
    tables["engine_pass"] = [
        {**p.row(), "model_s": float(m)} for p, m in zip(points, pred, strict=True)
    ]
    tables["engine_fit_report"] = [dict(report)]
    return out.model_copy(update={"fitted": tables}), report


def probe_engine(
    xp: ModuleType, *, mode: str = "quick", workdir: Path | None = None
) -> tuple[list[PassPoint], StreamProbe]:
    """Serve the calibration workloads on the engine (backend ``xp``): the iteration points
    and the streaming probe :func:`fit_engine_terms` fits. ``mode``: ``tiny`` (seconds;
    tests), ``quick`` or ``full`` (more repeats and runs)."""
    if mode == "tiny":
        points = engine_probe(xp, runs=TINY_RUNS, repeats=1, mixed=0, workdir=workdir)
        return points, fetch_probe(xp, requests=3, rate=1e9, seeds=1, workdir=workdir)
    full = mode == "full"
    points = engine_probe(xp, repeats=6 if full else 2, mixed=3 if full else 1, workdir=workdir)
    return points, fetch_probe(xp, seeds=16 if full else 8, workdir=workdir)


def calibrate_engine(
    profile: Profile, xp: ModuleType, *, mode: str = "quick", workdir: Path | None = None
) -> tuple[Profile, FitReport]:
    """:func:`probe_engine`, then :func:`fit_engine_terms` onto ``profile`` (which carries the
    measured op tables)."""
    cfg = decoder_config()
    spec = sim_catalogue(cfg)[cfg.name]
    points, probe = probe_engine(xp, mode=mode, workdir=workdir)
    return fit_engine_terms(profile, spec, points, probe)
