"""Scenario files: the pydantic schema, the YAML loader and ``--set`` overrides.

A scenario is one YAML file (see ``scenarios/*.yaml``). Loading validates every field, turns
human units into numbers (sizes -> bytes, rates -> bytes/s, durations -> s) and rejects
unknown keys. Any problem becomes one :class:`engine.errors.InputError` naming the file, the
field path and what is allowed, e.g. ``scenarios/x.yaml: cluster.gpu.hbm: "12 GBB" is not a
size``. Semantic checks that need the model catalogue (an impossible cluster) live in
:func:`sim.feasible.check_feasible`, called by the runner before anything is written.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from engine.config import CacheCfg, PrefetchCfg, StrictModel
from engine.configfile import parse_value, read_mapping, validate_model
from engine.errors import InputError
from engine.limits import show
from sim.control.autoscale.section import AutoscaleCfg
from sim.control.faults import FaultsCfg
from sim.disagg.poolconfig import DisaggCfg
from sim.sections import (
    ChunkCfg,
    ClassCfg,
    ClusterCfg,
    DegradationCfg,
    Deployment,
    Duration,
    GpuCfg,
    HotShardCfg,
    KvCfg,
    MetricsCfg,
    NetworkCfg,
    PsCfg,
    Rate,
    ReplicaCfg,
    RingCfg,
    SchedulerCfg,
    ServerCfg,
    Size,
    StepCfg,
    TokenDist,
    WarmupCfg,
    WorkloadCfg,
)
from sim.serving.expertcfg import ExpertsCfg

__all__ = [
    "CacheCfg",
    "CapacityCfg",
    "ChunkCfg",
    "Claim",
    "ClassCfg",
    "ClusterCfg",
    "DegradationCfg",
    "Deployment",
    "Duration",
    "ExpertsCfg",
    "GpuCfg",
    "HotShardCfg",
    "KvCfg",
    "MetricsCfg",
    "NetworkCfg",
    "PrefetchCfg",
    "PsCfg",
    "Rate",
    "ReplicaCfg",
    "RingCfg",
    "Scenario",
    "SchedulerCfg",
    "ServerCfg",
    "Size",
    "StepCfg",
    "TokenDist",
    "Variant",
    "WarmupCfg",
    "WorkloadCfg",
    "apply_overrides",
    "config_hash",
    "deployment_labels",
    "load_raw",
    "load_scenario",
    "parse_override",
    "resolved_dict",
    "validate",
    "variant",
]


class _M(StrictModel, BaseModel):  # BaseModel named too, so linters see a pydantic model
    """The base of the scenario-level models (as :mod:`sim.sections`' sections)."""


class CapacityCfg(_M):
    """A capacity claim (R21, sim/study/claims.py): per seed, each variant climbs a ladder of offered
    loads; its capacity is the highest load up to which every rung passes (not overloaded, no
    request unfinished, every class's P99 end-to-end latency within its `slo`), per GPU."""

    key: str = "workload.rate"
    """Scenario key of the offered load, requests/s (`workload.rate` for Poisson traffic)."""
    loads: list[float] = Field(min_length=1)
    """The ladder: offered loads in requests/s, strictly increasing, > 0."""

    @model_validator(mode="after")
    def _ascending(self) -> CapacityCfg:
        pairs = zip(self.loads, self.loads[1:], strict=False)
        if self.loads[0] <= 0 or any(b <= a for a, b in pairs):
            raise ValueError(f"loads must be > 0 and strictly increasing, got {self.loads}")
        return self


class Claim(_M):
    """An article's figure and how the run measures it (printed side by side).

    ``kind``: ``value`` reports ``metric`` of ``variant``; ``relative`` reports
    (variant - baseline) / baseline in percent; ``ratio`` reports variant / baseline.
    """

    id: str
    """Requirement id of the claim, e.g. `R3`."""
    article: str
    """The article's figure as text, e.g. `+23% hit rate vs LRU`."""
    metric: str
    """Dotted path of the summary metric compared, e.g. `hit_rate.hbm` or `latency.p99`."""
    kind: Literal["value", "relative", "ratio"] = "value"
    """`value`, `relative` ((variant - baseline) / baseline, %) or `ratio` (variant / baseline)."""
    variant: str | None = None
    """Variant measured; null: the first variant (or the base run)."""
    baseline: str | None = None
    """Variant compared against (`relative`, `ratio`); null: the first variant."""
    expected: float | None = Field(default=None, allow_inf_nan=False)
    """The article's figure in the claim's `kind` (percent for `relative`, x for `ratio`);
    `python -m sim.study.claims` gives a verdict against it (sim/study/claims.py). null: no verdict."""
    capacity: CapacityCfg | None = None
    """Measure capacity instead of `metric` at the scenario's load (`python -m sim.study.claims`
    only; one `pdsim run` reports it as not measured); `metric` then names it."""


class Variant(_M):
    """A named variant of the scenario: overrides applied to the base before running."""

    name: str
    """Variant name (used by claims and in results)."""
    set: dict[str, Any] = {}
    """Overrides as `dotted.key: value`, like `--set` on the command line."""


class Scenario(_M):
    """A whole scenario file (see ``scenarios/*.yaml``)."""

    name: str = "scenario"
    """Scenario name shown in summaries and results."""
    description: str = ""
    """Free text describing the scenario."""
    profile: str = "a100-80gb"
    """Hardware profile: a shipped profile name (listed below) or a profile JSON path."""
    catalogue: str | None = None
    """Extra model catalogue YAML (same schema as the shipped one); null: shipped models only."""
    mode: Literal["pd", "coupled"] = "pd"
    """`pd`: weights fetched from parameter servers (R19); `coupled`: all weights in HBM (R18)."""
    duration: Duration = 0.0
    """Simulated time limit, seconds or a duration; 0: until the workload is served."""
    deployments: list[Deployment] = Field(min_length=1)
    """The models served (at least one)."""
    cluster: ClusterCfg = ClusterCfg()
    """Compute nodes, parameter servers and links."""
    chunks: ChunkCfg = ChunkCfg()
    """Weight chunking and sharding (R1, R26)."""
    cache: CacheCfg = CacheCfg()
    """Node cache eviction policies and watermarks (R3, R13, R30)."""
    prefetch: PrefetchCfg = PrefetchCfg()
    """Weight prefetch (R7)."""
    experts: ExpertsCfg = ExpertsCfg()
    """Routed experts as parameter chunks (`mode: pd`, mixture-of-experts models)."""
    ring: RingCfg = RingCfg()
    """Consistent-hash placement of chunks on parameter servers (R1, R8)."""
    scheduler: SchedulerCfg = SchedulerCfg()
    """Request placement (R2)."""
    degradation: DegradationCfg = DegradationCfg()
    """Tiered degradation under overload (R11)."""
    hot_shards: HotShardCfg = HotShardCfg()
    """Hot-shard detection and dynamic replication (R8, R11)."""
    warmup: WarmupCfg = WarmupCfg()
    """Cold-start warm-up (R8)."""
    kv: KvCfg = KvCfg()
    """Paged KV cache accounting (R9, R12)."""
    workload: WorkloadCfg = WorkloadCfg()
    """Requests: arrivals, token counts, classes."""
    metrics: MetricsCfg = MetricsCfg()
    """Time series and invariant checks."""
    faults: FaultsCfg = FaultsCfg()
    """Control plane (Raft), integrity checks, checkers and fault injection (R4, R8, R17, R28)."""
    disaggregation: DisaggCfg = DisaggCfg()
    """Prefill/decode disaggregation: pools, KV transfer, routing, KV store (docs/disaggregation.md)."""
    autoscale: AutoscaleCfg = AutoscaleCfg()
    """Autoscaling: the control loop, its policy and a new replica's cold start (R22,
    docs/design/autoscaling.md); off by default."""
    claims: list[Claim] = []
    """Article figures to measure and print next to the run's (see `Claim`)."""
    variants: list[Variant] = []
    """Named variants; with any, the scenario runs once per variant."""
    source: str = Field(default="<memory>", exclude=True)
    """Where the scenario came from (set by the loader; not a key of the file)."""

    @model_validator(mode="after")
    def _colour_shares_name_models(self) -> Scenario:
        shares = self.cache.params.get("shares")
        if isinstance(shares, dict):
            names = deployment_labels(self.deployments)
            bad = [k for k in shares if k not in names and k != "default"]
            if bad:
                raise ValueError(
                    f"cache.params.shares: no deployed model named {', '.join(map(repr, bad))}; "
                    f"allowed: {', '.join([*names, 'default'])}"
                )
        return self


def deployment_labels(deployments: list[Deployment]) -> list[str]:
    """Each deployment's model label (colour, results): its model name; ``name@vN`` when the
    model is deployed more than once; ``name@vN#i`` when that too repeats."""
    models = [d.model for d in deployments]
    versioned = [f"{d.model}@v{d.version}" for d in deployments]
    out = []
    for i, d in enumerate(deployments):
        label = d.model if models.count(d.model) == 1 else versioned[i]
        if models.count(d.model) > 1 and versioned.count(label) > 1:
            label = f"{label}#{i}"
        out.append(label)
    return out


def validate(data: Any, source: str = "<memory>") -> Scenario:
    """Validate a parsed mapping; ``InputError`` naming ``source`` and the field otherwise
    (:func:`engine.configfile.validate_model`)."""
    sc = validate_model(Scenario, data, source)
    sc.source = source
    return sc


def parse_override(text: str, label: str = "--set") -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (path, YAML-parsed value); errors start with ``label``."""
    if "=" not in text:
        raise InputError(f"{label} {text!r}: expected KEY=VALUE, e.g. cluster.servers=8")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in path):
        raise InputError(f"{label} {show(text)}: empty key path")
    return path, parse_value(raw, f"{label} {show(text)}") if raw.strip() else ""


def apply_overrides(
    data: dict[str, Any], overrides: list[str], source: str, label: str = "--set"
) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key=value`` applied; unknown paths are errors
    (their messages start with ``label``: the option or the file block that set them).

    A path is known when every step is a field of the schema (list items by index, mapping
    fields like ``cache.params`` accept new keys).
    """
    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text, label)
        _set_path(out, path, value, text, label)
    return out


