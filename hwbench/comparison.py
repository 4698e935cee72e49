"""The validation's figures: the engine's and the simulator's request tables compared.

:func:`compare` turns both sides' request tables (columns ``status``, ``arrival``,
``first_token``, ``end``; only rows with status ``done`` count) and their per-tier hit and
byte counts (indexed as :data:`engine.runtime.weights.TIER_NAMES`) into one
:class:`Comparison`:

* **accuracy** -- latency and TTFT (P50, P99, mean) and throughput, each with the relative
  error ``(sim - engine) / engine`` (0 when both are 0, infinite when only the engine's is);
* **the engine against itself** -- with several engine runs of the same arrivals, each
  latency and TTFT figure's coefficient of variation over the runs (each run's own figure:
  :attr:`Comparison.run_cv`): how far the engine moves on its own, to read an error next to;
* **consistency** -- hit rate per tier (absolute difference) and bytes per chunk access per
  tier below the device (relative error): the same cache code on the same accesses, so these
  must agree; totals are not compared, since the iteration count follows timing.

:func:`median_requests` combines several engine runs of the same arrivals into one table;
:func:`plot_cdfs` draws the latency CDFs of both sides.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.runtime.weights import TIER_NAMES

__all__ = ["Comparison", "compare", "median_requests", "plot_cdfs", "run_cv"]

#: one row of a comparison: (metric, engine, sim, error, kind: "rel" or "abs")
Row = tuple[str, float, float, float, str]

_STATS: tuple[tuple[str, Callable[[np.ndarray], float]], ...] = (
    ("p50", lambda x: float(np.percentile(x, 50))),
    ("p99", lambda x: float(np.percentile(x, 99))),
    ("mean", lambda x: float(np.mean(x))),
)


@dataclass
class Comparison:
    """Figures of one workload: ``rows`` of (metric, engine, sim, error, kind), both sides'
    latencies (seconds, requests done) for the CDF plot, and ``run_cv``: per latency and
    TTFT metric, the coefficient of variation (population standard deviation over mean) of
    that figure over the engine runs, each run's own (empty with one run)."""

    workload: str
    rows: list[Row]
    engine_latency: np.ndarray
    sim_latency: np.ndarray
    run_cv: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """``{"workload": name, metric: {"engine", "sim", "rel_error" or "abs_error"}}``,
        plus ``"engine_run_cv"`` where :attr:`run_cv` has the metric; figures to 6
        significant digits, non-finite ones as ``None``."""
        out: dict[str, Any] = {"workload": self.workload}
        for name, e, s, err, kind in self.rows:
            out[name] = {"engine": _num(e), "sim": _num(s)}
            out[name]["abs_error" if kind == "abs" else "rel_error"] = _num(err)
            if name in self.run_cv:
                out[name]["engine_run_cv"] = _num(self.run_cv[name])
        return out

    def errors(self) -> dict[str, float]:
        """``{metric_error: value}``: relative errors and hit-rate absolute differences."""
        return {
            f"{n}_{'abs_error' if k == 'abs' else 'rel_error'}": e for n, _, _, e, k in self.rows
        }


def _num(x: float) -> float | None:
    return float(f"{x:.6g}") if math.isfinite(x) else None


def _rel(e: float, s: float) -> float:
    if e == 0:
        return 0.0 if s == 0 else math.inf
    return (s - e) / e


def _delays(df: pd.DataFrame, col: str) -> np.ndarray:
    """Seconds from arrival to ``col`` of the requests done."""
    d = df[df["status"] == "done"]
    out: np.ndarray = (d[col] - d["arrival"]).to_numpy(dtype=float)
    return out


def _throughput(df: pd.DataFrame) -> float:
    """Requests done per second of the run (up to the last one's end)."""
    d = df[df["status"] == "done"]
    return len(d) / float(d["end"].max()) if len(d) else 0.0


def _tier_rows(
    eng_hits: np.ndarray, eng_bytes: np.ndarray, sim_hits: np.ndarray, sim_bytes: np.ndarray
) -> list[Row]:
    """Hit rate per tier, then bytes per chunk access (HBM hits plus fetches) per tier below
    the device; a tier neither side touched has no row."""
    rows: list[Row] = []
    he = eng_hits / max(eng_hits.sum(), 1.0)
    hs = sim_hits / max(sim_hits.sum(), 1.0)
    for i, t in enumerate(TIER_NAMES):
        if eng_hits[i] or sim_hits[i]:
            rows.append((f"hit_rate_{t}", float(he[i]), float(hs[i]), float(hs[i] - he[i]), "abs"))
    for i, t in enumerate(TIER_NAMES):
        if i and (eng_bytes[i] or sim_bytes[i]):
            be = float(eng_bytes[i]) / max(float(eng_hits.sum()), 1.0)
            bs = float(sim_bytes[i]) / max(float(sim_hits.sum()), 1.0)
            rows.append((f"bytes_per_access_{t}", be, bs, _rel(be, bs), "rel"))
    return rows


