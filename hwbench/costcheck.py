"""The cost-model check: the profile's price of each engine iteration against its measured time.

Every iteration of every engine run of a validation workload (none of them a calibration
workload: :mod:`hwbench.workloads`) is priced as the simulator prices it -- the profile's
iteration cost (:func:`sim.serving.itercost.iteration_seconds` of
:class:`sim.serving.costmodel.CostModel` ``iteration``) plus ``wake_s`` for an iteration after
an idle spell (:func:`hwbench.engine_probe.after_idle`) -- and compared with what it took on the
engine: its whole ``seconds`` when every weight is resident (the simulator then charges no wait
for weights, so the price must cover the engine's pins and lookups, which it books as
``param_wait``), its ``seconds - param_wait`` when weights stream (the simulator's fetch path
models those waits; copies are the end-to-end check's).
The serving loop's gap between iterations (``iter_gap_s``) is in neither.

Iterations are grouped by phase (:func:`engine.kv.admission.iteration_kind`, after-idle
prefills apart) and batch shape (:func:`shape_key`). Per group: the iterations' count, the
median measured and predicted milliseconds, the error (median over the iterations of
``predicted / measured - 1``) and the engine's own repeat spread next to it: the coefficient of
variation over the runs of each run's median ``measured / predicted`` (what the engine moves
on its own between runs of the same arrivals). A group of at least :data:`MIN_ITERATIONS`
iterations is judged against :data:`COST_LIMIT`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.kv.admission import iteration_kind
from engine.runtime.engine import EngineResult, IterationRecord
from hwbench.engine_probe import after_idle
from hwbench.validation_models import model_config, sim_catalogue
from hwbench.workloads import ValidationWorkload
from sim.serving.costmodel import CostModel, Profile
from sim.serving.itercost import iteration_seconds

__all__ = ["COST_LIMIT", "MIN_ITERATIONS", "CostRow", "cost_rows", "price", "shape_key"]

#: the largest error of a group's price (median over its iterations) judged a pass
COST_LIMIT = 0.10
#: a group with fewer iterations is reported, not judged
MIN_ITERATIONS = 5

_BATCH_EDGES = ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (16, "9-16"))
_PROMPT_EDGES = ((128, "<=128"), (256, "129-256"), (512, "257-512"))


def _bucket(x: int, edges: tuple[tuple[int, str], ...], above: str) -> str:
    for hi, label in edges:
        if x <= hi:
            return label
    return above


def shape_key(rec: IterationRecord, idle: bool) -> str:
    """The group of one iteration: its phase (``decode``, ``prefill``, ``mixed``; a prompt
    after an idle spell ``... after idle``), its prompt tokens (buckets up to 128, 256, 512,
    more) and its decode batch (1, 2, 3-4, 5-8, 9-16, more)."""
    kind = iteration_kind(int(rec.prompt_tokens), int(rec.decode_batch))
    parts = [kind + (" after idle" if idle and kind != "decode" else "")]
    if rec.prompt_tokens:
        parts.append("p" + _bucket(int(rec.prompt_tokens), _PROMPT_EDGES, ">512"))
    if rec.decode_batch:
        parts.append("b" + _bucket(int(rec.decode_batch), _BATCH_EDGES, ">16"))
    return " ".join(parts)


def price(cost: CostModel, rec: IterationRecord, idle: bool) -> float:
    """Seconds the simulator charges for ``rec``'s batch: the iteration cost, plus
    ``wake_s`` after an idle spell (``idle``)."""
    s = iteration_seconds(
        cost.iteration,
        int(rec.prompt_tokens),
        float(rec.prompt_sq_tokens),
        int(rec.new),
        int(rec.decode_batch),
        float(rec.decode_context),
    )
    return s + (cost.wake_s if idle else 0.0)


@dataclass(frozen=True)
class CostRow:
    """One group of one workload (see the module docstring); milliseconds and ratios."""

    workload: str
    group: str
    iterations: int
    measured_ms: float
    predicted_ms: float
    error: float
    run_spread: float
    #: iterations left out: their measured compute read 0 or less (a stalled run clock)
    unmeasured: int = 0

    @property
    def verdict(self) -> str:
        """``ok`` / ``OVER`` against :data:`COST_LIMIT`; ``few`` below
        :data:`MIN_ITERATIONS` iterations (not judged)."""
        if self.iterations < MIN_ITERATIONS or not math.isfinite(self.error):
            return "few"
        return "ok" if abs(self.error) <= COST_LIMIT else "OVER"


def cost_rows(
    w: ValidationWorkload, profile: Profile, runs: Sequence[EngineResult]
) -> list[CostRow]:
    """The cost-model table of ``w`` over its engine ``runs``, one row per group, groups in
    order of their first appearance."""
    cfg = model_config(w)
    cost = CostModel(profile, sim_catalogue(cfg)[cfg.name])
    resident = w.hbm_fraction >= 1.0  # the simulator charges no weight wait: price it all
    meas: dict[str, list[float]] = {}
    pred: dict[str, list[float]] = {}
    per_run: dict[str, list[list[float]]] = {}
    for k, run in enumerate(runs):
        log = run.iteration_log
        for rec, idle in zip(log, after_idle(log), strict=True):
            key = shape_key(rec, idle)
            m = float(rec.seconds) - (0.0 if resident else float(rec.param_wait))
            p = price(cost, rec, idle)
            meas.setdefault(key, []).append(m)
            pred.setdefault(key, []).append(p)
            runs_of = per_run.setdefault(key, [[] for _ in runs])
            if m > 0 and p > 0:
                runs_of[k].append(m / p)
    rows = []
    for key, ms in meas.items():
        m_arr, p_arr = np.asarray(ms), np.asarray(pred[key])
        ok = m_arr > 0  # a run clock that stalled (clamped after a booked CPU wait) reads 0
        ratios = [float(np.median(r)) for r in (np.asarray(x) for x in per_run[key]) if r.size]
        ratios = [x for x in ratios if math.isfinite(x) and x > 0]
        spread = float(np.std(ratios) / np.mean(ratios)) if len(ratios) > 1 else math.nan
        err = float(np.median(p_arr[ok] / m_arr[ok] - 1.0)) if ok.any() else math.nan
        rows.append(
            CostRow(
                w.name,
                key,
                int(ok.sum()),
                float(np.median(m_arr[ok])) * 1e3 if ok.any() else math.nan,
                float(np.median(p_arr)) * 1e3,
                err,
                spread,
                int((~ok).sum()),
            )
        )
    return rows
