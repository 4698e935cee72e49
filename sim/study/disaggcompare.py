"""``pdsim plan`` in compare mode: aggregated vs disaggregated at one load (a plan file with
a ``compare`` section; the plan's first ``qps`` is the load, its ``slo`` the objectives).

The candidates of :mod:`sim.study.disaggcandidates` within ``gpu_budget`` GPUs form
**sub-families**: aggregated replicas of one ``tp``, or disaggregated pools of one
(prefill ``tp``, decode ``tp``). The search assumes only that, within a sub-family, adding
replicas never turns a passing deployment into a failing one; under that assumption it finds
each family's smallest passing GPU count among *all* its candidates:

1. **Bounds skip only what cannot pass.** A candidate is not run when its analytic bound
   (the simulator's own iteration cost per ``tp``) proves it cannot carry the load or meet a
   TPOT limit, or it does not fit memory.
2. **Aggregated ``tp``**: bisection over the replica count for the first passing one (the
   largest count of interest first: if it fails, none smaller passes).
3. **Disaggregated (prefill ``tp``, decode ``tp``)**: for each prefill count in turn, the
   fewest decode replicas that pass, by the same bisection; the decode count that passes
   never grows with more prefill replicas, so each search is bounded by the previous answer.
4. **Only smaller answers are searched for.** Once a family has a passing candidate of ``G``
   GPUs, every later probe of that family has fewer than ``G``; a sub-family whose smallest
   candidate has ``G`` or more GPUs stops.
5. All sub-families advance in lockstep: each round's probes run as one batch (Dask with
   ``--workers N``), each a duration-bounded run of the plan's scenario
   (``workload.duration``) on every seed, cached by config hash under ``OUT/runs``.

A candidate passes when every seed passes :func:`sim.study.planspec.run_passes`. **Throughput
per GPU** is the steady window's goodput (requests meeting every class objective per second)
over the candidate's GPUs, mean over seeds. A family's answer is its passing candidate with
the fewest GPUs (ties: higher throughput per GPU, then lower P99 TPOT); the **choice** is the
family whose answer has the higher throughput per GPU (``aggregated`` on a tie; ``none`` if
neither passes, with the tightest limit that failed and the best figure any run reached).
Throughput per GPU is measured at the plan's load, so it is that load's goodput per GPU, not
the candidate's capacity (``pdsim frontier`` and a max-qps plan find capacities). Every row
and answer also carries the median and P99 latencies, the median tokens/s per user and the
output tokens/s per GPU measured there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from functools import partial
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
    bound_margin: float = Field(1.0, gt=0, le=1)
    """A candidate is skipped when its analytic capacity bound is below this x the load, in
    (0, 1]. The bound never undercharges a run, so 1 skips only candidates that cannot carry
    the load; lower it to run more of them."""


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
        """Each family's passing candidate with the fewest GPUs (:meth:`_rank` among equals),
        ``None`` where none passed (see the module docstring)."""
        best_gpus = {f: math.inf for f in fams}
        searches: dict[str, Generator[Candidate, bool, None]] = {}
        for f, cands in fams.items():
            for key, sub in _sub_families(cands).items():
                cap = partial(best_gpus.__getitem__, f)
                if f == "aggregated":
                    xs = sorted(sub, key=lambda c: c.gpus)
                    searches[key] = _as_search(_first_passing(xs, cap))
                else:
                    searches[key] = _disagg_search(sub, cap)
        pending: dict[str, Candidate] = {}
        for key, gen in list(searches.items()):
            first = next(gen, None)
            if first is not None:
                pending[key] = first
        while pending:
            probes = list(pending.items())
            oks = self.evaluate([c for _, c in probes])
            for (_, c), ok in zip(probes, oks, strict=True):
                if ok:
                    best_gpus[c.family] = min(best_gpus[c.family], c.gpus)
            for (key, _), ok in zip(probes, oks, strict=True):
                try:
                    pending[key] = searches[key].send(ok)
                except StopIteration:
                    del pending[key]
        best: dict[str, Candidate | None] = {}
        for f in fams:
            passing = [c for c, ok, _ in self.done.values() if ok and c.family == f]
            best[f] = max(passing, key=self._rank) if passing else None
        return best

    def _rank(self, c: Candidate) -> tuple[int, float, float]:
        """Fewer GPUs first, then higher throughput per GPU, then lower P99 TPOT."""
        tpg = self.per_gpu(c) or 0.0
        tpot = _mean(c.metrics, "latency.tpot.p99") or math.inf
        return (-c.gpus, round(tpg, 9), -tpot)

    def per_gpu(self, c: Candidate) -> float | None:
        good = _mean(c.metrics, "goodput_rps")
        return good / c.gpus if good is not None else None


#: a search: yields the candidate to run next, is sent whether it passed
Search = Generator[Candidate, bool, None]


def _sub_families(cands: list[Candidate]) -> dict[str, list[Candidate]]:
    """Candidates by sub-family: ``agg tp<N>`` or ``P tp<N> + D tp<M>``."""
    out: dict[str, list[Candidate]] = {}
    for c in cands:
        if c.prefill is None:
            key = f"agg tp{c.decode['tp']}"
        else:
            key = f"P tp{c.prefill['tp']} + D tp{c.decode['tp']}"
        out.setdefault(key, []).append(c)
    return out


def _first_passing(
    xs: list[Candidate], cap: Callable[[], float]
) -> Generator[Candidate, bool, int | None]:
    """The index of the first passing candidate of ``xs`` (ascending GPUs, pass/fail
    monotone along it) among those with fewer than ``cap()`` GPUs, or None.

    Invariant: every index <= ``lo`` fails, index ``hi`` passes (``hi`` None: none known)."""
    lo, hi = -1, None
    while True:
        n_ok = sum(1 for c in xs if c.gpus < cap())  # ascending: a prefix of xs
        top = min(n_ok, len(xs) if hi is None else hi + 1) - 1
        if top <= lo:  # nothing of interest left between lo and hi
            return hi if hi is not None and hi < n_ok else None
        # the largest of interest first: if it fails, nothing below passes
        r = top if hi is None or hi >= n_ok else (lo + hi) // 2
        if (yield xs[r]):
            hi = r
        elif r == top and (hi is None or hi >= n_ok):
            return None
        else:
            lo = r


def _as_search(gen: Generator[Candidate, bool, int | None]) -> Search:
    """A :func:`_first_passing` search with its result dropped (the runs are the record)."""
    yield from gen


def _disagg_search(cands: list[Candidate], cap: Callable[[], float]) -> Search:
    """One (prefill tp, decode tp) sub-family: per prefill count (ascending), the fewest
    decode replicas that pass, searched only below the previous prefill count's answer and
    below ``cap()`` GPUs; stops when the smallest candidate left has ``cap()`` GPUs or more."""
    by_pn: dict[int, list[Candidate]] = {}
    for c in cands:
        assert c.prefill is not None
        by_pn.setdefault(c.prefill["replicas"], []).append(c)
    d_max = math.inf  # decode replicas that pass with fewer prefill replicas
    for pn in sorted(by_pn):
        xs = sorted(
            (c for c in by_pn[pn] if c.decode["replicas"] <= d_max),
            key=lambda c: c.decode["replicas"],
        )
        if not xs or xs[0].gpus >= cap():
            if by_pn[pn] and min(c.gpus for c in by_pn[pn]) >= cap():
                return  # more prefill replicas only add GPUs
            continue
        found = yield from _first_passing(xs, cap)
        if found is not None:
            d_max = xs[found].decode["replicas"]


def candidates(spec: Any, sc: Any) -> tuple[dict[str, list[Candidate]], list[Candidate]]:
    """Each family's runnable candidates, and the ones the analytic bounds dropped."""
    from sim.serving.costmodel import load_profile
    from sim.serving.models import load_catalogue

    cfg: CompareCfg = spec.compare
    gps = sc.cluster.gpus_per_server
    qps = spec.qps[0]
    raw = aggregated(cfg.aggregated_tp, gps, cfg.gpu_budget, 2 * cfg.max_replicas) + disaggregated(
        cfg.prefill_tp, cfg.decode_tp, cfg.max_replicas, gps, cfg.gpu_budget, cfg.placement
    )
    bounds = Bounds(sc, load_catalogue(sc.catalogue), load_profile(sc.profile))
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
        **_more(c),
        "reason": "; ".join(why[:2]) if why else (c.infeasible or None),
    }


