"""Capacity planning: the smallest (or cheapest) cluster meeting SLOs, the highest QPS a
cluster sustains, and which resource saturates first.

A plan file (YAML; unknown keys are errors)::

    scenario: burst-traffic.yaml      # the workload (relative to the plan file)
    set: {workload.requests: 4000}    # base overrides
    seeds: 3                          # seeds per probe (n -> 0..n-1, or a list)
    min_pass_fraction: 1.0            # a probe passes when >= this share of its seeds pass
    slo:
      p99: {high: 500ms, low: 5s}     # P99 latency per workload class ("all": every request)
      availability: 0.999             # see "SLOs" below
      degraded_rate: 0.01             # (shed + degraded results) / requests
    size_key: cluster.servers         # the integer size knob
    size_range: [1, 64]
    qps_key: workload.steps.0.rate    # the load knob (workload.rate for Poisson traffic)
    qps: [1200]                       # question 1: smallest size for each of these loads
    sizes: [8, 16]                    # question 2: highest load for each of these sizes
    qps_range: [50, 5000]
    qps_tolerance: 0.02               # relative width at which the QPS bisection stops
    alternatives: {cluster.param_servers: [2, 4]}   # other knobs: every combination is tried
    costs: {cluster.servers: 3.0, cluster.param_servers: 1.0}  # per unit; cheapest is marked

Every probe (alternative, size, load) runs all seeds through the sweep machinery (cached by
config hash under ``OUT/runs``, so re-running or extending a plan reuses finished runs).

**SLOs.** ``p99``: the class's P99 end-to-end latency. ``availability``: the summary's
``availability`` if it has one, else the chaos report's ``faults.availability`` (requests
answered within their class SLO / requests) when the scenario has a ``faults`` section, else
1 - (rejected + unfinished) / requests (a shed or degraded answer is still an answer).
``degraded_rate``: (shed + degraded results) / requests.

**Pass rule.** A run passes when every SLO holds (a class with requests but none finished
fails its P99). A probe passes when at least ``min_pass_fraction`` of its seeds pass; the
default 1.0 means *all* seeds (the conservative choice: one bad seed is a miss). A failed run
counts as a failing seed.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from engine.configfile import read_mapping, validate_model
from engine.errors import InputError
from sim.disagg.compare import CompareCfg
from sim.scenario import Duration
from sim.sweep.cache import RunCache, write_atomic
from sim.sweep.execute import Progress, Runner, write_parquet
from sim.sweep.spec import (
    Point,
    build_points,
    override_text,
    resolve_scenario_path,
    seed_list,
)

#: resources whose utilisation names what saturates first (``utilisation.*`` of a summary)
RESOURCES: tuple[str, ...] = ("token_budget", "mfu", "mbu", "kv", "pcie", "nic", "ps_nic", "ps_ssd")


#: the latency percentiles a plan's SLOs may name (keys of the summary's latency blocks)
PERCENTILES: tuple[str, ...] = ("p50", "p90", "p99", "p999", "mean")
#: latency kinds: end to end, time to first token, time per output token
KINDS: tuple[str, ...] = ("e2e", "ttft", "tpot")

Limits = dict[str, dict[str, Duration]]


class SloCfg(BaseModel):
    """Service-level objectives a run must meet (every one given)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    e2e: Limits = {}
    """End-to-end latency limits: `{percentile: {class: duration}}`, percentile one of p50,
    p90, p99, p999, mean; class a workload class or `all`. E.g. `{p99: {all: 5s}}`."""
    ttft: Limits = {}
    """Time-to-first-token limits, same form as `e2e`."""
    tpot: Limits = {}
    """Time-per-output-token limits (mean gap between tokens after the first), same form."""
    p99: dict[str, Duration] = {}
    """Shorthand for `e2e: {p99: ...}`: P99 end-to-end latency per class (`all`: every request)."""
    sustain: bool = True
    """The run must sustain the offered load: not `overloaded` in the steady window and no
    request unfinished."""
    availability: float | None = Field(None, gt=0, le=1)
    """Least availability, in (0, 1] (see "SLOs" in sim.plan); null: not checked."""
    degraded_rate: float | None = Field(None, ge=0, le=1)
    """Most (shed + degraded results) / requests, in [0, 1]; null: not checked."""

    def limits(self) -> list[tuple[str, str, str, float]]:
        """Every latency limit as ``(kind, percentile, class, seconds)``."""
        out = [("e2e", "p99", c, v) for c, v in self.p99.items()]
        for kind in KINDS:
            for pct, per in getattr(self, kind).items():
                out += [(kind, pct, c, v) for c, v in per.items()]
        return out


