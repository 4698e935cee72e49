"""The answers of a capacity plan: frontier rows, their sentences, ``plan.json`` and the plot.

A row is one question (``min-size`` at a load, ``max-qps`` at a size) for one alternative:
the answer, its cost, the replica shape at the answer, why there is none, and the utilisation
of every resource at the boundary probe with the one that saturates first.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.study.planspec import RESOURCES, PlanFile, Probe


@dataclass
class PlanResult:
    """The frontier (one row per question x alternative x load or size) and its files."""

    frontier: pd.DataFrame
    folder: Path
    answers: list[str]
    #: a compare plan's answer (``aggregated``, ``disaggregated``, ``choice``; sim.disagg)
    compare: dict[str, Any] | None = None
    #: the pass rule over seeds, and every pair of probes that contradict monotonicity
    notes: list[str] = field(default_factory=list)


def replica_shape(sc: Any) -> dict[str, int]:
    c = sc.cluster
    return {
        "servers": c.servers,
        "gpus": c.gpus,
        "tp": c.tp,
        "pp": c.pp,
        "replicas": c.replicas,
    }


def _lookup(data: dict[str, Any], path: str) -> Any:
    cur: Any = data
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def _why_none(top: Probe, spec: PlanFile) -> str:
    """Why even the top of the size range fails: infeasible, a capacity limit, or a latency
    floor that more servers cannot lower (with the value reached there)."""
    if top.infeasible:
        return top.reasons[0]
    reached = "; ".join(r.split(": ", 1)[1] for r in top.reasons[:2])
    if top.overloaded > 0:
        return (
            f"capacity: {spec.size_key}={top.size} is overloaded at {top.qps:g} QPS "
            f"(achieved {top.achieved:.4g} req/s); raise size_range ({reached})"
        )
    return (
        f"latency floor: {spec.size_key}={top.size} sustains {top.qps:g} QPS but misses the "
        f"SLO ({reached}); more {spec.size_key} cannot lower it"
    )


#: the figures a row reports at its answer: ``column: flattened summary key`` (mean over the
#: answer probe's seeds; :data:`sim.study.planspec.ANSWER_FIGURES`)
AT_ANSWER: dict[str, str] = {
    "ttft_p50_s": "latency.ttft.p50",
    "ttft_p99_s": "latency.ttft.p99",
    "tpot_p50_s": "latency.tpot.p50",
    "tpot_p99_s": "latency.tpot.p99",
    "e2e_p50_s": "latency.e2e.p50",
    "e2e_p99_s": "latency.e2e.p99",
    "tokens_per_s_per_user": "user_tokens_per_s.p50",
    "achieved_rps": "throughput.achieved_rps",
}


def at_answer(at: Probe | None) -> dict[str, Any]:
    """The answer probe's latencies, per-user speed (median tokens/s per user), achieved
    throughput and output tokens/s per GPU (:data:`AT_ANSWER`); None each without one."""
    fig = at.figures if at is not None else {}
    out: dict[str, Any] = {col: fig.get(key) for col, key in AT_ANSWER.items()}
    tps, gpus = fig.get("throughput.output_tokens_per_s"), fig.get("gpus")
    out["tokens_per_s_per_gpu"] = tps / gpus if tps is not None and gpus else None
    return out


def frontier_row(
    question: str,
    alt: dict[str, Any],
    qps: float | None,
    size: int | None,
    boundary: Probe,
    spec: PlanFile,
    resolved: dict[str, Any],
    shape: dict[str, int] | None = None,
    at: Probe | None = None,
) -> dict[str, Any]:
    """One question's row: the answer (``size`` for min-size, ``qps`` -- the capacity -- for
    max-qps), its cost and shape, what the answer probe ``at`` measured (:func:`at_answer`),
    and the boundary probe's utilisation with the resource that saturates first."""
    answered = size if question == "min-size" else qps
    cost: float | None = None
    if spec.costs and answered is not None:
        cost = 0.0
        for k, c in spec.costs.items():
            v = size if k == spec.size_key else alt.get(k, _lookup(resolved, k))
            cost += c * float(v or 0)
    util = boundary.utilisation
    sat = max(RESOURCES, key=lambda r: util[r]) if any(util.values()) else None
    row: dict[str, Any] = {"question": question, **alt, "qps": qps, "size": size}
    shape = shape or {}
    if spec.gpu_hour_cost is not None and answered is not None and "gpus" in shape:
        cost = spec.gpu_hour_cost * shape["gpus"]
    reason = None
    if answered is None:
        reason = (
            _why_none(boundary, spec) if question == "min-size" else "; ".join(boundary.reasons[:2])
        )
    row.update(
        answered=answered is not None,
        cost=cost,
        **({k: v for k, v in shape.items()} if answered is not None else {}),
        reason=reason,
        boundary_size=boundary.size,
        boundary_qps=boundary.qps,
        boundary_passed=boundary.passed,
        boundary_pass_fraction=boundary.pass_fraction,
        saturates_first=sat,
        **{f"util_{r}": util[r] for r in RESOURCES},
    )
    row.update(at_answer(at if answered is not None else None))
    return row


