"""Plan files: their schema, the SLOs and the rule by which one run passes them.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from engine.configfile import read_mapping, validate_model
from engine.limits import CheckedModel, RequestRate, Seeds
from sim.scenario import Duration
from sim.study.dayplan import DayCfg
from sim.study.disaggcompare import CompareCfg
from sim.study.sweep.spec import resolve_scenario_path

#: resources whose utilisation names what saturates first (``utilisation.*`` of a summary)
RESOURCES: tuple[str, ...] = ("token_budget", "mfu", "mbu", "kv", "pcie", "nic", "ps_nic", "ps_ssd")


#: the latency percentiles a plan's SLOs may name (keys of the summary's latency blocks)
PERCENTILES: tuple[str, ...] = ("p50", "p90", "p99", "p999", "mean")


#: latency kinds: end to end, time to first token, time per output token
KINDS: tuple[str, ...] = ("e2e", "ttft", "tpot")


Limits = dict[str, dict[str, Duration]]


class SloCfg(CheckedModel, BaseModel):  # BaseModel named too, for linters
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
    """Least availability, in (0, 1] (see "SLOs" in sim.study.planspec); null: not checked."""
    degraded_rate: float | None = Field(None, ge=0, le=1)
    """Most (shed + degraded results) / requests, in [0, 1]; null: not checked."""

    def limits(self) -> list[tuple[str, str, str, float]]:
        """Every latency limit as ``(kind, percentile, class, seconds)``."""
        out = [("e2e", "p99", c, v) for c, v in self.p99.items()]
        for kind in KINDS:
            for pct, per in getattr(self, kind).items():
                out += [(kind, pct, c, v) for c, v in per.items()]
        return out


class PlanFile(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """The schema of a plan file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    scenario: str
    """Scenario file of the workload (relative to the plan file, else the working directory)."""
    set: dict[str, Any] = {}
    """Base overrides `dotted.key: value` applied to the scenario, like `--set`."""
    variant: str | None = None
    """One of the scenario's variants as the base; null: the base scenario."""
    seeds: Seeds = 3
    """Seeds per probe: n -> 0..n-1 (n <= 100,000), or an explicit list of distinct seeds
    0..2**63-1."""
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
    qps: list[RequestRate] = []
    """Question 1: the smallest size meeting the SLOs at each of these loads (requests/s,
    > 0, at most 1e7)."""
    sizes: list[Annotated[int, Field(ge=1)]] = []
    """Question 2: the highest load each of these sizes sustains (each >= 1)."""
    qps_range: tuple[RequestRate, RequestRate] = (1.0, 10000.0)
    """Bounds [low, high] of the load search, requests/s, 0 < low < high <= 1e7."""
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
    size search (sim.study.disaggcompare); null: the size / load searches above."""
    day: DayCfg | None = None
    """Plan a day instead of the size search: the autoscaler settings with the fewest
    GPU-hours keeping the day's SLO attainment, against static peak provisioning
    (sim.study.dayplan); null: the searches above."""


def load_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file (``InputError`` naming the file and field)."""
    return validate_model(PlanFile, read_mapping(path, "plan"), str(path))


def plan_from_file(path: str | Path) -> tuple[PlanFile, Path]:
    """The validated plan file and the path of its scenario."""
    spec = load_plan_file(path)
    return spec, resolve_scenario_path(spec.scenario, Path(path).parent)


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
    #: what the probe's runs measured, each the mean over its seeds that report it
    #: (:data:`ANSWER_FIGURES`: latencies, per-user speed, output tokens/s)
    figures: dict[str, float] = field(default_factory=dict)


def run_passes(m: dict[str, Any] | None, slo: SloCfg) -> tuple[bool, list[str]]:
    """Whether one run's flattened metrics meet ``slo`` (and why not): its latency limits,
    sustained throughput (when ``slo.sustain``), availability and degraded rate."""
    if m is None:
        return False, ["run failed"]
    why = _latency_misses(m, slo)
    if slo.sustain:
        why += _sustain_misses(m)
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


def _latency_misses(m: dict[str, Any], slo: SloCfg) -> list[str]:
    """The latency limits of ``slo`` that the run's metrics ``m`` miss (a class with
    requests in the window but none finished misses them all)."""
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
    return why


def _sustain_misses(m: dict[str, Any]) -> list[str]:
    """Why the run did not sustain its load: overloaded, or requests left unfinished."""
    why: list[str] = []
    if m.get("overloaded"):
        why.append(
            f"overloaded: achieved {m.get('throughput.achieved_rps') or 0:.4g} < 0.95 x "
            f"offered {m.get('throughput.offered_rps') or 0:.4g} req/s"
        )
    if m.get("requests.unfinished"):
        why.append(f"{m['requests.unfinished']} requests unfinished")
    return why


def _secs(v: float) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"


#: the flattened summary keys a probe keeps (mean over seeds): the latencies, per-user speed
#: and throughput a plan reports at its answer
ANSWER_FIGURES: tuple[str, ...] = (
    *(f"latency.{k}.{p}" for k in KINDS for p in ("p50", "p99", "mean")),
    *(f"user_tokens_per_s.{p}" for p in ("p50", "p10", "mean")),
    "throughput.achieved_rps",
    "throughput.output_tokens_per_s",
    "gpus",
)


def answer_figures(ms: list[dict[str, Any]]) -> dict[str, float]:
    """:data:`ANSWER_FIGURES` of the runs ``ms`` (flattened summaries), each the mean over
    the runs that report it (a figure no run reports is left out)."""
    out: dict[str, float] = {}
    for key in ANSWER_FIGURES:
        vals = [float(m[key]) for m in ms if m.get(key) is not None]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out


def utilisation(m: dict[str, Any]) -> dict[str, float]:
    """Per-resource utilisation (0..1) of one run from its flattened summary: the summary's
    ``utilisation.*`` (see :func:`sim.runner.utilisation`)."""
    return {r: float(m.get(f"utilisation.{r}") or 0.0) for r in RESOURCES}
