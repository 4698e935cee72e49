"""Engine probe: time whole engine iterations and fit the simulator's compute terms to them.

The generic probes (:mod:`hwbench.probes`) measure a machine's matmul rate, copy bandwidths
and a tiny layer's overhead. On a small CPU model those do not add up to the engine's real
iteration time: every layer also pays NumPy temporaries and call overheads, and paged decode
attention (many small batched products) costs far more per context token than its bytes and
FLOPs say. This probe serves short workloads on the real engine itself (the validation decoder,
:func:`hwbench.validate.decoder_config`, weights through the tier stack, prefetcher on) and
reads its iteration log: every iteration's prefill tokens, decode batch and context, and time.

:func:`fit_engine` then fits seven terms by least squares on log time:

* the roofline terms of :class:`sim.costmodel.CostModel` -- ``per_layer_overhead_s``,
  ``kernel_launch_s`` (per pass), the achieved FLOP rate and the weight-read bandwidth;
* three attention terms that :class:`EngineCostModel` adds per attention layer: a fixed cost
  per decode step (``attn_fixed_s``), a cost per context token of the batch
  (``attn_per_token_s``) and, in prefill, a cost per squared prompt token (``prefill_sq_s``).

The profile keeps the iteration shapes in ``fitted["engine_pass"]`` and
the terms in ``fitted["engine_fit"]``; the roofline terms also replace the ``gpu`` block's
values so the plain :class:`CostModel` benefits too. :func:`fetch_probe` measures the rate
the engine's prefetch thread moves layers host -> device while the engine computes; it
replaces ``links.pcie.bandwidth`` (the other links are untouched). Its all-resident runs
give :func:`serving_terms` (how much slower decode steps and prefills run while serving
than back to back -- ``decode_scale`` -- and the warm-up costs after an idle spell and
after a prefill: ``wake_s``, ``rewarm_s``, ``rewarm_decay``). On the same probe runs,
:func:`fit_stream` fits the copy/compute interference factors of :mod:`hwbench.interference`
(``fitted.engine_fit[0]["copy_interference"]`` for decode-only iterations,
``["copy_interference_prefill"]`` for iterations that admit prompts), which the validation
simulator applies.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from hwbench.interference import Interference
from sim.costmodel import CostModel, GpuProfile, Profile

__all__ = [
    "EngineCostModel",
    "PassPoint",
    "ProbeRun",
    "ServingTerms",
    "StreamProbe",
    "after_idle",
    "calibrate_engine",
    "engine_probe",
    "fetch_probe",
    "fit_engine",
    "fit_stream",
    "serving_terms",
    "split_busy",
]


@dataclass(frozen=True)
class PassPoint:
    """Engine iterations of one shape: ``tokens`` prompt tokens prefilled (0: none) in
    ``prompts`` prompts whose squared lengths sum to ``sq_tokens`` (causal attention's work;
    the mean over the group), and one decode step of ``batch`` sequences holding ``context``
    tokens in all (``batch`` 0: none); ``mean_s`` is the mean of ``count`` measured
    iterations (a request's latency is a sum of iteration times, which converges to the mean,
    OS pauses included)."""

    tokens: int
    batch: int
    context: int
    mean_s: float
    count: int
    prompts: int = 1
    sq_tokens: float | None = None  # None: one prompt of ``tokens`` (tokens ** 2)

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
        }


#: iterations grouped by shape (see :func:`_collect`): (seconds, sum of squared prompt lengths)
Groups = dict[tuple[int, int, int, int], list[tuple[float, float]]]

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
    resident, prefetch on, exactly as ``pdsim validate`` runs it) and return its iterations
    grouped by shape (total decode context in buckets of 64 tokens)."""
    from hwbench.validate import engine_parts, run_engine
    from hwbench.workloads import ValidationWorkload

    rows: Groups = {}
    with tempfile.TemporaryDirectory(prefix="pdsim-engine-probe-", dir=workdir) as tmp:
        w0 = ValidationWorkload("probe", "engine probe", requests=1, hbm_fraction=1.5)
        parts = engine_parts(w0, Path(tmp), xp)
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
                res, _ = run_engine(w, Path(tmp), parts)
                if rep >= 0:
                    _collect(rows, res.iteration_log)
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
            res, _ = run_engine(w, Path(tmp), parts)
            _collect(rows, res.iteration_log)
    return [
        PassPoint(
            k[0],
            k[2],
            k[3],
            float(np.mean([dt for dt, _ in v])),
            len(v),
            prompts=k[1],
            sq_tokens=float(np.mean([sq for _, sq in v])) if k[0] else 0.0,
        )
        for k, v in sorted(rows.items())
    ]