#: a resource at or above this utilisation at the boundary is named as saturating
SATURATED = 0.9


def _present(v: Any) -> bool:
    return v is not None and v == v  # NaN in a frame is missing


def _busiest(resource: str, util: float) -> str:
    """``; saturates first: R (93%)`` when the busiest resource is near saturation, else
    ``; busiest: R (27%), none near saturation`` (the limit is latency, not a resource)."""
    if util >= SATURATED:
        return f"; saturates first: {resource} ({util:.0%})"
    return f"; busiest: {resource} ({util:.0%}), none near saturation"


def cost_text(cost: float, spec: PlanFile) -> str:
    """A row's cost with its unit: per hour (GPUs x ``gpu_hour_cost``) or in the units of
    the plan's ``costs`` (the sum of each knob x its cost per unit)."""
    if spec.gpu_hour_cost is not None:
        return f"cost {cost:,.4g} per hour (GPUs x {spec.gpu_hour_cost:g} per GPU-hour)"
    knobs = " + ".join(f"{k} x {c:g}" for k, c in spec.costs.items())
    return f"cost {cost:,.4g} ({knobs})"


def answer_sentence(r: dict[str, Any], spec: PlanFile) -> str:
    alt = ", ".join(f"{k}={r[k]}" for k in spec.alternatives)
    alt = f" with {alt}" if alt else ""
    sat = r.get("saturates_first")
    sat = sat if isinstance(sat, str) else None  # a frame's missing value is NaN
    blame = _busiest(sat, r[f"util_{sat}"]) if sat else ""
    cost = f", {cost_text(r['cost'], spec)}" if _present(r.get("cost")) else ""
    gpus = f" ({int(r['gpus'])} GPUs)" if _present(r.get("gpus")) and r.get("gpus") else ""
    gpus += f"; {cost[2:]}" if cost else ""
    if r["question"] == "min-size":
        if r["size"] is None or r["size"] != r["size"]:  # None, or NaN in a frame
            lo, hi = spec.size_range
            return f"{r['qps']:g} QPS{alt}: no {spec.size_key} in [{lo}, {hi}] meets the SLOs: {r['reason']}"
        return (
            f"{r['qps']:g} QPS{alt}: smallest {spec.size_key} = {int(r['size'])}{gpus}{blame}"
            f"{_there(r)}"
        )
    if r["qps"] is None or r["qps"] != r["qps"]:
        return f"{spec.size_key}={r['size']}{alt}: fails the SLOs even at {spec.qps_range[0]:g} QPS"
    top = " (top of qps_range: capacity not reached)" if r["qps"] >= spec.qps_range[1] else ""
    return f"{spec.size_key}={r['size']}{alt}: highest QPS = {r['qps']:g}{top}{blame}{_there(r)}"


def _ms(v: Any) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"


def _there(r: dict[str, Any]) -> str:
    """``; there: TTFT p50 .. / p99 .., TPOT .., E2E .., N tokens/s/user`` from a row's
    figures at its answer (empty without them)."""
    parts = []
    for name, col in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")):
        p50, p99 = r.get(f"{col}_p50_s"), r.get(f"{col}_p99_s")
        if _present(p50) and _present(p99):
            parts.append(f"{name} p50 {_ms(p50)} / p99 {_ms(p99)}")
    if _present(r.get("tokens_per_s_per_user")):
        parts.append(f"{r['tokens_per_s_per_user']:.1f} tokens/s/user")
    return f"; there: {', '.join(parts)}" if parts else ""


