"""Capacity planning: the smallest (or cheapest) cluster meeting SLOs, the highest QPS a
cluster sustains, and which resource saturates first.

The plan file, its SLOs and the pass rule are in :mod:`sim.study.planspec`; the answers' rows,
sentences and ``plan.json`` in :mod:`sim.study.planreport`.

**Search.** Bisection assumes passing is monotone: more of the size knob never hurts, more
load never helps. Smallest size: check the top of the range (none if it fails), the bottom
(done if it passes), then halve ``[fail, pass]`` until adjacent. Highest QPS: the same on
``qps_range`` until the bracket is narrower than ``qps_tolerance`` x its top (probed loads
are rounded to 4 significant digits). Same spec and seeds -> same probes -> same answer.

**Saturation.** At the boundary probe that fails (or at the answer when nothing fails) the
mean utilisation over seeds of: compute (busy share of nodes), HBM (peak per-node HBM use /
``hbm_bytes_per_node``), PCIe, network (busiest compute-node NIC, ``node_nic_utilisation``),
parameter servers (``ps_utilisation``: busiest PS NIC or SSD). Older summaries without these
fields fall back to the configured HBM size, ``max_nic_utilisation`` (busiest NIC of any
host) and the share of busy time spent waiting for parameters (a proxy). The largest one is
named as the resource that saturates first.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from engine.errors import InputError
from sim.feasible import check_references
from sim.study.planreport import (
    PlanResult,
    answer_sentence,
    frontier_row,
    plan_json,
    plan_notes,
    plot_frontier,
    replica_shape,
)
from sim.study.planspec import (
    PERCENTILES,
    RESOURCES,
    PlanFile,
    Probe,
    answer_figures,
    run_passes,
    utilisation,
)
from sim.study.sweep.execute import Progress, Runner, write_parquet
from sim.study.sweep.resultcache import RunCache, write_atomic
from sim.study.sweep.spec import Point, build_points, override_text, seed_list


def _round_sig(x: float, digits: int = 4) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


class Planner:
    """Runs the searches of one plan; probes are memoised (and runs cached on disk)."""

    def __init__(
        self,
        spec: PlanFile,
        scenario: Path,
        runner: Runner,
        cache: RunCache,
        seeds: list[int],
        progress: Callable[[str], None] | None = None,
        run_progress: Progress | None = None,
    ) -> None:
        self.spec = spec
        self.scenario = scenario
        self.runner = runner
        self.cache = cache
        self.seeds = seeds
        self.progress = progress
        self.run_progress = run_progress
        self.base = [override_text(k, v) for k, v in spec.set.items()]
        self._memo: dict[tuple[str, int, float], Probe] = {}

    def points(self, alt: dict[str, Any], size: int, qps: float) -> list[Point]:
        """The seeds of one probe (validated; ``InputError`` for a bad key or value)."""
        grid = {k: [v] for k, v in alt.items()}
        grid[self.spec.size_key] = [size]
        grid[self.spec.qps_key] = [qps]
        return build_points(
            self.scenario, grid, self.seeds, self.base, self.spec.variant, source="plan"
        )

    def prefetch(self, wanted: list[tuple[dict[str, Any], int, float]]) -> None:
        """Run the seeds of several probes in one batch (in parallel on the runner's
        workers); :meth:`probe` then finds them in the run cache. Nothing to gain with one
        probe or no parallel runner."""
        if len(wanted) < 2 or not self.runner.parallel:
            return
        pts: list[Point] = []
        for alt, size, qps in wanted:
            if (json.dumps(alt, sort_keys=True), size, qps) in self._memo:
                continue
            ps = self.points(alt, size, qps)
            if _infeasible(ps[0].scenario) is None:
                pts += ps
                if self.progress is not None:
                    label = ", ".join(f"{k}={v}" for k, v in alt.items())
                    self.progress(f"{label + ' ' if label else ''}size={size} qps={qps:g}")
        if pts:
            self.runner.run(pts, self.cache, progress=self.run_progress)

    def probe(self, alt: dict[str, Any], size: int, qps: float) -> Probe:
        key = (json.dumps(alt, sort_keys=True), size, qps)
        if key in self._memo:
            return self._memo[key]
        pts = self.points(alt, size, qps)
        bad = _infeasible(pts[0].scenario)
        if bad is not None:
            pr = Probe(alt, size, qps, False, 0.0, dict.fromkeys(RESOURCES, 0.0), [bad], True)
            self._memo[key] = pr
            return pr
        if self.progress is not None and any(self.cache.get(p.config_hash) is None for p in pts):
            label = ", ".join(f"{k}={v}" for k, v in alt.items())
            self.progress(f"{label + ' ' if label else ''}size={size} qps={qps:g}")
        batch = self.runner.run(pts, self.cache, progress=self.run_progress)
        n_pass, utils, reasons = 0, [], []
        over, achieved, measured = 0, [], []
        for p in pts:
            rec = batch.records.get(p.config_hash)
            m = rec["metrics"] if rec is not None and rec.get("status") == "ok" else None
            ok, why = run_passes(m, self.spec.slo)
            n_pass += ok
            reasons += [f"seed {p.seed}: {w}" for w in why]
            if m is not None:
                measured.append(m)
                utils.append(utilisation(m))
                over += bool(m.get("overloaded") or m.get("requests.unfinished"))
                achieved.append(float(m.get("throughput.achieved_rps") or 0.0))
        frac = n_pass / len(pts)
        mean_u = {r: sum(u[r] for u in utils) / len(utils) if utils else 0.0 for r in RESOURCES}
        pr = Probe(alt, size, qps, frac >= self.spec.min_pass_fraction - 1e-12, frac, mean_u)
        pr.reasons = reasons
        pr.overloaded = over / len(pts)
        pr.achieved = sum(achieved) / len(achieved) if achieved else 0.0
        pr.figures = answer_figures(measured)
        self._memo[key] = pr
        return pr

    def probes(self) -> list[Probe]:
        """Every probe evaluated so far, in the order they were first asked for."""
        return list(self._memo.values())

    def min_size(self, alt: dict[str, Any], qps: float) -> tuple[int | None, Probe]:
        """Smallest size meeting the SLOs at ``qps``, and the boundary probe to blame."""
        return self.min_sizes([alt], qps)[0]

    def min_sizes(self, alts: list[dict[str, Any]], qps: float) -> list[tuple[int | None, Probe]]:
        """:meth:`min_size` of every alternative, the searches in lockstep so that each
        round's probes (one per unfinished alternative) run as one batch. The same probes,
        and so the same answers, as one search after another."""
        lo0, hi0 = self.spec.size_range
        # per alternative: the search state :func:`_size_step` advances
        state: list[dict[str, Any]] = [{"stage": "top"} for _ in alts]
        out: list[tuple[int | None, Probe] | None] = [None] * len(alts)
        while any(o is None for o in out):
            wanted = []
            for alt, st, o in zip(alts, state, out, strict=True):
                if o is not None:
                    continue
                size = {"top": hi0, "bottom": lo0}.get(st["stage"])
                if size is None:
                    size = (st["lo"] + st["hi"]) // 2
                st["next"] = size
                wanted.append((alt, size, qps))
            self.prefetch(wanted)
            for i, (alt, st) in enumerate(zip(alts, state, strict=True)):
                if out[i] is None:
                    out[i] = _size_step(st, self.probe(alt, st["next"], qps), lo0, hi0)
        return [o for o in out if o is not None]

    def max_qps(self, alt: dict[str, Any], size: int) -> tuple[float | None, Probe]:
        """Highest load (within ``qps_range``) meeting the SLOs at ``size``."""
        return self.max_qpss([alt], size)[0]

    def max_qpss(self, alts: list[dict[str, Any]], size: int) -> list[tuple[float | None, Probe]]:
        """:meth:`max_qps` of every alternative, the bisections in lockstep so that each
        round's probes (one per unfinished alternative) run as one batch: the same probes,
        and so the same answers, as one search after another."""
        state: list[dict[str, Any]] = [{"stage": "top"} for _ in alts]
        out: list[tuple[float | None, Probe] | None] = [None] * len(alts)
        lo0, hi0 = self.spec.qps_range
        while any(o is None for o in out):
            wanted = []
            for alt, st, o in zip(alts, state, out, strict=True):
                if o is None:
                    st["next"] = {"top": hi0, "bottom": lo0}.get(st["stage"], st.get("mid"))
                    wanted.append((alt, size, st["next"]))
            self.prefetch(wanted)
            for i, (alt, st) in enumerate(zip(alts, state, strict=True)):
                if out[i] is None:
                    out[i] = self._qps_step(st, self.probe(alt, size, st["next"]), lo0, hi0)
        return [o for o in out if o is not None]

    def answer_probe(self, alt: dict[str, Any], size: int, qps: float) -> Probe | None:
        """The probe already run at ``(alt, size, qps)`` (a search's answer), else None."""
        return self._memo.get((json.dumps(alt, sort_keys=True), size, qps))

    def _qps_step(
        self, st: dict[str, Any], pr: Probe, lo0: float, hi0: float
    ) -> tuple[float | None, Probe] | None:
        """One step of a highest-load search over ``[lo0, hi0]``: update its state ``st``
        with the probe ``pr`` of load ``st["next"]``; the answer once known, else None.

        Stages: ``top`` (does ``hi0`` pass? yes: the answer), ``bottom`` (does ``lo0`` fail?
        then none), then ``bisect`` with the invariant probe(lo) passes, probe(hi) fails,
        until the bracket is narrower than ``qps_tolerance`` x its top or its midpoint
        (rounded to 4 significant digits) is one of its ends."""
        if st["stage"] == "top":
            if pr.passed:
                return hi0, pr
            st.update(stage="bottom", fail=pr)
            return None
        if st["stage"] == "bottom":
            if not pr.passed:
                return None, pr
            st.update(stage="bisect", lo=lo0, hi=hi0)
        elif pr.passed:
            st["lo"] = st["mid"]
        else:
            st["hi"], st["fail"] = st["mid"], pr
        lo, hi = st["lo"], st["hi"]
        mid = _round_sig((lo + hi) / 2)
        if hi - lo <= self.spec.qps_tolerance * hi or mid in (lo, hi):
            return lo, st["fail"]
        st["mid"] = mid
        return None


def _size_step(
    st: dict[str, Any], pr: Probe, lo0: int, hi0: int
) -> tuple[int | None, Probe] | None:
    """One step of a smallest-size search over ``[lo0, hi0]``: update its state ``st`` with
    the probe ``pr`` of size ``st["next"]``; the answer once known, else None.

    Stages: ``top`` (does ``hi0`` pass? no: no size does), ``bottom`` (does ``lo0`` pass? yes:
    it is the answer), then ``bisect`` with the invariant probe(lo) fails, probe(hi) passes,
    until ``hi - lo <= 1`` (answer ``hi``, blaming the last failing probe)."""
    if st["stage"] == "top":
        if not pr.passed:
            return None, pr
        st["stage"] = "bottom"
    elif st["stage"] == "bottom":
        if pr.passed:
            return lo0, pr
        st.update(stage="bisect", lo=lo0, hi=hi0, fail=pr)
    elif pr.passed:
        st["hi"] = st["next"]
    else:
        st["lo"], st["fail"] = st["next"], pr
    if st["stage"] == "bisect" and st["hi"] - st["lo"] <= 1:
        return st["hi"], st["fail"]
    return None


def _infeasible(sc: Any) -> str | None:
    """Why the scenario ``sc`` cannot be built (memory, replica shape), or ``None``."""
    from sim.feasible import check_feasible
    from sim.study.sweep.execute import cached_resources

    try:
        check_feasible(sc, *cached_resources(sc.catalogue, sc.profile))
    except InputError as err:
        text = str(err)
        if err.source and text.startswith(f"{err.source}: "):
            text = text[len(err.source) + 2 :]
        return f"infeasible: {text}"
    return None


def check_plan(spec: PlanFile, planner: Planner, source: str, probe: Any = None) -> None:
    """Reject a plan that cannot be answered before running anything; ``probe``: the
    scenario a day plan plays (its day compressed), checked instead of the size probe."""
    day = spec.day is not None  # a day plan asks neither question; it judges attainment
    if not day and not spec.qps and not spec.sizes:
        raise InputError("give qps (smallest size) and/or sizes (highest qps)", source=source)
    slo = spec.slo
    if not day and not slo.limits() and slo.availability is None and slo.degraded_rate is None:
        raise InputError(
            "slo: give at least one of e2e, ttft, tpot, p99, availability, degraded_rate",
            source=source,
        )
    for kind, pct, _, _ in slo.limits():
        if pct not in PERCENTILES:
            raise InputError(
                f"slo.{kind}: unknown percentile {pct!r}; allowed: {', '.join(PERCENTILES)}",
                source=source,
            )
    lo, hi = spec.size_range
    if not 1 <= lo <= hi:
        raise InputError(f"size_range: {[lo, hi]} needs 1 <= low <= high", source=source)
    qlo, qhi = spec.qps_range
    if not 0 < qlo < qhi:
        raise InputError(f"qps_range: {[qlo, qhi]} needs 0 < low < high", source=source)
    # every key path and every alternative is validated by building one probe's points
    for alt in alternatives(spec):
        if probe is not None:
            sc = probe
        else:
            sc = planner.points(alt, lo, spec.qps[0] if spec.qps else qlo)[0].scenario
        check_references(sc)  # an unknown model or profile is an input error, not infeasible
        classes = [c.name for c in sc.workload.classes]
        for kind, pct, cls, _ in slo.limits():
            if cls != "all" and cls not in classes:
                where = (
                    "slo.p99"
                    if (kind, pct) == ("e2e", "p99") and cls in slo.p99
                    else f"slo.{kind}.{pct}"
                )
                raise InputError(
                    f"{where}: unknown class {cls!r}; allowed: all, {', '.join(classes)}",
                    source=source,
                )


def alternatives(spec: PlanFile) -> list[dict[str, Any]]:
    """Every combination of the alternative knobs (one empty dict when there are none)."""
    keys = list(spec.alternatives)
    return [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*(spec.alternatives[k] for k in keys))
    ]