def _set_path(
    root: dict[str, Any], path: list[str], value: Any, text: str, label: str = "--set"
) -> None:
    model: Any = Scenario
    node: Any = root
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise InputError(f"{label} {text}: {'.'.join(path[: i + 1])}: no such list item")
            idx = int(part)
            if last:
                node[idx] = value
                return
            node = node[idx]
            continue
        free_map = model is dict
        if not free_map:
            fields = (
                model.model_fields
                if isinstance(model, type) and issubclass(model, BaseModel)
                else {}
            )
            if part not in fields or part == "source":
                allowed = ", ".join(k for k in fields if k != "source")
                raise InputError(
                    f"{label} {text}: unknown key {'.'.join(path[: i + 1])!r}; allowed here: {allowed}"
                )
            model = _inner_model(fields[part].annotation)
        if last:
            node[part] = value
            return
        if part not in node or node[part] is None:
            node[part] = {}
        node = node[part]


def _inner_model(annotation: Any) -> Any:
    """The pydantic model (or ``dict``) a field holds, looking through lists and Optional."""
    args = getattr(annotation, "__args__", ())
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = getattr(annotation, "__origin__", None)
    if origin is dict or annotation is dict:
        return dict
    for a in args:
        m = _inner_model(a)
        if m is not None:
            return m
    return None