def compare(
    name: str,
    eng: pd.DataFrame,
    eng_hits: np.ndarray,
    eng_bytes: np.ndarray,
    sim: pd.DataFrame,
    sim_hits: np.ndarray,
    sim_bytes: np.ndarray,
    runs: list[pd.DataFrame] | None = None,
) -> Comparison:
    """The comparison table of workload ``name`` (see the module docstring); ``runs``: the
    engine's single runs ``eng`` was combined from (:func:`median_requests`), for
    :attr:`Comparison.run_cv` (two or more)."""
    rows: list[Row] = []
    le, ls = _delays(eng, "end"), _delays(sim, "end")
    te, ts = _delays(eng, "first_token"), _delays(sim, "first_token")
    for label, a, b in (("latency", le, ls), ("ttft", te, ts)):
        for stat, f in _STATS:
            ve, vs = (f(a) if a.size else math.nan), (f(b) if b.size else math.nan)
            rows.append((f"{label}_{stat}", ve, vs, _rel(ve, vs), "rel"))
    re_, rs = _throughput(eng), _throughput(sim)
    rows.append(("throughput_rps", re_, rs, _rel(re_, rs), "rel"))
    rows.extend(_tier_rows(eng_hits, eng_bytes, sim_hits, sim_bytes))
    return Comparison(name, rows, le, ls, run_cv(runs) if runs and len(runs) > 1 else {})


def run_cv(runs: list[pd.DataFrame]) -> dict[str, float]:
    """Per latency and TTFT metric (``latency_p50`` ...), the coefficient of variation of
    each run's own figure over ``runs`` (population standard deviation over mean; 0 when
    the mean is 0); a metric some run has no requests done for is left out."""
    out: dict[str, float] = {}
    for label, col in (("latency", "end"), ("ttft", "first_token")):
        delays = [_delays(r, col) for r in runs]
        if any(d.size == 0 for d in delays):
            continue
        for stat, f in _STATS:
            vals = np.array([f(d) for d in delays])
            mean = float(vals.mean())
            out[f"{label}_{stat}"] = float(vals.std()) / mean if mean else 0.0
    return out


def median_requests(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One engine request table from several runs of the same arrivals: each request's start,
    first-token and end times are the arrival plus the median over the runs of its own delay
    to them. A request not done in every run keeps the first run's row. Raises
    ``ValueError`` when ``frames`` is empty.

    The runs serve the very same requests, so a request's median is its typical latency: a
    slow spell of the machine in one run moves it only if it hits the same request in most
    runs, while what the arrivals cause -- requests that meet and batch -- is there in every
    run. Percentiles of a single run, or the median of the runs' percentiles, let such a
    spell become the workload's P99."""
    if not frames:
        raise ValueError("no engine runs to combine")
    out = frames[0].copy()
    if len(frames) == 1:
        return out
    done = np.logical_and.reduce([f["status"].to_numpy() == "done" for f in frames])
    arrival = out["arrival"].to_numpy(dtype=float)
    for col in ("start", "first_token", "end"):
        delay = np.median([f[col].to_numpy(dtype=float) - arrival for f in frames], axis=0)
        out.loc[done, col] = arrival[done] + delay[done]
    return out


def plot_cdfs(comps: list[Comparison], path: Path) -> Path:
    """Write a PNG with the engine's and the simulator's latency CDF for each workload to
    ``path`` (its folder created if missing) and return ``path``."""
    from sim.study.plots import figure_with_axes

    n = len(comps)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = figure_with_axes(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
    for ax, c in zip(axes.ravel(), comps, strict=False):
        for data, label, style in ((c.engine_latency, "engine", "-"), (c.sim_latency, "sim", "--")):
            x = np.sort(data)
            ax.plot(x, np.arange(1, x.size + 1) / max(x.size, 1), style, label=label)
        ax.set_title(c.workload, fontsize=9)
        ax.set_xlabel("latency (s)")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=8)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
