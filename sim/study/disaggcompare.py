"""``pdsim plan`` in compare mode: aggregated vs disaggregated at one load (a plan file with
a ``compare`` section; the plan's first ``qps`` is the load, its ``slo`` the objectives).

Search, per family, over the candidates of :mod:`sim.study.disaggcandidates` within
``gpu_budget`` GPUs:

1. **Analytic bounds first.** Candidates that do not fit memory, whose capacity estimate is
   below ``bound_margin`` x the load, or whose TPOT floor is above a TPOT limit are dropped
   without a run.
2. **Bisection over GPU counts.** The distinct GPU counts left form a ladder; at each rung
   the candidate with the highest bound (the analytic best split) represents it. Assuming
   more GPUs never hurt, bisect for the smallest passing rung (top of the ladder first: if it
   fails the family has no answer). Then up to ``extra_per_rung`` more candidates of that
   rung run (the next-best bounds) and the best passing one is the family's answer.
3. Both families' probes of a round run as one batch (Dask with ``--workers N``), each a
   duration-bounded run of the plan's scenario (``workload.duration``) on every seed, cached
   by config hash under ``OUT/runs`` like every plan.

A candidate passes when every seed passes :func:`sim.study.planspec.run_passes`. **Throughput per GPU**
is the steady window's goodput (requests meeting every class objective per second) over
the candidate's GPUs, mean over seeds. The family's best is the passing candidate with the
highest throughput per GPU (ties: fewer GPUs, then lower P99 TPOT); the **choice** is the
family whose best is higher (``aggregated`` on a tie; ``none`` if neither passes).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from engine.limits import CheckedModel
from sim.study.disaggcandidates import Bounds, Candidate, aggregated, disaggregated

#: a tensor-parallel degree a compare family may use (as `cluster.tp`)
TpDegree = Annotated[int, Field(ge=1, le=512)]
TpList = Annotated[list[TpDegree], Field(min_length=1)]

FAMILIES: tuple[str, ...] = ("aggregated", "disaggregated")


class CompareCfg(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """The `compare` section of a plan file: what each family may use."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    gpu_budget: int = Field(64, ge=1, le=4096)
    """Most GPUs any candidate may use (both families)."""
    aggregated_tp: TpList = [1, 2, 4, 8]
    """Tensor-parallel degrees of aggregated replicas (whole servers of them), each 1..512."""
    prefill_tp: TpList = [1, 2, 4, 8]
    """Tensor-parallel degrees of prefill replicas, each 1..512."""
    decode_tp: TpList = [1, 2, 4, 8]
    """Tensor-parallel degrees of decode replicas, each 1..512."""
    max_replicas: int = Field(16, ge=1, le=256)
    """Most replicas in one pool of a disaggregated candidate (an aggregated one: twice this)."""
    placement: str = "packed"
    """`disaggregation.placement` of the disaggregated candidates (`packed` or `split`)."""
    extra_per_rung: int = Field(2, ge=0, le=16)
    """Other candidates run at the smallest passing GPU count, best bounds first."""
    bound_margin: float = Field(0.5, gt=0, le=1)
    """A candidate runs only when its analytic capacity estimate is at least this x the load,
    in (0, 1]: the estimate costs prefill and decode apart, so a fused iteration can beat it."""


def _tpot_limits(slo: Any) -> list[float]:
    return [v for kind, _, _, v in slo.limits() if kind == "tpot"]


