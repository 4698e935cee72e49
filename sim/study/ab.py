"""A/B tests of two configurations of one scenario: paired runs and bootstrap intervals.

``A`` and ``B`` are each a list of ``KEY=VALUE`` overrides on the same scenario. Both sides
run with the same seeds, so seed ``s`` gives both sides the same arrivals and (under a chaos
schedule in the scenario) the same faults: the runs are *paired*. For every headline metric
(:func:`sim.study.sweep.flatten.headline`) the report gives the mean over seeds of each side, the mean
paired difference ``B - A`` and a percentile bootstrap 95% interval of that mean (``resamples``
resamples of the seed pairs, drawn from ``numpy.random.default_rng(boot_seed)`` -- the
interval is reproducible). A verdict is given only where the interval excludes zero: "B better"
/ "B worse" for metrics with a known direction (latency lower is better, hit rate higher is
better...), otherwise "B higher" / "B lower". The relative effect ``mean(B) / mean(A) - 1``
(a ratio of means over the same seeds) gets its own percentile interval from the same
resampled pairs (:func:`paired_relative_bootstrap`); it is undefined (``None``) where the mean
of A is zero.

A and B that resolve to the same run configuration (equal config hashes on every seed) are
refused with :class:`InputError`: such a test can only print zeros.

Pairs where either run failed or the metric is undefined (e.g. no request of a class
finished) are left out of that metric; ``n`` says how many pairs remain. Runs go through the
sweep machinery (cached by config hash under the output folder).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.errors import InputError
from sim.feasible import check_runnable
from sim.study.sweep.execute import Progress, Runner, results_frame, write_parquet
from sim.study.sweep.flatten import direction, headline
from sim.study.sweep.resultcache import RunCache, write_atomic
from sim.study.sweep.spec import Point, build_points


@dataclass(frozen=True)
class MetricDiff:
    """One metric of an A/B comparison (``diff``, ``ci_low``, ``ci_high`` are of B - A)."""

    metric: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    verdict: str | None
    #: ``mean_b / mean_a - 1`` and its 95% interval (fractions); ``None`` where ``mean_a`` is 0
    rel: float | None = None
    rel_low: float | None = None
    rel_high: float | None = None


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    rng: np.random.Generator,
    resamples: int = 2000,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Mean of ``b - a`` and its percentile bootstrap interval at ``level``.

    The pairs (a_i, b_i) are resampled with replacement ``resamples`` times; the interval is
    the (1-level)/2 and (1+level)/2 quantiles of the resampled means. Needs >= 2 pairs.
    """
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    n = d.size
    if n < 2:
        raise ValueError("a paired bootstrap needs at least 2 pairs")
    idx = rng.integers(0, n, size=(resamples, n))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    mean = float(d.mean())
    # quantiles of a constant sample may differ from it by rounding; keep lo <= mean <= hi
    return mean, float(min(lo, mean)), float(max(hi, mean))


def paired_relative_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    rng: np.random.Generator,
    resamples: int = 2000,
    level: float = 0.95,
) -> tuple[float, float, float] | None:
    """``mean(b) / mean(a) - 1`` over the pairs and its percentile bootstrap interval.

    The pairs are resampled together, ``resamples`` times, and the ratio of the resampled means
    taken each time; the interval is the (1-level)/2 and (1+level)/2 quantiles of those ratios
    minus one (clamped to contain the estimate). ``None`` when ``mean(a)`` is zero or a
    resample's mean of ``a`` is (the ratio is then undefined). Needs >= 2 pairs.
    """
    av = np.asarray(a, dtype=float)
    bv = np.asarray(b, dtype=float)
    n = av.size
    if n < 2 or bv.size != n:
        raise ValueError("a paired bootstrap needs at least 2 pairs of equal length")
    ma = float(av.mean())
    if ma == 0.0:
        return None
    idx = rng.integers(0, n, size=(resamples, n))
    den = av[idx].mean(axis=1)
    if np.any(den == 0.0):
        return None
    ratios = bv[idx].mean(axis=1) / den - 1.0
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    rel = float(bv.mean()) / ma - 1.0
    return rel, float(min(lo, rel)), float(max(hi, rel))


def _verdict(metric: str, lo: float, hi: float) -> str | None:
    if lo <= 0.0 <= hi:
        return None
    up = lo > 0
    sign = direction(metric)
    if sign == 0:
        return "B higher" if up else "B lower"
    return "B better" if (sign > 0) == up else "B worse"