def run_plan(
    spec: PlanFile,
    scenario: Path,
    out: str | Path,
    *,
    workers: int = 1,
    scheduler: str | None = None,
    progress: Callable[[str], None] | None = None,
    run_progress: Progress | None = None,
    source: str = "plan",
) -> PlanResult:
    """Answer the plan's questions; write ``frontier.parquet``/``.csv``, ``frontier.png``
    and ``plan.json`` under ``out`` (runs cached under ``out/runs``)."""
    seeds = seed_list(spec.seeds, source)
    folder = Path(out)
    rows: list[dict[str, Any]] = []
    runner = Runner(workers, scheduler)
    pl = Planner(spec, scenario, runner, RunCache(folder), seeds, progress, run_progress)
    if spec.day is not None:  # its day may only validate compressed
        return _run_day(spec, pl, runner, folder, seeds, source)
    check_plan(spec, pl, source)  # before any cluster starts or file is written
    first = pl.points({}, spec.size_range[0], spec.qps[0] if spec.qps else spec.qps_range[0])
    resolved = first[0].scenario.model_dump(mode="json")
    if spec.compare is not None:
        return _run_compare(spec, pl, runner, folder, seeds, source)
    with runner:
        alts = alternatives(spec)
        found = {q: pl.min_sizes(alts, q) for q in spec.qps}
        for i, alt in enumerate(alts):
            for q in spec.qps:
                size, boundary = found[q][i]
                shape = (
                    replica_shape(pl.points(alt, size, q)[0].scenario) if size is not None else None
                )
                at = pl.answer_probe(alt, size, q) if size is not None else None
                rows.append(
                    frontier_row("min-size", alt, q, size, boundary, spec, resolved, shape, at)
                )
            for s in spec.sizes:
                qmax, boundary = pl.max_qps(alt, s)
                at = pl.answer_probe(alt, s, qmax) if qmax is not None else None
                rows.append(frontier_row("max-qps", alt, qmax, s, boundary, spec, resolved, at=at))
    df = pd.DataFrame(rows)
    if not df.empty and (spec.costs or spec.gpu_hour_cost is not None):
        ms = df[(df["question"] == "min-size") & df["cost"].notna()]
        best = ms.groupby("qps")["cost"].transform("min")
        df["cheapest"] = False
        df.loc[ms.index, "cheapest"] = ms["cost"] == best
    answers = [answer_sentence(r, spec) for r in df.to_dict("records")]
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(df, folder / "frontier.parquet")
    write_atomic(folder / "frontier.csv", df.to_csv(index=False))
    plot_frontier(df, spec, folder / "frontier.png")
    result = PlanResult(df, folder, answers, notes=plan_notes(pl.probes(), spec, len(seeds)))
    report = {"spec": spec.model_dump(mode="json"), "seeds": seeds, **plan_json(result)}
    write_atomic(folder / "plan.json", json.dumps(report, indent=1) + "\n")
    return result