def _mean(ms: list[dict[str, Any] | None], key: str) -> float | None:
    vals = [float(m[key]) for m in ms if m is not None and m.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


class Compare:
    """One compare plan (see the module docstring). ``evaluate(cands)`` runs candidates'
    seeds and returns whether each passed (memoised by label)."""

    def __init__(self, spec: Any, planner: Any, qps: float) -> None:
        self.spec, self.pl, self.qps = spec, planner, qps
        self.cfg: CompareCfg = spec.compare
        self.done: dict[str, tuple[Candidate, bool, list[str]]] = {}

    def points(self, c: Candidate) -> list[Any]:
        alt = dict(c.overrides)
        alt[self.spec.qps_key] = self.qps
        from sim.study.sweep.spec import build_points

        grid = {k: [v] for k, v in alt.items()}
        return build_points(
            self.pl.scenario, grid, self.pl.seeds, self.pl.base, self.spec.variant, source="plan"
        )

    def evaluate(self, cands: list[Candidate]) -> list[bool]:
        from sim.study.planspec import run_passes

        todo = [c for c in cands if c.label not in self.done]
        pts_of = {c.label: self.points(c) for c in todo}
        allp = [p for ps in pts_of.values() for p in ps]
        if allp:
            if self.pl.progress is not None:
                self.pl.progress(", ".join(c.label for c in todo))
            batch = self.pl.runner.run(allp, self.pl.cache, progress=self.pl.run_progress)
            for c in todo:
                ok_all, why = True, []
                c.metrics = []
                for p in pts_of[c.label]:
                    rec = batch.records.get(p.config_hash)
                    m = rec["metrics"] if rec is not None and rec.get("status") == "ok" else None
                    ok, w = run_passes(m, self.spec.slo)
                    ok_all = ok_all and ok
                    why += [f"seed {p.seed}: {x}" for x in w]
                    c.metrics.append(m)
                self.done[c.label] = (c, ok_all, why)
        return [self.done[c.label][1] for c in cands]

    def search(self, fams: dict[str, list[Candidate]]) -> dict[str, Candidate | None]:
        """Bisection over each family's GPU ladder, families in lockstep; then up to
        ``extra_per_rung`` more candidates of each answer's rung; the best passing candidate
        of each family (:meth:`_rank`), ``None`` where none passed."""
        ladders = {f: _ladder(cands) for f, cands in fams.items()}
        extra: list[Candidate] = []
        for f, rung in self._bisect(ladders).items():
            if rung is not None:
                extra += ladders[f][rung][1 : 1 + self.cfg.extra_per_rung]
        if extra:
            self.evaluate(extra)
        best: dict[str, Candidate | None] = {}
        for f in fams:
            passing = [c for c, ok, _ in self.done.values() if ok and c.family == f]
            best[f] = max(passing, key=self._rank) if passing else None
        return best

    def _bisect(self, ladders: dict[str, list[list[Candidate]]]) -> dict[str, int | None]:
        """Each family's lowest passing rung (``None``: its top rung fails or it has none),
        probing the first candidate of a rung; one :meth:`evaluate` per round for all
        families still searching."""
        # per family: lo (failing rung or -1), hi (passing rung), top (top not yet probed)
        # invariant once bisecting: rung lo fails (-1: none probed), rung hi passes
        lo = {f: -1 for f in ladders}
        hi = {f: len(lad) - 1 for f, lad in ladders.items()}
        top = {f: True for f in ladders}
        result: dict[str, int | None] = {f: None for f, lad in ladders.items() if not lad}
        while len(result) < len(ladders):
            want = {
                f: hi[f] if top[f] else (lo[f] + hi[f]) // 2 for f in ladders if f not in result
            }
            oks = self.evaluate([ladders[f][r][0] for f, r in want.items()])
            for (f, r), ok in zip(want.items(), oks, strict=True):
                if top[f] and not ok:
                    result[f] = None
                    continue
                if top[f]:
                    top[f] = False
                elif ok:
                    hi[f] = r
                else:
                    lo[f] = r
                if hi[f] - lo[f] <= 1:
                    result[f] = hi[f]
        return result

    def _rank(self, c: Candidate) -> tuple[float, int, float]:
        tpg = self.per_gpu(c) or 0.0
        tpot = _mean(c.metrics, "latency.tpot.p99") or math.inf
        return (round(tpg, 9), -c.gpus, -tpot)

    def per_gpu(self, c: Candidate) -> float | None:
        good = _mean(c.metrics, "goodput_rps")
        return good / c.gpus if good is not None else None


def _ladder(cands: list[Candidate]) -> list[list[Candidate]]:
    """Candidates grouped by GPU count, ascending; in a rung, highest analytic bound first."""
    by_g: dict[int, list[Candidate]] = {}
    for c in cands:
        by_g.setdefault(c.gpus, []).append(c)
    return [sorted(by_g[g], key=lambda c: (-c.bound_rps, c.label)) for g in sorted(by_g)]


def candidates(spec: Any, sc: Any) -> tuple[dict[str, list[Candidate]], list[Candidate]]:
    """Each family's runnable candidates, and the ones the analytic bounds dropped."""
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    cfg: CompareCfg = spec.compare
    gps = sc.cluster.gpus_per_server
    qps = spec.qps[0]
    raw = aggregated(cfg.aggregated_tp, gps, cfg.gpu_budget, 2 * cfg.max_replicas) + disaggregated(
        cfg.prefill_tp, cfg.decode_tp, cfg.max_replicas, gps, cfg.gpu_budget, cfg.placement
    )
    bounds = Bounds(sc, load_catalogue(sc.catalogue), load_profile(sc.profile), CostModel)
    tpot = _tpot_limits(spec.slo)
    keep: dict[str, list[Candidate]] = {f: [] for f in FAMILIES}
    dropped: list[Candidate] = []
    for c in raw:
        bounds.apply(c)
        low = c.bound_rps < cfg.bound_margin * qps
        if c.infeasible or low or (tpot and c.tpot_floor_s > min(tpot)):
            dropped.append(c)
        else:
            keep[c.family].append(c)
    return keep, dropped


def row(c: Candidate, passed: bool | None, why: list[str], per_gpu: float | None) -> dict[str, Any]:
    """One frontier row."""
    ms = c.metrics
    return {
        "family": c.family,
        "candidate": c.label,
        "gpus": c.gpus,
        "prefill_replicas": c.prefill["replicas"] if c.prefill else None,
        "prefill_tp": c.prefill["tp"] if c.prefill else None,
        "decode_replicas": c.decode["replicas"],
        "decode_tp": c.decode["tp"],
        "bound_rps": c.bound_rps,
        "ran": passed is not None,
        "meets_slo": bool(passed),
        "throughput_per_gpu": per_gpu,
        "goodput_rps": _mean(ms, "goodput_rps"),
        "achieved_rps": _mean(ms, "throughput.achieved_rps"),
        "ttft_p99_s": _mean(ms, "latency.ttft.p99"),
        "tpot_p99_s": _mean(ms, "latency.tpot.p99"),
        "e2e_p99_s": _mean(ms, "latency.e2e.p99"),
        "reason": "; ".join(why[:2]) if why else (c.infeasible or None),
    }


def answer(c: Candidate | None, per_gpu: float | None, ms_ok: bool) -> dict[str, Any]:
    """A family's best in the ``--json`` shape."""
    if c is None:
        return {"gpus": None, "prefill": None, "decode": None, "throughput_per_gpu": None,
                "meets_slo": False}  # fmt: skip
    out: dict[str, Any] = {"gpus": c.gpus}
    if c.prefill is not None:
        out["prefill"] = dict(c.prefill)
    out["decode"] = dict(c.decode)
    out.update(
        throughput_per_gpu=per_gpu,
        meets_slo=ms_ok,
        tpot_p99_s=_mean(c.metrics, "latency.tpot.p99"),
        ttft_p99_s=_mean(c.metrics, "latency.ttft.p99"),
    )
    return out


def run_compare(spec: Any, planner: Any) -> tuple[pd.DataFrame, dict[str, Any], list[str]]:
    """Run the search; returns (frontier frame, the JSON answer, answer sentences)."""
    qps = spec.qps[0]
    sc = planner.points({}, spec.size_range[0], qps)[0].scenario
    fams, dropped = candidates(spec, sc)
    cmp = Compare(spec, planner, qps)
    best = cmp.search(fams)
    rows = [row(c, ok, why, cmp.per_gpu(c)) for c, ok, why in cmp.done.values()]
    df = pd.DataFrame(rows)
    res: dict[str, Any] = {"qps": qps}
    for f in FAMILIES:
        b = best[f]
        res[f] = answer(b, cmp.per_gpu(b) if b else None, b is not None)
        if b is not None:
            # no smaller candidate of the family ran and failed: the estimate dropped every
            # smaller one, so a smaller deployment might pass too (lower bound_margin to see)
            res[f]["smaller_untested"] = not any(
                c.family == f and not ok and c.gpus < b.gpus for c, ok, _ in cmp.done.values()
            )
    a, d = res["aggregated"]["throughput_per_gpu"], res["disaggregated"]["throughput_per_gpu"]
    if a is None and d is None:
        res["choice"] = "none"
    else:
        res["choice"] = "disaggregated" if (d or 0.0) > (a or 0.0) else "aggregated"
    res["runs"] = len(cmp.done)
    res["pruned_by_bounds"] = len(dropped)
    sentences = []
    for f in FAMILIES:
        b = best[f]
        if b is None:
            sentences.append(f"{qps:g} QPS {f}: no candidate within the budget meets the SLOs")
        else:
            note = (
                " (fewer GPUs untested: below bound_margin)" if res[f]["smaller_untested"] else ""
            )
            sentences.append(
                f"{qps:g} QPS {f}: {b.label} ({b.gpus} GPUs), "
                f"{res[f]['throughput_per_gpu']:.4g} req/s per GPU at the SLOs{note}"
            )
    sentences.append(f"choice: {res['choice']}")
    tpot = _tpot_limits(spec.slo)
    res["tpot_limit_s"] = min(tpot) if tpot else None
    return df, res, sentences


def frontier_png(df: pd.DataFrame, path: Path, tpot_limit: float | None = None) -> Path:
    """Throughput per GPU vs P99 TPOT of every candidate run, both families; filled markers
    met the SLOs, hollow ones did not; a dashed line marks ``tpot_limit`` (seconds)."""
    import matplotlib.pyplot as plt

    from sim.study.plots import _save

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    marks = {"aggregated": ("o", "C0"), "disaggregated": ("s", "C1")}
    for f, (mk, col) in marks.items():
        sub = df[(df["family"] == f)] if not df.empty else df
        if sub.empty:
            continue
        sub = sub[sub["tpot_p99_s"].notna()]
        ok = sub[sub["meets_slo"]]
        bad = sub[~sub["meets_slo"]]
        y_ok = ok["throughput_per_gpu"].fillna(0.0)
        y_bad = bad["throughput_per_gpu"].fillna(0.0)
        ax.scatter(ok["tpot_p99_s"] * 1e3, y_ok, marker=mk, color=col, label=f"{f} (meets SLO)")
        ax.scatter(bad["tpot_p99_s"] * 1e3, y_bad, marker=mk, facecolors="none", edgecolors=col,
                   label=f"{f} (misses)")  # fmt: skip
    if tpot_limit is not None:
        ax.axvline(tpot_limit * 1e3, color="grey", ls="--", lw=1, label="TPOT limit")
    ax.set_xlabel("P99 TPOT (ms)")
    ax.set_ylabel("goodput per GPU (req/s)")
    ax.set_title("aggregated vs disaggregated")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