class PlanFile(BaseModel):
    """The schema of a plan file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    scenario: str
    """Scenario file of the workload (relative to the plan file, else the working directory)."""
    set: dict[str, Any] = {}
    """Base overrides `dotted.key: value` applied to the scenario, like `--set`."""
    variant: str | None = None
    """One of the scenario's variants as the base; null: the base scenario."""
    seeds: int | list[int] = 3
    """Seeds per probe: n -> 0..n-1, or an explicit list of distinct integers >= 0."""
    min_pass_fraction: float = Field(1.0, gt=0, le=1)
    """A probe passes when at least this share of its seeds pass, in (0, 1] (1.0: all)."""
    slo: SloCfg
    """The service-level objectives every passing run meets."""
    size_key: str = "cluster.servers"
    """Scenario key of the integer size knob the smallest-size search varies."""
    size_range: tuple[int, int] = (1, 64)
    """Bounds [low, high] of the size search, 1 <= low <= high."""
    qps_key: str = "workload.rate"
    """Scenario key of the load knob (e.g. `workload.steps.0.rate` for step traffic)."""
    qps: list[float] = []
    """Question 1: the smallest size meeting the SLOs at each of these loads (requests/s)."""
    sizes: list[int] = []
    """Question 2: the highest load each of these sizes sustains."""
    qps_range: tuple[float, float] = (1.0, 10000.0)
    """Bounds [low, high] of the load search, requests/s, 0 < low < high."""
    qps_tolerance: float = Field(0.02, gt=0, lt=1)
    """Load bisection stops when the bracket is narrower than this x its top, in (0, 1)."""
    alternatives: dict[str, list[Any]] = {}
    """Other knobs `key: [values]`; every combination is planned."""
    costs: dict[str, float] = {}
    """Cost per unit of a knob (`key: cost`); the cheapest answer is marked."""
    gpu_hour_cost: float | None = Field(None, ge=0)
    """Price of one GPU-hour (any currency); answers then report their cost per hour
    (GPUs x this) and the cheapest is marked. null: no GPU cost."""
    compare: CompareCfg | None = None
    """Compare aggregated and disaggregated deployments at the first `qps` instead of the
    size search (sim.disagg.compare); null: the size / load searches above."""