def _more(c: Candidate) -> dict[str, float | None]:
    """A candidate's median latencies, median tokens/s per user and output tokens/s per GPU
    at the plan's load (means over its seeds)."""
    ms = c.metrics
    out_tps = _mean(ms, "throughput.output_tokens_per_s")
    return {
        "ttft_p50_s": _mean(ms, "latency.ttft.p50"),
        "tpot_p50_s": _mean(ms, "latency.tpot.p50"),
        "e2e_p50_s": _mean(ms, "latency.e2e.p50"),
        "tokens_per_s_per_user": _mean(ms, "user_tokens_per_s.p50"),
        "tokens_per_s_per_gpu": out_tps / c.gpus if out_tps is not None and c.gpus else None,
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
        e2e_p99_s=_mean(c.metrics, "latency.e2e.p99"),
        **_more(c),
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
    a, d = res["aggregated"]["throughput_per_gpu"], res["disaggregated"]["throughput_per_gpu"]
    if a is None and d is None:
        res["choice"] = "none"
    else:
        res["choice"] = "disaggregated" if (d or 0.0) > (a or 0.0) else "aggregated"
    res["runs"] = len(cmp.done)
    res["pruned_by_bounds"] = len(dropped)
    res["shortfall"] = (
        shortfall(list(cmp.done.values()), dropped, spec.slo, qps)
        if res["choice"] == "none"
        else None
    )
    sentences = []
    for f in FAMILIES:
        b = best[f]
        if b is None:
            sentences.append(f"{qps:g} QPS {f}: no candidate within the budget meets the SLOs")
        else:
            sentences.append(
                f"{qps:g} QPS {f}: {b.label} ({b.gpus} GPUs), "
                f"{res[f]['throughput_per_gpu']:.4g} req/s per GPU at the SLOs"
            )
    sentences.append(f"choice: {res['choice']}")
    if res["shortfall"]:
        sentences.append(f"no candidate meets the SLOs: {res['shortfall']}")
    tpot = _tpot_limits(spec.slo)
    res["tpot_limit_s"] = min(tpot) if tpot else None
    return df, res, sentences


def shortfall(
    ran: list[tuple[Candidate, bool, list[str]]], dropped: list[Candidate], slo: Any, qps: float
) -> str:
    """Why no candidate passed, in one line: the latency limit every run missed whose best
    figure (the lowest any candidate reached, mean over seeds) is furthest above it, or the
    load no run sustained; when nothing ran, the highest capacity bound or the lowest TPOT
    floor of the candidates the bounds skipped."""
    runs = [c for c, _, _ in ran]
    worst: tuple[float, str] | None = None
    for kind, pct, cls, limit in slo.limits():
        prefix = "latency" if cls == "all" else f"per_class.{cls}.latency"
        vals = [v for c in runs if (v := _mean(c.metrics, f"{prefix}.{kind}.{pct}")) is not None]
        if vals and min(vals) > limit:
            ratio = min(vals) / limit
            text = (
                f"{cls} {kind} {pct} limit {limit * 1e3:.4g} ms; the best candidate reached "
                f"{min(vals) * 1e3:.4g} ms"
            )
            if worst is None or ratio > worst[0]:
                worst = (ratio, text)
    if worst is not None:
        return worst[1]
    if runs:
        got = [v for c in runs if (v := _mean(c.metrics, "throughput.achieved_rps")) is not None]
        best = f"{max(got):.4g}" if got else "no"
        return f"no run sustained {qps:g} req/s (best achieved: {best} req/s) or other limits"
    feasible = [c for c in dropped if c.infeasible is None]
    if not feasible:
        return "no candidate fits in memory within the budget"
    tpot = _tpot_limits(slo)
    floor = min(c.tpot_floor_s for c in feasible)
    if tpot and floor > min(tpot):
        return (
            f"TPOT limit {min(tpot) * 1e3:.4g} ms; the fastest decode step of any candidate "
            f"takes {floor * 1e3:.4g} ms"
        )
    return (
        f"load {qps:g} req/s; the highest capacity bound of any candidate within the budget is "
        f"{max(c.bound_rps for c in feasible):.4g} req/s"
    )


def frontier_png(df: pd.DataFrame, path: Path, tpot_limit: float | None = None) -> Path:
    """Throughput per GPU vs P99 TPOT of every candidate run, both families; filled markers
    met the SLOs, hollow ones did not; a dashed line marks ``tpot_limit`` (seconds)."""
    from sim.study.plots import _save, figure_with_axes

    fig, ax = figure_with_axes(figsize=(6.5, 4.2))
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