def compare(
    frame_a: pd.DataFrame,
    frame_b: pd.DataFrame,
    metrics: list[str] | None = None,
    resamples: int = 2000,
    boot_seed: int = 0,
) -> list[MetricDiff]:
    """Paired comparison of two per-seed frames (rows matched on ``seed``; only "ok" rows).

    ``metrics`` defaults to the headline metrics present in both frames. Metrics with fewer
    than 2 complete pairs are skipped. One generator seeded ``boot_seed`` serves all metrics,
    in order, so the report is reproducible.
    """
    ok_a = frame_a[frame_a["status"] == "ok"].set_index("seed")
    ok_b = frame_b[frame_b["status"] == "ok"].set_index("seed")
    seeds = sorted(set(ok_a.index) & set(ok_b.index))
    if metrics is None:
        common = [c for c in ok_a.columns if c in set(ok_b.columns)]
        metrics = headline(common)
    rng = np.random.default_rng(boot_seed)
    out: list[MetricDiff] = []
    for m in metrics:
        if m not in ok_a.columns or m not in ok_b.columns:
            continue
        a = pd.to_numeric(ok_a.loc[seeds, m], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(ok_b.loc[seeds, m], errors="coerce").to_numpy(dtype=float)
        keep = np.isfinite(a) & np.isfinite(b)
        if keep.sum() < 2:
            continue
        a, b = a[keep], b[keep]
        diff, lo, hi = paired_bootstrap(a, b, rng, resamples)
        rel = paired_relative_bootstrap(a, b, rng, resamples) or (None, None, None)
        out.append(
            MetricDiff(
                m, int(keep.sum()), float(a.mean()), float(b.mean()), diff, lo, hi,
                _verdict(m, lo, hi), *rel,
            )
        )  # fmt: skip
    return out


@dataclass
class AbResult:
    """An A/B report: the per-metric differences, the per-seed runs, and where they went."""

    diffs: list[MetricDiff]
    runs: pd.DataFrame
    failed: list[dict[str, Any]]
    folder: Path

    def to_frame(self) -> pd.DataFrame:
        """The differences as a DataFrame (one row per metric)."""
        return pd.DataFrame([asdict(d) for d in self.diffs])


def ab_points(
    scenario: str | Path,
    a: list[str],
    b: list[str],
    seeds: list[int],
    base: list[str] | None = None,
    variant: str | None = None,
) -> tuple[list[Point], list[Point]]:
    """The A and B points (same seeds); every override is validated before anything runs.

    :class:`InputError` when fewer than 2 seeds are given or when A and B resolve to the same
    configuration (nothing would differ but the label)."""
    if len(seeds) < 2:
        raise InputError(f"--seeds {len(seeds)}: an A/B test needs at least 2 seeds")
    base = list(base or [])
    pa = _side_points(scenario, seeds, base, a, variant, "A")
    pb = _side_points(scenario, seeds, base, b, variant, "B")
    for side, pts in (("A", pa), ("B", pb)):  # profile, models and shape, before any run
        try:
            check_runnable(pts[0].scenario)
        except InputError as err:
            raise SideError(err, side) from None
    if [p.config_hash for p in pa] == [p.config_hash for p in pb]:
        shown = " ".join(a) or "(none)", " ".join(b) or "(none)"
        raise InputError(
            f"--a {shown[0]} / --b {shown[1]}: A and B resolve to the same configuration; "
            "change a field on one side"
        )
    return pa, pb


class SideError(InputError):
    """Bad input found while building side ``side`` (``"A"`` or ``"B"``) of an A/B test."""

    def __init__(self, err: InputError, side: str) -> None:
        super().__init__(str(err))
        self.source, self.where, self.side = err.source, err.where, side


def _side_points(
    scenario: str | Path,
    seeds: list[int],
    base: list[str],
    over: list[str],
    variant: str | None,
    side: str,
) -> list[Point]:
    """The points of one side; an error in them is a :class:`SideError` naming the side."""
    try:
        return build_points(
            scenario, {}, seeds, [*base, *over], variant, source=f"{scenario} ({side})"
        )
    except InputError as err:
        raise SideError(err, side) from None


def run_ab(
    scenario: str | Path,
    a: list[str],
    b: list[str],
    seeds: list[int],
    out: str | Path,
    *,
    base: list[str] | None = None,
    variant: str | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    resamples: int = 2000,
    boot_seed: int = 0,
    progress: Progress | None = None,
    points: tuple[list[Point], list[Point]] | None = None,
    inputs_hash: str | None = None,
) -> AbResult:
    """Run both sides and compare them; writes ``runs.parquet`` (per seed and side),
    ``ab.parquet`` (per metric), ``ab.json`` (inputs, their hash ``inputs_hash`` and the
    report) and ``ab.png`` (B - A per metric with its interval) under ``out``. ``points``:
    what :func:`ab_points` returned for these arguments (else it is called here)."""
    if resamples < 100:
        raise InputError(f"--resamples {resamples}: use at least 100")
    pa, pb = points if points is not None else ab_points(scenario, a, b, seeds, base, variant)
    folder = Path(out)
    cache = RunCache(folder)
    with Runner(workers, scheduler) as runner:
        batch = runner.run([*pa, *pb], cache, progress=progress)
    fa = results_frame(pa, batch.records)
    fb = results_frame(pb, batch.records)
    diffs = compare(fa, fb, resamples=resamples, boot_seed=boot_seed)
    runs = pd.concat([fa.assign(side="A"), fb.assign(side="B")], ignore_index=True)
    res = AbResult(diffs, runs, batch.failed, folder)
    write_parquet(runs, folder / "runs.parquet")
    write_parquet(res.to_frame(), folder / "ab.parquet")
    report = {
        "scenario": str(scenario),
        "inputs_hash": inputs_hash or ab_digest(pa, pb, resamples, boot_seed),
        "a": a,
        "b": b,
        "base": list(base or []),
        "seeds": seeds,
        "resamples": resamples,
        "boot_seed": boot_seed,
        "level": 0.95,
        "failed": [{k: r.get(k) for k in ("config_hash", "seed", "error")} for r in batch.failed],
        "metrics": [asdict(d) for d in diffs],
    }
    write_atomic(folder / "ab.json", json.dumps(report, indent=1) + "\n")
    from sim.study.plots import ab_plot

    ab_plot(diffs, folder / "ab.png", f"{Path(scenario).stem}: B - A over {len(seeds)} seeds")
    return res


def ab_digest(pa: list[Point], pb: list[Point], resamples: int, boot_seed: int) -> str:
    """A short hash of everything that decides an A/B report: both sides' run configs (their
    config hashes, seeds included), the resamples and the bootstrap seed."""
    import hashlib

    blob = json.dumps(
        [[p.config_hash for p in pa], [p.config_hash for p in pb], resamples, boot_seed]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