def load_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file (``InputError`` naming the file and field)."""
    return validate_model(PlanFile, read_mapping(path, "plan"), str(path))


def _round_sig(x: float, digits: int = 4) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


@dataclass
class Probe:
    """One evaluated point of the search: all its seeds."""

    alt: dict[str, Any]
    size: int
    qps: float
    passed: bool
    pass_fraction: float
    utilisation: dict[str, float]
    reasons: list[str] = field(default_factory=list)
    #: the configuration cannot be built (memory, shape): ``reasons`` holds why
    infeasible: bool = False
    #: share of the seeds that were overloaded or left requests unfinished
    overloaded: float = 0.0
    #: the mean achieved throughput over seeds (req/s)
    achieved: float = 0.0


def run_passes(m: dict[str, Any] | None, slo: SloCfg) -> tuple[bool, list[str]]:
    """Whether one run's flattened metrics meet ``slo`` (and why not)."""
    if m is None:
        return False, ["run failed"]
    why: list[str] = []
    for kind, pct, cls, limit in slo.limits():
        prefix = "latency" if cls == "all" else f"per_class.{cls}.latency"
        v = m.get(f"{prefix}.{kind}.{pct}")
        n = m.get("requests.in_window", 1) if cls == "all" else m.get(f"per_class.{cls}.n", 0)
        if v is None:
            if n:
                why.append(f"{cls}: no request finished")
        elif v > limit:
            why.append(f"{cls} {kind} {pct} {_secs(v)} > {_secs(limit)}")
    if slo.sustain:
        if m.get("overloaded"):
            why.append(
                f"overloaded: achieved {m.get('throughput.achieved_rps') or 0:.4g} < 0.95 x "
                f"offered {m.get('throughput.offered_rps') or 0:.4g} req/s"
            )
        if m.get("requests.unfinished"):
            why.append(f"{m['requests.unfinished']} requests unfinished")
    req = max(int(m.get("requests.total") or 0), 1)
    if slo.availability is not None:
        avail = m.get("availability", m.get("faults.availability"))
        if avail is None:
            lost = int(m.get("requests.rejected") or 0) + int(m.get("requests.unfinished") or 0)
            avail = 1.0 - lost / req
        if avail < slo.availability:
            why.append(f"availability {avail:.4g} < {slo.availability:.4g}")
    if slo.degraded_rate is not None:
        deg = m.get("degraded_rate")
        if deg is None:
            deg = (int(m.get("requests.shed") or 0) + int(m.get("requests.degraded") or 0)) / req
        if deg > slo.degraded_rate:
            why.append(f"degraded rate {deg:.4g} > {slo.degraded_rate:.4g}")
    return not why, why


def _secs(v: float) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"


def utilisation(m: dict[str, Any]) -> dict[str, float]:
    """Per-resource utilisation (0..1) of one run from its flattened summary: the summary's
    ``utilisation.*`` (see :func:`sim.runner.utilisation`)."""
    return {r: float(m.get(f"utilisation.{r}") or 0.0) for r in RESOURCES}


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
        if len(wanted) < 2 or not getattr(self.runner, "uses_dask", False):
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
        over, achieved = 0, []
        for p in pts:
            rec = batch.records.get(p.config_hash)
            m = rec["metrics"] if rec is not None and rec.get("status") == "ok" else None
            ok, why = run_passes(m, self.spec.slo)
            n_pass += ok
            reasons += [f"seed {p.seed}: {w}" for w in why]
            if m is not None:
                utils.append(utilisation(m))
                over += bool(m.get("overloaded") or m.get("requests.unfinished"))
                achieved.append(float(m.get("throughput.achieved_rps") or 0.0))
        frac = n_pass / len(pts)
        mean_u = {r: sum(u[r] for u in utils) / len(utils) if utils else 0.0 for r in RESOURCES}
        pr = Probe(alt, size, qps, frac >= self.spec.min_pass_fraction - 1e-12, frac, mean_u)
        pr.reasons = reasons
        pr.overloaded = over / len(pts)
        pr.achieved = sum(achieved) / len(achieved) if achieved else 0.0
        self._memo[key] = pr
        return pr

    def min_size(self, alt: dict[str, Any], qps: float) -> tuple[int | None, Probe]:
        """Smallest size meeting the SLOs at ``qps``, and the boundary probe to blame."""
        return self.min_sizes([alt], qps)[0]

    def min_sizes(self, alts: list[dict[str, Any]], qps: float) -> list[tuple[int | None, Probe]]:
        """:meth:`min_size` of every alternative, the searches in lockstep so that each
        round's probes (one per unfinished alternative) run as one batch. The same probes,
        and so the same answers, as one search after another."""
        lo0, hi0 = self.spec.size_range
        # per alternative: [lo, hi, fail probe, answer, done]; bisection invariant once
        # started: probe(lo) fails, probe(hi) passes
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
                if out[i] is not None:
                    continue
                pr = self.probe(alt, st["next"], qps)
                if st["stage"] == "top":
                    if not pr.passed:
                        out[i] = (None, pr)
                    else:
                        st["stage"] = "bottom"
                elif st["stage"] == "bottom":
                    if pr.passed:
                        out[i] = (lo0, pr)
                    else:
                        st.update(stage="bisect", lo=lo0, hi=hi0, fail=pr)
                elif pr.passed:
                    st["hi"] = st["next"]
                else:
                    st["lo"], st["fail"] = st["next"], pr
                if st["stage"] == "bisect" and out[i] is None and st["hi"] - st["lo"] <= 1:
                    out[i] = (st["hi"], st["fail"])
        return [o for o in out if o is not None]

    def max_qps(self, alt: dict[str, Any], size: int) -> tuple[float | None, Probe]:
        """Highest load (within ``qps_range``) meeting the SLOs at ``size``."""
        lo, hi = self.spec.qps_range
        top = self.probe(alt, size, hi)
        if top.passed:
            return hi, top
        bottom = self.probe(alt, size, lo)
        if not bottom.passed:
            return None, bottom
        fail = top
        # invariant: probe(lo) passes, probe(hi) fails
        while hi - lo > self.spec.qps_tolerance * hi:
            mid = _round_sig((lo + hi) / 2)
            if mid in (lo, hi):
                break
            pm = self.probe(alt, size, mid)
            if pm.passed:
                lo = mid
            else:
                hi, fail = mid, pm
        return lo, fail