def load_raw(path: str | Path) -> dict[str, Any]:
    """Read a scenario file as a mapping (``InputError`` for a missing or unparsable file)."""
    return read_mapping(path, "scenario")


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Load, override and validate the scenario at ``path``."""
    data = apply_overrides(load_raw(path), overrides or [], str(path))
    return validate(data, source=str(path))


def resolved_dict(sc: Scenario) -> dict[str, Any]:
    """The fully resolved scenario (units normalised, defaults filled) as plain data."""
    return sc.model_dump(mode="json")


def config_hash(sc: Scenario, seed: int) -> str:
    """Short stable hash of the resolved scenario and seed (names run folders)."""
    blob = json.dumps({"scenario": resolved_dict(sc), "seed": seed}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


def variant(sc: Scenario, v: Variant) -> Scenario:
    """The scenario with variant ``v``'s overrides applied (variants and claims dropped)."""
    data = resolved_dict(sc)
    data["variants"] = []
    data["claims"] = []
    over = [f"{k}={json.dumps(val)}" for k, val in v.set.items()]
    data = apply_overrides(data, over, sc.source, f"{sc.source}: variant {v.name!r}: set:")
    out = validate(data, source=f"{sc.source} (variant {v.name})")
    out.name = f"{sc.name}/{v.name}"
    return out