def _collect(rows: Groups, log: list[Any]) -> None:
    """Group iterations (:class:`engine.runtime.engine.IterationRecord`) by (prompt tokens,
    prompts, decode batch, decode context), tokens in buckets (32 and 64 tokens, bucket
    centres); each entry keeps (seconds, sum of squared prompt lengths)."""
    for rec in log:
        ptok, nd, ctx = int(rec.prompt_tokens), int(rec.decode_batch), int(rec.decode_context)
        p = ptok // 32 * 32 + 16 if ptok else 0
        key = (p, int(rec.new) if ptok else 0, nd, ctx // 64 * 64 + 32 if nd else 0)
        rows.setdefault(key, []).append((float(rec.seconds), float(rec.prompt_sq_tokens)))


class ProbeRun(NamedTuple):
    """One fetch-probe run: the workload served with weights streaming (``stream``) and the
    engine's busy seconds on it by iteration kind (:func:`split_busy`); the same arrivals
    with every weight resident (``resident``) and the engine's iterations on it
    (:class:`engine.runtime.engine.IterationRecord`)."""

    stream: Any
    stream_busy: tuple[float, float, float]
    resident: Any
    resident_log: tuple[Any, ...]

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


def split_busy(log: list[Any]) -> tuple[float, float, float]:
    """Seconds of an engine run's ``iteration_log`` by kind, in
    :class:`hwbench.interference.Interference`'s order: decode-only iterations,
    prompt-admitting ones back to back, prompt-admitting ones after an idle spell (starting
    more than :data:`IDLE_GAP_S` after the previous iteration ended; the first one too)."""
    out = [0.0, 0.0, 0.0]
    for rec, idle in zip(log, after_idle(log), strict=True):
        out[0 if rec.new == 0 else (2 if idle else 1)] += float(rec.seconds)
    return out[0], out[1], out[2]


@dataclass(frozen=True)
class StreamProbe:
    """What :func:`fetch_probe` measured: the copy thread's achieved host -> device
    ``bandwidth`` (B/s) and the probe runs."""

    bandwidth: float
    runs: tuple[ProbeRun, ...]


#: the fetch probe's HBM eviction policies, taken in turn by its runs: LRU thrashes a cyclic
#: layer scan evenly; LRU-K keeps some layers and re-fetches others within an iteration, so
#: demand fetches and prefetches mix differently
PROBE_POLICIES: tuple[str, ...] = ("lru", "lru-k")
#: load multipliers (rate and request count) the runs take in turn after each policy round:
#: light load, and twice it (larger batches: a layer's compute grows against its copy)
PROBE_LOADS: tuple[float, ...] = (1.0, 2.0)


def fetch_probe(
    latency: float,
    xp: ModuleType = np,
    *,
    requests: int = 20,
    rate: float = 4.0,
    seeds: int = 2,
    workdir: Path | None = None,
) -> StreamProbe:
    """Serve probe workloads (``requests`` Poisson arrivals at ``rate``/s, prompts of 32-256
    and outputs of 4-32 tokens; ``seeds`` draws, the HBM policy taking
    :data:`PROBE_POLICIES` in turn and, after each round of policies, the load the next of
    :data:`PROBE_LOADS`) on the engine with HBM holding 60% of the weights (layers stream
    host -> device every iteration) and again with every weight resident. The same runs give
    :func:`serving_terms` (resident) and :func:`fit_stream` (streaming).

    ``bandwidth`` = bytes the copy thread moved over the wall time its reads took (contention
    with the engine's own compute included); it becomes ``links.pcie.bandwidth``
    (``latency`` is the machine's figure, passed through by :func:`calibrate_engine`). The
    streaming runs' busy seconds by iteration kind feed :func:`hwbench.interference.fit_terms`
    (through :func:`fit_stream`).

    (Fitting a per-job latency on the jobs' service times was tried: it over-predicted the
    engine's streaming waits by 2-3x, because a job's service overlaps the layer's compute
    in ways the simulator's hold does not see; see docs/design/engine-runtime.md.)"""
    from hwbench.validate import engine_parts, run_engine
    from hwbench.workloads import ValidationWorkload

    w = ValidationWorkload(
        "probe-stream",
        "engine fetch probe",
        requests=requests,
        rate=rate,
        hbm_fraction=0.6,
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
            npol = len(PROBE_POLICIES)
            pol = PROBE_POLICIES[(k - 1) % npol] if k else "lru"
            load = PROBE_LOADS[(k - 1) // npol % len(PROBE_LOADS)] if k else 1.0
            ws = replace(
                w,
                seed=w.seed + k,
                policy=pol,
                rate=rate * load,
                requests=max(1, round(requests * load)),
            )
            wres = replace(ws, name="probe-resident", hbm_fraction=1.5)
            # Fresh, warmed stacks for every run, as `pdsim validate` serves each workload:
            # a reused stack would carry the last run's cache times into the next run.
            sdir, rdir = Path(tmp) / f"stream{k}", Path(tmp) / f"resident{k}"
            es, weights = run_engine(ws, sdir, engine_parts(ws, sdir, xp))
            er, _ = run_engine(wres, rdir, engine_parts(wres, rdir, xp))
            if k:
                log = tuple(er.iteration_log)
                runs.append(ProbeRun(ws, split_busy(es.iteration_log), wres, log))
                fetch_s += weights.fetch_s
                fetch_bytes += weights.fetch_bytes
    return StreamProbe(fetch_bytes / max(fetch_s, 1e-9), tuple(runs))


def fit_stream(
    profile: Profile, probe: StreamProbe, workdir: Path | None = None
) -> tuple[Interference, Interference, list[dict[str, float]]]:
    """The copy/compute interference factors and fixed overheads per streamed iteration
    (:mod:`hwbench.interference`; per kind: decode-only iterations, prompt-admitting ones
    back to back and after an idle spell) that make the simulator's busy seconds of each
    kind on ``probe``'s streaming runs match the engine's, with ``profile`` (already
    carrying the fitted compute terms and pcie link): one least-squares fit over all runs
    (:func:`hwbench.interference.fit_terms`; the runs differ in policy and load, so the
    copy per iteration and the batches vary and tell the factor from the overhead); also one
    row per run (engine busy s streaming by kind and resident, simulator busy s resident and
    streaming by kind with the fitted terms) for ``fitted["stream_probe"]``.

    Each run's targets are the engine's busy seconds per kind divided by the compute
    model's own bias on the same arrivals with every weight resident (engine / simulator
    busy), so the terms absorb only what streaming adds."""
    from hwbench.interference import KindBusy, fit_terms
    from hwbench.validate import run_simulator

    def busy(w: Any, s: Interference, h: Interference, *, d: Path) -> KindBusy:
        kb = KindBusy()
        run_simulator(w, profile, d, interference=s, overhead=h, busy=kb)
        return kb

    with tempfile.TemporaryDirectory(prefix="pdsim-stream-fit-", dir=workdir) as tmp:
        d = Path(tmp)
        targets: list[tuple[float, float, float]] = []
        sim_res: list[float] = []
        for run in probe.runs:
            sim_res.append(
                float(run_simulator(run.resident, profile, d, interference=0.0)[4].ctx.metrics.busy)
            )
            bias = run.resident_s / sim_res[-1]
            b = run.stream_busy
            targets.append((b[0] / bias, b[1] / bias, b[2] / bias))
        sims = [partial(busy, run.stream, d=d) for run in probe.runs]
        s, h = fit_terms(targets, sims)
        rows: list[dict[str, float]] = []
        for run, res_s, sim in zip(probe.runs, sim_res, sims, strict=True):
            got = sim(s, h).kinds()
            row = {"engine_resident_s": run.resident_s, "sim_resident_s": res_s}
            for k, name in enumerate(Interference._fields):
                row[f"engine_stream_{name}_s"] = run.stream_busy[k]
                row[f"sim_stream_{name}_s"] = got[k]
            rows.append(row)
    return s, h, rows


def _parts(cost: CostModel, rec: Any) -> tuple[float, float]:
    """The cost model's (prefill, decode) seconds for the shape of engine iteration ``rec``."""
    pre = float(cost.prefill_time(rec.prompt_tokens, rec.prompt_sq_tokens)) if rec.new else 0.0
    dec = (
        float(cost.decode_step_time(rec.decode_batch, rec.decode_context))
        if rec.decode_batch
        else 0.0
    )
    return pre, dec


#: the re-warm decays tried by :func:`serving_terms` (per decode step after a prefill)
DECAYS: tuple[float, ...] = tuple(round(0.01 * i, 2) for i in range(96))


class ServingTerms(NamedTuple):
    """How the engine computes while serving, against the probe's back-to-back iterations:
    steady decode steps take ``decode_scale`` times their fitted cost (prefills their fitted
    cost: the closed probe times prefills back to back, as they run while serving); the
    first iteration after an idle spell costs ``wake_s - wake_hide * C`` more (``C`` its own
    compute; floored at 0); the ``j``-th decode step after a prefill
    ``rewarm_s * rewarm_decay ** (j - 1)`` more (sim.node's warm-up costs); and the serving
    loop spends ``iter_gap_s`` between two back-to-back iterations (``CostModel.iter_gap_s``;
    the iterations' own seconds leave it out)."""

    decode_scale: float
    wake_s: float
    rewarm_s: float
    rewarm_decay: float
    wake_hide: float = 0.0
    iter_gap_s: float = 0.0


def _wake_line(extra: np.ndarray, compute: np.ndarray) -> tuple[float, float]:
    """``(a, b) >= 0`` of the least-squares line ``extra = a - b * compute``: the cold start
    ``a`` and how much of it each second of the iteration's compute hides ``b``; the mean
    extra (floored at 0) with ``b = 0`` when the line would rise, or when fewer than three
    iterations or one prompt length leave it undetermined."""
    mean = max(float(np.mean(extra)), 0.0)
    if extra.shape[0] < 3 or float(np.ptp(compute)) <= 0:
        return mean, 0.0
    slope, icept = np.polyfit(compute, extra, 1)
    if slope >= 0 or icept <= 0:
        return mean, 0.0
    return float(icept), float(-slope)


def _run_terms(
    cost: CostModel, log: tuple[Any, ...]
) -> tuple[float, float, float, float, float, float]:
    """One resident run's (decode_scale, wake_s, rewarm_s, rewarm_decay, wake_hide,
    iter_gap_s); see :func:`serving_terms`."""
    recs: list[tuple[float, float, float, bool, int, bool]] = []  # e, pre, dec, idle, j, new
    gaps: list[float] = []
    since = 1 << 30
    prev_end = -math.inf
    for rec, idle in zip(log, after_idle(log), strict=True):
        pre, dec = _parts(cost, rec)
        since = 0 if rec.new else since + 1
        recs.append((float(rec.seconds), pre, dec, idle, since, bool(rec.new)))
        if not idle:
            gaps.append(max(float(rec.start) - prev_end, 0.0))
        prev_end = float(rec.start) + float(rec.seconds)
    dec_rows = [(e, d, j) for e, _, d, idle, j, new in recs if not new and not idle and d > 0]
    kd, rewarm, decay = 1.0, 0.0, 0.0
    if dec_rows:
        e_d = np.array([r[0] for r in dec_rows])
        d_d = np.array([r[1] for r in dec_rows])
        j_d = np.minimum(np.array([r[2] for r in dec_rows], dtype=float), 1e4)
        kd = float(e_d.sum() / d_d.sum())
        best = float(np.sum((e_d - kd * d_d) ** 2))
        for r in DECAYS:  # e = kd * D + rewarm * r**(j - 1): linear for a fixed r
            a = np.column_stack([d_d, r ** (j_d - 1.0)])
            (k, x), *_ = np.linalg.lstsq(a, e_d, rcond=None)
            sse = float(np.sum((e_d - a @ np.array([k, x])) ** 2))
            if k > 0 and x >= 0 and sse < best:
                best, kd, rewarm, decay = sse, float(k), float(x), r
    # prefills cost their fitted time (a prefill factor fitted together with wake_s on
    # 32-256-token prompts extrapolated badly to 384-512 tokens: long-context TTFT -8%; one
    # scale for both kinds carried the decode fit's bias into prefills: -10% there); the
    # prompt-admitting iterations that follow an idle spell give the wake-up line
    woke = [(e - p - kd * d, p + kd * d) for e, p, d, idle, _, new in recs if new and idle]
    wake, hide = 0.0, 0.0
    if woke:
        arr = np.array(woke)
        wake, hide = _wake_line(arr[:, 0], arr[:, 1])
    return kd, wake, rewarm, decay, hide, float(np.mean(gaps)) if gaps else 0.0


def serving_terms(profile: Profile, spec: Any, probe: StreamProbe) -> ServingTerms:
    """The :class:`ServingTerms` of ``probe``'s all-resident runs against the cost model of
    ``profile`` (fitted on back-to-back iterations), each the median over the runs:

    * ``decode_scale``, ``rewarm_s``, ``rewarm_decay``: least squares over the decode-only
      iterations (not after an idle spell) of engine seconds = ``decode_scale`` x the cost
      model's
      + ``rewarm_s * rewarm_decay ** (j - 1)`` for the ``j``-th step after a prefill (the
      decay from a grid, :data:`DECAYS`; the two others linear for each);
    * ``wake_s``, ``wake_hide``: the least-squares line (:func:`_wake_line`) of the extra
      (engine seconds - the cost model's prefill part - ``decode_scale`` x its decode part)
      against the iteration's compute (the same two parts), over the prompt-admitting
      iterations that follow an idle spell;
    * ``iter_gap_s``: the mean time from one iteration's end to the next one's start, over
      the iterations that do not follow an idle spell (a request's latency sums these gaps:
      ~15 us each on the 2-core VM, 0.6% of a 16-token request's).

    Measured on the 2-core VM: a prefill after an idle spell costs more than back to back
    (cold caches) -- ~1.5 ms for 64-128-token prompts (9 ms of compute), ~0.5 ms at 100-250
    tokens, nothing at 384-512 (48 ms), so a longer prefill's compute hides the cold start --
    and the first three decode steps after a prefill ~0.7, 0.3 and 0.1 ms more (the prefill
    evicted their weights from the CPU caches), while steady decode steps cost what the
    closed probe measured."""
    cost = EngineCostModel(profile, spec)
    rows = [_run_terms(cost, run.resident_log) for run in probe.runs if run.resident_log]
    if not rows:
        return ServingTerms(1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    med = np.median(np.array(rows), axis=0)
    return ServingTerms(*(float(v) for v in med))


class EngineCostModel(CostModel):
    """:class:`CostModel` plus the engine's attention terms from ``fitted["engine_fit"]``
    (zero when the profile has none, which gives the plain cost model), its
    ``decode_scale`` (decode steps while serving against back to back; 1 when absent) and
    warm-up costs ``wake_s``, ``wake_hide``, ``rewarm_s``, ``rewarm_decay`` and serving-loop
    gap ``iter_gap_s``
    (:class:`CostModel`; 0 when absent), all from :func:`serving_terms`."""

    #: the engine runs a prefill pass and a decode pass per iteration, not one fused pass
    fused_iterations = False

    def __init__(self, profile: Profile, model: Any, **parallel: int) -> None:
        super().__init__(profile, model, **parallel)
        fit = (profile.fitted.get("engine_fit") or [{}])[0]
        self.decode_scale = float(fit.get("decode_scale", 1.0))
        self.wake_s = float(fit.get("wake_s", 0.0))
        self.wake_hide = float(fit.get("wake_hide", 0.0))
        self.rewarm_s = float(fit.get("rewarm_s", 0.0))
        self.rewarm_decay = float(fit.get("rewarm_decay", 0.0))
        self.iter_gap_s = float(fit.get("iter_gap_s", 0.0))
        self.attn_fixed = float(fit.get("attn_fixed_s", 0.0))
        self.attn_token = float(fit.get("attn_per_token_s", 0.0))
        self.prefill_sq = float(fit.get("prefill_sq_s", 0.0))
        self.n_attn = int(model.n_attention_layers)

    def decode_step_time(self, batch: int, total_context_tokens: int) -> float:
        t = super().decode_step_time(batch, total_context_tokens)
        if batch > 0:
            t += self.n_attn * (self.attn_fixed + self.attn_token * total_context_tokens)
        return t * self.decode_scale

    def decode_step_times(self, batch: np.ndarray, total_context_tokens: np.ndarray) -> np.ndarray:
        t = super().decode_step_times(batch, total_context_tokens)
        extra = self.n_attn * (
            self.attn_fixed + self.attn_token * np.asarray(total_context_tokens, dtype=float)
        )
        return (t + np.where(np.asarray(batch) > 0, extra, 0.0)) * self.decode_scale

    def prefill_time(self, tokens: int, sq_tokens: int | None = None) -> float:
        sq = float(tokens) ** 2 if sq_tokens is None else float(sq_tokens)
        return super().prefill_time(tokens, sq_tokens) + self.n_attn * self.prefill_sq * sq


TERMS: tuple[str, ...] = (
    "per_layer_overhead_s",
    "kernel_launch_s",
    "flop_rate",
    "hbm_bandwidth",
    "attn_fixed_s",
    "attn_per_token_s",
    "prefill_sq_s",
)


def _predict(cost: CostModel, p: PassPoint) -> float:
    """The simulator node's compute charge for such an iteration (``ModelRt.iter_time``
    less the serving loop's gap, which an iteration's own seconds leave out)."""
    t = 0.0
    if p.tokens:
        t += float(cost.prefill_time(p.tokens, round(p.sq)))
    if p.batch:
        t += float(cost.decode_step_time(p.batch, p.context))
    return t


def _with_terms(profile: Profile, terms: dict[str, float], points: list[PassPoint]) -> Profile:
    g = profile.gpu
    gpu = GpuProfile(
        hbm_bytes=g.hbm_bytes,
        hbm_bandwidth=terms["hbm_bandwidth"],
        flops_fp16=terms["flop_rate"],
        flops_fp32=terms["flop_rate"],
        compute_efficiency=1.0,
        kernel_launch_s=terms["kernel_launch_s"],
        per_layer_overhead_s=terms["per_layer_overhead_s"],
    )
    fitted = dict(profile.fitted)
    fitted["engine_pass"] = [p.row() for p in points]
    fitted["engine_fit"] = [dict(terms)]
    return profile.model_copy(update={"gpu": gpu, "fitted": fitted})


def fit_engine(profile: Profile, spec: Any, points: list[PassPoint]) -> Profile:
    """``profile`` with the terms of the module docstring fitted to ``points``.

    ``spec`` is the validation model's :class:`sim.models.ModelSpec`. The search starts from
    the profile's own values (attention terms from 1 us) and moves one term at a time by
    shrinking factors of ``e**step`` while the squared log error of the pass times falls."""
    g = profile.gpu
    x = np.log(
        [
            max(g.per_layer_overhead_s, 1e-7),
            max(g.kernel_launch_s, 1e-7),
            g.flops_fp32 * g.compute_efficiency,
            g.hbm_bandwidth,
            1e-6,
            1e-8,
            1e-9,
        ]
    )
    meas = np.log([p.mean_s for p in points])
    # each shape weighs its share of the measured time (what latencies are made of)
    share = np.array([p.count * p.mean_s for p in points])
    weight = np.sqrt(share / share.sum() * len(points))

    def terms(v: np.ndarray) -> dict[str, float]:
        return dict(zip(TERMS, (float(t) for t in np.exp(v)), strict=True))

    def loss(v: np.ndarray) -> float:
        cost = EngineCostModel(_with_terms(profile, terms(v), points), spec)
        pred = np.log([_predict(cost, p) for p in points])
        return float(np.sum((weight * (pred - meas)) ** 2))

    # a term the pass times cannot pin down (memory time ~ 0 on a cache-resident model) stops
    # at a physical ceiling instead of running off towards infinity: the flop rate at 1e17
    # FLOP/s, the bandwidth at 1e15 B/s (both far above any probe's reach)
    ceiling = np.log([np.inf, np.inf, 1e17, 1e15, np.inf, np.inf, np.inf])

    def descend(x: np.ndarray) -> tuple[np.ndarray, float]:
        best = loss(x)
        step = 1.0
        while step > 0.01:
            improved = False
            for i in range(len(x)):
                for sign in (1.0, -1.0):
                    y = x.copy()
                    y[i] = min(y[i] + sign * step, ceiling[i])
                    v = loss(y)
                    if v < best:
                        x, best, improved = y, v, True
            if not improved:
                step /= 2.0
        return x, best

    # Two starts (the profile's own terms; typical NumPy-on-CPU terms); the better fit wins.
    typical = np.log([1e-4, 5e-4, 5e10, 2e10, 1e-5, 4e-7, 1e-9])
    x, best = min((descend(x0) for x0 in (x, typical)), key=lambda r: r[1])
    out = terms(x)
    out["rms_log_error"] = float(np.sqrt(best / max(float(np.sum(weight**2)), 1.0)))
    notes = profile.notes + (
        " Compute terms fitted to whole engine iterations of the validation decoder "
        "(hwbench.engine_probe; see fitted.engine_fit)."
    )
    fitted_profile = _with_terms(profile, out, points)
    return fitted_profile.model_copy(update={"notes": notes})


def calibrate_engine(
    profile: Profile,
    xp: ModuleType = np,
    *,
    quick: bool = True,
    tiny: bool = False,
    workdir: Path | None = None,
) -> Profile:
    """Probe the engine on backend ``xp`` and return ``profile`` with the fitted terms:
    compute (:func:`fit_engine`), the prefetch path's bandwidth and the copy/compute
    interference (:func:`fetch_probe`, :func:`fit_stream`). ``tiny``: a few seconds' probe
    (tests); ``quick``: ~30 s; else more repeats."""
    from hwbench.interference import H_KEYS, KEYS
    from hwbench.validate import decoder_config, sim_catalogue

    cfg = decoder_config()
    spec = sim_catalogue(cfg)[cfg.name]
    if tiny:
        points = engine_probe(xp, runs=TINY_RUNS, repeats=1, mixed=0, workdir=workdir)
    else:
        points = engine_probe(
            xp, repeats=2 if quick else 6, mixed=1 if quick else 3, workdir=workdir
        )
    fitted = fit_engine(profile, spec, points)
    lat = profile.links.pcie.latency
    if tiny:
        probe = fetch_probe(lat, xp, requests=3, rate=1e9, seeds=1, workdir=workdir)
    else:
        probe = fetch_probe(lat, xp, seeds=4 if quick else 8, workdir=workdir)
    bw = probe.bandwidth
    links = fitted.links.model_copy(
        update={"pcie": fitted.links.pcie.model_copy(update={"bandwidth": bw, "latency": lat})}
    )
    fit = dict(fitted.fitted)
    fit["engine_fit"] = [{**fit["engine_fit"][0], "pcie_bandwidth": bw, "pcie_latency_s": lat}]
    with_link = fitted.model_copy(update={"links": links, "fitted": fit})
    terms = serving_terms(with_link, spec, probe)
    fit = dict(with_link.fitted)
    fit["engine_fit"] = [
        {
            **fit["engine_fit"][0],
            "decode_scale": terms.decode_scale,
            "wake_s": terms.wake_s,
            "wake_hide": terms.wake_hide,
            "rewarm_s": terms.rewarm_s,
            "rewarm_decay": terms.rewarm_decay,
            "iter_gap_s": terms.iter_gap_s,
        }
    ]
    with_link = with_link.model_copy(update={"fitted": fit})
    s, h, rows = fit_stream(with_link, probe, workdir)
    fit = dict(with_link.fitted)
    fit["engine_fit"] = [
        {
            **fit["engine_fit"][0],
            **dict(zip(KEYS, s, strict=True)),
            **dict(zip(H_KEYS, h, strict=True)),
        }
    ]
    fit["stream_probe"] = rows
    return with_link.model_copy(update={"fitted": fit})