def _infeasible(sc: Any) -> str | None:
    """Why the scenario ``sc`` cannot be built (memory, replica shape), or ``None``."""
    from sim.cluster import check_feasible
    from sim.costmodel import load_profile
    from sim.models import load_catalogue

    try:
        check_feasible(sc, load_catalogue(sc.catalogue), load_profile(sc.profile))
    except InputError as err:
        text = str(err)
        if err.source and text.startswith(f"{err.source}: "):
            text = text[len(err.source) + 2 :]
        return f"infeasible: {text}"
    return None


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


@dataclass
class PlanResult:
    """The frontier (one row per question x alternative x load or size) and its files."""

    frontier: pd.DataFrame
    folder: Path
    answers: list[str]
    #: a compare plan's answer (``aggregated``, ``disaggregated``, ``choice``; sim.disagg)
    compare: dict[str, Any] | None = None


def check_plan(spec: PlanFile, planner: Planner, source: str) -> None:
    """Reject a plan that cannot be answered before running anything."""
    if not spec.qps and not spec.sizes:
        raise InputError("give qps (smallest size) and/or sizes (highest qps)", source=source)
    slo = spec.slo
    if not slo.limits() and slo.availability is None and slo.degraded_rate is None:
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
        sc = planner.points(alt, lo, spec.qps[0] if spec.qps else qlo)[0].scenario
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
                shape = _shape(pl.points(alt, size, q)[0].scenario) if size is not None else None
                rows.append(_row("min-size", alt, q, size, boundary, spec, resolved, shape))
            for s in spec.sizes:
                qmax, boundary = pl.max_qps(alt, s)
                rows.append(_row("max-qps", alt, qmax, s, boundary, spec, resolved))
    df = pd.DataFrame(rows)
    if not df.empty and (spec.costs or spec.gpu_hour_cost is not None):
        ms = df[(df["question"] == "min-size") & df["cost"].notna()]
        best = ms.groupby("qps")["cost"].transform("min")
        df["cheapest"] = False
        df.loc[ms.index, "cheapest"] = ms["cost"] == best
    answers = [_sentence(r, spec) for r in df.to_dict("records")]
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(df, folder / "frontier.parquet")
    write_atomic(folder / "frontier.csv", df.to_csv(index=False))
    _plot(df, spec, folder / "frontier.png")
    result = PlanResult(df, folder, answers)
    report = {"spec": spec.model_dump(mode="json"), "seeds": seeds, **plan_json(result)}
    write_atomic(folder / "plan.json", json.dumps(report, indent=1) + "\n")
    return result