def plan_notes(probes: list[Probe], spec: PlanFile, n_seeds: int) -> list[str]:
    """The pass rule over seeds, then one line per failing probe that a passing probe of
    the same alternative contradicts (no larger size, no smaller load, yet it passed): the
    bisections assume monotone pass/fail, and seed noise near the boundary can break it, so
    a min-size and a max-qps answer may disagree by that much."""
    need = max(1, math.ceil(spec.min_pass_fraction * n_seeds - 1e-9))
    notes = [
        f"pass rule: a probe (size, load) passes when {need} of its {n_seeds} seeds meet "
        f"every SLO (min_pass_fraction {spec.min_pass_fraction:g}); both questions use it"
    ]
    ok = [p for p in probes if not p.infeasible]
    for f in sorted((p for p in ok if not p.passed), key=lambda p: (p.size, p.qps)):
        better = [
            p for p in ok if p.passed and p.alt == f.alt and p.size <= f.size and p.qps >= f.qps
        ]
        if not better:
            continue
        p = min(better, key=lambda p: (p.size, -p.qps))
        alt = "".join(f", {k}={v}" for k, v in f.alt.items())
        passed = round(f.pass_fraction * n_seeds)
        notes.append(
            f"not monotone{alt}: {spec.size_key}={f.size} failed at {f.qps:g} QPS ({passed} of "
            f"{n_seeds} seeds passed) while {spec.size_key}={p.size} passed at {p.qps:g} QPS: "
            "seed-to-seed noise near the boundary; more seeds narrow it"
        )
    return notes


#: frontier columns that count things (a frame holds them as floats when some are missing)
INTEGER_COLUMNS = ("size", "servers", "gpus", "tp", "pp", "replicas", "boundary_size")


def _integers(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with whole-number floats of :data:`INTEGER_COLUMNS` as ints (62, not 62.0)."""
    return {
        k: int(v) if k in INTEGER_COLUMNS and isinstance(v, float) and v.is_integer() else v
        for k, v in row.items()
    }


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The cheapest answered row (by cost, else by GPUs; the first of equals), or None."""
    ok = [r for r in rows if r["answered"]]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["cost"] if r["cost"] is not None else 0, r.get("gpus") or 0))


def chosen_row(res: PlanResult) -> dict[str, Any] | None:
    """The row of :func:`plan_json`'s ``answer`` (the cheapest passing min-size answer of the
    first load), or None (no min-size question, no passing answer, or a compare plan)."""
    if res.compare is not None or res.frontier.empty:
        return None
    ms = [r for r in res.frontier.to_dict("records") if r["question"] == "min-size"]
    return _best([r for r in ms if r["qps"] == ms[0]["qps"]]) if ms else None


def plan_json(res: PlanResult) -> dict[str, Any]:
    """The plan's answer as one JSON-ready object: ``answer`` (the cheapest passing min-size
    answer of the first load -- by cost, else by GPUs -- or, when none passes, the first
    row's reason) with ``servers``, ``gpus``, ``tp``, ``pp``, ``meets_slo``, ``reason``,
    ``qps``, ``cost``; and every row of the ``frontier``."""
    rows = json.loads(res.frontier.to_json(orient="records")) if not res.frontier.empty else []
    rows = [_integers(r) for r in rows]
    if res.compare is not None:
        return {**res.compare, "answers": res.answers, "frontier": rows, "folder": str(res.folder)}
    ms = [r for r in rows if r["question"] == "min-size"]
    answer: dict[str, Any] = {"meets_slo": False, "reason": "the plan asked no min-size question"}
    if ms:
        q0 = ms[0]["qps"]
        first = [r for r in ms if r["qps"] == q0]
        best = _best(first)
        if best is not None:
            answer = {
                "qps": q0,
                "servers": best.get("servers"),
                "gpus": best.get("gpus"),
                "tp": best.get("tp"),
                "pp": best.get("pp"),
                "replicas": best.get("replicas"),
                "cost": best["cost"],
                "meets_slo": True,
                "reason": None,
                "saturates_first": best.get("saturates_first"),
                **{k: best.get(k) for k in (*AT_ANSWER, "tokens_per_s_per_gpu")},
            }
        else:
            answer = {
                "qps": q0,
                "servers": None,
                "gpus": None,
                "tp": None,
                "pp": None,
                "meets_slo": False,
                "reason": " | ".join(r["reason"] or "" for r in first),
            }
    return {
        "answer": answer,
        "answers": res.answers,
        "notes": res.notes,
        "frontier": rows,
        "folder": str(res.folder),
    }


def plot_frontier(df: pd.DataFrame, spec: PlanFile, path: Path) -> None:
    from sim.study.plots import frontier_plot

    frontier_plot(df, spec.size_key, list(spec.alternatives), spec.qps_range[1], path)