def _run_compare(
    spec: PlanFile, pl: Planner, runner: Runner, folder: Path, seeds: list[int], source: str
) -> PlanResult:
    """A compare plan (:mod:`sim.study.disaggcompare`): frontier files, ``plan.json``."""
    from sim.study.disaggcompare import frontier_png, run_compare

    if not spec.qps:
        raise InputError("compare: give the load as qps: [QPS]", source=source, where="qps")
    with runner:
        df, answer, sentences = run_compare(spec, pl)
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(df, folder / "frontier.parquet")
    write_atomic(folder / "frontier.csv", df.to_csv(index=False))
    frontier_png(df, folder / "frontier.png", answer.get("tpot_limit_s"))
    result = PlanResult(df, folder, sentences, answer)
    report = {"spec": spec.model_dump(mode="json"), "seeds": seeds, **plan_json(result)}
    write_atomic(folder / "plan.json", json.dumps(report, indent=1) + "\n")
    return result


def _run_day(
    spec: PlanFile, pl: Planner, runner: Runner, folder: Path, seeds: list[int], source: str
) -> PlanResult:
    """A day plan (:mod:`sim.study.dayplan`): ``frontier.csv``/``.parquet``, ``plan.json``."""
    from sim.study.dayplan import DayPlanner, day_png, run_day

    day = DayPlanner(spec, pl.scenario, runner, RunCache(folder), seeds, pl.base)
    check_plan(spec, pl, source, probe=day.base_points({})[0].scenario)
    with runner:
        df, answer, sentences = run_day(spec, day)
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(df, folder / "frontier.parquet")
    write_atomic(folder / "frontier.csv", df.to_csv(index=False))
    day_png(df, answer, folder / "frontier.png")
    result = PlanResult(df, folder, sentences, answer)
    report = {"spec": spec.model_dump(mode="json"), "seeds": seeds, **plan_json(result)}
    write_atomic(folder / "plan.json", json.dumps(report, indent=1) + "\n")
    return result