def _run_compare(
    spec: PlanFile, pl: Planner, runner: Runner, folder: Path, seeds: list[int], source: str
) -> PlanResult:
    """A compare plan (:mod:`sim.disagg.compare`): frontier files, ``plan.json``."""
    from sim.disagg.compare import frontier_png, run_compare

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


def _shape(sc: Any) -> dict[str, int]:
    c = sc.cluster
    return {
        "servers": c.servers,
        "gpus": c.gpus,
        "tp": c.tp,
        "pp": c.pp,
        "replicas": c.replicas,
    }


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


def _row(
    question: str,
    alt: dict[str, Any],
    qps: float | None,
    size: int | None,
    boundary: Probe,
    spec: PlanFile,
    resolved: dict[str, Any],
    shape: dict[str, int] | None = None,
) -> dict[str, Any]:
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
    return row


def _sentence(r: dict[str, Any], spec: PlanFile) -> str:
    alt = ", ".join(f"{k}={r[k]}" for k in spec.alternatives)
    alt = f" with {alt}" if alt else ""
    sat = r.get("saturates_first")
    sat = sat if isinstance(sat, str) else None  # a frame's missing value is NaN
    blame = f"; saturates first: {sat} ({r[f'util_{sat}']:.2f})" if sat else ""
    cost = f", cost {r['cost']:g}" if r.get("cost") is not None else ""
    gpus = (
        f" ({r['gpus']:g} GPUs{cost})" if r.get("gpus") == r.get("gpus") and r.get("gpus") else cost
    )
    if r["question"] == "min-size":
        if r["size"] is None or r["size"] != r["size"]:  # None, or NaN in a frame
            lo, hi = spec.size_range
            return f"{r['qps']:g} QPS{alt}: no {spec.size_key} in [{lo}, {hi}] meets the SLOs: {r['reason']}"
        return f"{r['qps']:g} QPS{alt}: smallest {spec.size_key} = {int(r['size'])}{gpus}{blame}"
    if r["qps"] is None or r["qps"] != r["qps"]:
        return f"{spec.size_key}={r['size']}{alt}: fails the SLOs even at {spec.qps_range[0]:g} QPS"
    top = " (top of qps_range: capacity not reached)" if r["qps"] >= spec.qps_range[1] else ""
    return f"{spec.size_key}={r['size']}{alt}: highest QPS = {r['qps']:g}{top}{blame}"


def plan_json(res: PlanResult) -> dict[str, Any]:
    """The plan's answer as one JSON-ready object: ``answer`` (the cheapest passing min-size
    answer of the first load -- by cost, else by GPUs -- or, when none passes, the first
    row's reason) with ``servers``, ``gpus``, ``tp``, ``pp``, ``meets_slo``, ``reason``,
    ``qps``, ``cost``; and every row of the ``frontier``."""
    rows = json.loads(res.frontier.to_json(orient="records")) if not res.frontier.empty else []
    if res.compare is not None:
        return {**res.compare, "answers": res.answers, "frontier": rows, "folder": str(res.folder)}
    ms = [r for r in rows if r["question"] == "min-size"]
    answer: dict[str, Any] = {"meets_slo": False, "reason": "the plan asked no min-size question"}
    if ms:
        q0 = ms[0]["qps"]
        first = [r for r in ms if r["qps"] == q0]
        ok = [r for r in first if r["answered"]]
        if ok:
            best = min(
                ok, key=lambda r: (r["cost"] if r["cost"] is not None else 0, r.get("gpus") or 0)
            )
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
    return {"answer": answer, "answers": res.answers, "frontier": rows, "folder": str(res.folder)}


def _plot(df: pd.DataFrame, spec: PlanFile, path: Path) -> None:
    from sim.plots import frontier_plot

    frontier_plot(df, spec.size_key, list(spec.alternatives), spec.qps_range[1], path)


def plan_from_file(path: str | Path) -> tuple[PlanFile, Path]:
    """The validated plan file and the path of its scenario."""
    spec = load_plan_file(path)
    return spec, resolve_scenario_path(spec.scenario, Path(path).parent)
