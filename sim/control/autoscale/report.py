"""The autoscaler's figures: GPU-hours, cost, scale-out latency, reclaim, the timeline.

:func:`summary` is the ``autoscale`` block of a run's ``summary.json``; :func:`timeline`
the per-tick frame written as ``autoscale.parquet`` and drawn as ``autoscale.png``
(:mod:`sim.study.plots`). Definitions:

* **GPU-hours**: per replica, its GPUs x the time it held them (from the decision that
  added it, or 0, to its release, or the end of the run) / 3600; **cost** = GPU-hours x
  ``gpu_hour_cost``;
* **static peak GPU-hours**: the most replicas held at once, for the whole run (the
  static provisioning that serves the same peak); **reclaim** = 1 - GPU-hours / that;
  **reclaim_vs_max** = 1 - GPU-hours / (``max_replicas`` held all run): the share of the
  budget the autoscaler gave back, a denominator two configurations with the same
  ``max_replicas`` share;
* **scale-out latency** of a new replica: from the decision that added it to the first
  token it produced (``decision_to_first_token_s``; None if it produced none), and to the
  moment it entered service (``decision_to_serving_s``);
* **SLO attainment per window**: the share of requests arriving between two ticks that met
  every objective of their class (requests not done count as missed);
* **queued while scaling**: requests queued at ticks when a replica was starting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.control.autoscale.loop import TIMELINE
from sim.serving.metrics import meets_slo

if TYPE_CHECKING:
    from sim.control.autoscale.loop import Autoscaler


def _held_intervals(a: Autoscaler, end: float) -> list[tuple[int, float, float]]:
    return [(i, t0, a.released.get(i, end)) for i, t0 in sorted(a.acquired.items())]


def peak_held(a: Autoscaler, end: float) -> int:
    """The most replicas holding GPUs at one instant over ``[0, end]``."""
    marks: list[tuple[float, int]] = []
    for _, t0, t1 in _held_intervals(a, end):
        marks.append((t0, 1))
        marks.append((max(t1, t0), -1))
    marks.sort(key=lambda x: (x[0], x[1]))  # a release before an acquisition at one instant
    held = peak = 0
    for _, d in marks:
        held += d
        peak = max(peak, held)
    return peak


def timeline(a: Autoscaler, requests: pd.DataFrame, classes: dict[str, Any]) -> pd.DataFrame:
    """One row per tick (:data:`sim.control.autoscale.loop.TIMELINE`) plus
    ``slo_attainment``: of the requests arriving since the previous tick, the share that met
    their class's objectives (NaN when none arrived)."""
    df = pd.DataFrame(a.timeline, columns=list(TIMELINE))
    if df.empty:
        df["slo_attainment"] = []
        return df
    arr = requests["arrival"].to_numpy()
    ok = np.zeros(len(requests), dtype=bool)
    done = (requests["status"] == "done").to_numpy()
    if done.any():
        ok[done] = meets_slo(requests[done], classes)
    edges = np.concatenate([[0.0], df["t"].to_numpy()])
    has = ~np.isnan(arr)
    b = np.searchsorted(edges, arr[has], side="left") - 1
    b = np.clip(b, 0, len(df) - 1)
    n = np.bincount(b, minlength=len(df)).astype(float)
    good = np.bincount(b, weights=ok[has].astype(float), minlength=len(df))
    with np.errstate(invalid="ignore", divide="ignore"):
        df["slo_attainment"] = np.where(n > 0, good / n, np.nan)
    return df


def summary(a: Autoscaler, end: float, requests: pd.DataFrame) -> dict[str, Any]:
    """The ``autoscale`` block of the run's summary (see the module docstring)."""
    g = a.gpus_per_replica
    held = _held_intervals(a, end)
    gpu_h = sum((t1 - t0) * g for _, t0, t1 in held) / 3600.0
    peak = peak_held(a, end)
    static_h = peak * g * end / 3600.0
    budget_h = a.cfg.max_replicas * g * end / 3600.0
    node_of = requests["node"].to_numpy()
    first = requests["first_token"].to_numpy()
    starts: list[dict[str, Any]] = []
    for cs in a.cold_starts:
        for idx, t in sorted(cs.times.items()):
            mine = first[node_of == idx]
            mine = mine[~np.isnan(mine)]
            ft = float(mine.min()) if mine.size else None
            d = t["decision"]
            starts.append(
                {
                    "replica": idx,
                    "source": cs.source,
                    **{k: round(v, 6) for k, v in t.items()},
                    "first_token": ft,
                    "decision_to_serving_s": t["serving"] - d if "serving" in t else None,
                    "decision_to_first_token_s": ft - d if ft is not None else None,
                }
            )
    lat = [s["decision_to_first_token_s"] for s in starts if s["decision_to_first_token_s"]]
    to_serve = [s["decision_to_serving_s"] for s in starts if s["decision_to_serving_s"]]
    scaling = [row for row in a.timeline if row[1] + row[2] > 0]
    drains = [a.released[i] - t for i, t in _drain_starts(a).items() if i in a.released]
    return {
        "policy": a.cfg.policy,
        "source": a.source,
        "provision_s": a.provision_s,
        "warmup_s": a.warmup_s,
        "events": a.events,
        "scale_outs": sum(1 for e in a.events if e["action"] == "out"),
        "scale_ins": sum(1 for e in a.events if e["action"] == "in"),
        "replicas_added": len(starts),
        "replicas_drained": len(a.released),
        "peak_replicas": peak,
        "final_replicas": sum(1 for s in a.state.values() if s not in ("released",)),
        "gpu_hours": gpu_h,
        "static_peak_gpu_hours": static_h,
        "reclaim": 1.0 - gpu_h / static_h if static_h > 0 else 0.0,
        "reclaim_vs_max": 1.0 - gpu_h / budget_h if budget_h > 0 else 0.0,
        "cost": gpu_h * a.cfg.gpu_hour_cost,
        "cold_starts": starts,
        "scale_out_s": _stats(lat),
        "decision_to_serving_s": _stats(to_serve),
        "drain_s": _stats(drains),
        "queued_while_scaling": {
            "max": max((row[6] for row in scaling), default=0),
            "mean": float(np.mean([row[6] for row in scaling])) if scaling else 0.0,
        },
    }


def _drain_starts(a: Autoscaler) -> dict[int, float]:
    """Per drained replica: when its scale-in decision came (the latest ``in`` event at or
    before its release)."""
    ins = [e["t"] for e in a.events if e["action"] == "in"]
    out: dict[int, float] = {}
    for i, t1 in a.released.items():
        before = [t for t in ins if t <= t1]
        if before:
            out[i] = max(before)
    return out


def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "max": None}
    v = np.asarray(xs, dtype=float)
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "p50": float(np.percentile(v, 50)),
        "max": float(v.max()),
    }
