"""Scenario files: the pydantic schema, the YAML loader and ``--set`` overrides.

A scenario is one YAML file (see ``scenarios/*.yaml``). Loading validates every field, turns
human units into numbers (sizes -> bytes, rates -> bytes/s, durations -> s) and rejects
unknown keys. Any problem becomes one :class:`engine.errors.InputError` naming the file, the
field path and what is allowed, e.g. ``scenarios/x.yaml: cluster.node.hbm: "12 GBB" is not a
size``. Semantic checks that need the model catalogue (an impossible cluster) live in
:func:`sim.cluster.check_feasible`, called by the runner before anything is written.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from engine.errors import InputError
from engine.units import parse_duration, parse_rate, parse_size
from sim.faults import FaultsCfg

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class Deployment(_M):
    """One model served by the cluster and its share of the traffic."""

    model: str
    share: float = Field(default=1.0, gt=0)
    version: int = Field(default=1, ge=1)
    #: every request of this model gets this workload class (else classes are drawn by share)
    cls: str | None = None


class NodeCfg(_M):
    """A compute node. ``hbm``/``host`` default to the profile's figures when 0."""

    hbm: Size = 0
    weight_cache_fraction: float = Field(default=0.5, gt=0, le=1)
    host: Size = 0
    nvme: Size = "2TiB"  # type: ignore[assignment]
    max_batch: int = Field(default=64, ge=1)
    max_batch_tokens: int = Field(default=16384, ge=1)
    max_steps_per_turn: int = Field(default=64, ge=1)


class PsCfg(_M):
    """A parameter server: DRAM cache over an SSD over the object store."""

    dram: Size = "256GiB"  # type: ignore[assignment]
    ssd: Size = "4TiB"  # type: ignore[assignment]
    ssd_bandwidth: Rate = "7GB/s"  # type: ignore[assignment]
    nic: Rate = "200Gbit/s"  # type: ignore[assignment]


class NetworkCfg(_M):
    """Links; zero/None values fall back to the hardware profile."""

    rdma: Rate | None = None
    rdma_latency: Duration | None = None
    object_store: Rate | None = None
    object_store_latency: Duration | None = None


class ClusterCfg(_M):
    nodes: int = Field(default=4, ge=1, le=4096)
    param_servers: int = Field(default=2, ge=1, le=1024)
    node: NodeCfg = NodeCfg()
    ps: PsCfg = PsCfg()
    network: NetworkCfg = NetworkCfg()


class ChunkCfg(_M):
    size: Size = "4MiB"  # type: ignore[assignment]
    sharding: Literal["layer", "layer-head", "layer-head-seq"] = "layer"


class CacheCfg(_M):
    hbm_policy: str = "lru"
    host_policy: str = "lru"
    nvme_policy: str = "lru"
    params: dict[str, Any] = {}
    high_watermark: float = Field(default=1.0, gt=0, le=1)
    low_watermark: float = Field(default=1.0, gt=0, le=1)


class PrefetchCfg(_M):
    enabled: bool = True
    window_batches: int = Field(default=3, ge=1, le=16)
    heat_half_life: Duration = 10.0


class RingCfg(_M):
    """Consistent-hash placement; ``placement``: ring key per ``shard`` (layer / head group,
    following ``chunks.sharding``) or per ``chunk``."""

    vnodes: int = Field(default=128, ge=1)
    replication: int = Field(default=1, ge=1)
    load_factor: float | None = Field(default=None, gt=1)
    placement: Literal["shard", "chunk"] = "shard"


class SchedulerCfg(_M):
    policy: Literal["random", "round-robin", "least-loaded", "score"] = "least-loaded"
    w_fragmentation: float = 1.0
    w_pcie: float = 1.0
    w_affinity: float = 2.0
    w_load: float = 1.0


class DegradationCfg(_M):
    """Tiered degradation (R11): under overload, shed or hold non-protected classes."""

    enabled: bool = False
    protected: list[str] = ["high"]
    action: Literal["shed", "queue"] = "shed"
    queue_per_node: int = Field(default=64, ge=1)
    max_wait: Duration = 1.0


class HotShardCfg(_M):
    """Hot-shard detection (R8/R11): a chunk whose per-window request count exceeds
    ``factor`` x its decayed baseline (and ``min_count``) gains a replica, up to
    ``max_replicas``."""

    enabled: bool = False
    window: Duration = 1.0
    factor: float = Field(default=3.0, gt=1)
    min_count: int = Field(default=8, ge=1)
    max_replicas: int = Field(default=3, ge=1)


class WarmupCfg(_M):
    """Cold-start warm-up (R8): preload the hottest chunks into PS DRAM (and node HBM)."""

    enabled: bool = True
    ps_fraction: float = Field(default=1.0, ge=0, le=1)
    node_hbm: bool = False


class KvCfg(_M):
    """KV accounting: paged blocks; attention ``chunked`` (R12: KV walked in ``chunk_tokens``
    pieces, O(chunk) scratch) or ``unchunked`` (O(context^2) prefill scores), which bounds the
    longest context a node can serve (:class:`engine.kv.chunks.AttentionMemoryModel`)."""

    block_tokens: Literal[8, 16, 32, 64, 128, 256, 512] = 16
    #: "engine": block tables in engine.kv.allocator.KVBlockAllocator; "count": byte counts only
    allocator: Literal["engine", "count"] = "engine"
    attention: Literal["chunked", "unchunked"] = "chunked"
    chunk_tokens: int = Field(default=512, ge=1)


class TokenDist(_M):
    dist: Literal["fixed", "uniform", "lognormal"] = "fixed"
    mean: float = Field(default=256, gt=0)
    low: int = Field(default=1, ge=0)
    high: int = Field(default=4096, ge=1)
    sigma: float = Field(default=0.5, ge=0)


class ClassCfg(_M):
    name: str
    share: float = Field(default=1.0, gt=0)
    slo: Duration = 10.0


class StepCfg(_M):
    at: Duration
    rate: float = Field(gt=0)


class WorkloadCfg(_M):
    kind: Literal["poisson", "step", "diurnal", "closed-loop", "trace"] = "poisson"
    requests: int = Field(default=1000, ge=1)
    rate: float = Field(default=10.0, gt=0)
    steps: list[StepCfg] = []
    period: Duration = 60.0
    amplitude: float = Field(default=0.5, ge=0, lt=1)
    clients: int = Field(default=16, ge=1)
    think_time: Duration = 0.5
    trace: str | None = None
    trace_format: Literal["mooncake", "csv"] = "mooncake"
    trace_time_scale: float = Field(default=1.0, gt=0)
    input_tokens: TokenDist = TokenDist()
    output_tokens: TokenDist = TokenDist(mean=64)
    classes: list[ClassCfg] = [ClassCfg(name="normal")]


class MetricsCfg(_M):
    interval: Duration = 0.0  # 0: pick ~200 samples over the run
    check_invariants: bool = False


class Claim(_M):
    """An article's figure and how the run measures it (printed side by side).

    ``kind``: ``value`` reports ``metric`` of ``variant``; ``relative`` reports
    (variant - baseline) / baseline in percent; ``ratio`` reports variant / baseline.
    """

    id: str
    article: str
    metric: str
    kind: Literal["value", "relative", "ratio"] = "value"
    variant: str | None = None
    baseline: str | None = None


class Variant(_M):
    name: str
    set: dict[str, Any] = {}


class Scenario(_M):
    name: str = "scenario"
    description: str = ""
    profile: str = "a100-80gb"
    catalogue: str | None = None
    mode: Literal["pd", "coupled"] = "pd"
    duration: Duration = 0.0  # 0: until the workload is served
    deployments: list[Deployment] = Field(min_length=1)
    cluster: ClusterCfg = ClusterCfg()
    chunks: ChunkCfg = ChunkCfg()
    cache: CacheCfg = CacheCfg()
    prefetch: PrefetchCfg = PrefetchCfg()
    ring: RingCfg = RingCfg()
    scheduler: SchedulerCfg = SchedulerCfg()
    degradation: DegradationCfg = DegradationCfg()
    hot_shards: HotShardCfg = HotShardCfg()
    warmup: WarmupCfg = WarmupCfg()
    kv: KvCfg = KvCfg()
    workload: WorkloadCfg = WorkloadCfg()
    metrics: MetricsCfg = MetricsCfg()
    #: control plane, checkers and fault injection (issue 5; sim.faults)
    faults: FaultsCfg = FaultsCfg()
    claims: list[Claim] = []
    variants: list[Variant] = []
    #: where the scenario came from (not part of the file; set by the loader).
    source: str = Field(default="<memory>", exclude=True)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _explain(err: dict[str, Any]) -> str:
    typ = err.get("type", "")
    msg = str(err.get("msg", ""))
    if typ == "extra_forbidden":
        return "unknown key (check the spelling)"
    if typ == "literal_error":
        return f"{err.get('input')!r} is not allowed; {msg.replace('Input should be', 'allowed:')}"
    if typ == "missing":
        return "required field is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{err.get('input')!r}: {msg}" if typ != "value_error" else msg


def validate(data: Any, source: str = "<memory>") -> Scenario:
    """Validate a parsed mapping; ``InputError`` naming ``source`` and the field otherwise."""
    if not isinstance(data, dict):
        raise InputError("a scenario must be a mapping of keys to values", source=source)
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise InputError(
            _explain(dict(first)), source=source, where=_format_loc(first["loc"])
        ) from None
    sc.source = source
    return sc


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (path, YAML-parsed value)."""
    if "=" not in text:
        raise InputError(f"--set {text!r}: expected KEY=VALUE, e.g. cluster.nodes=8")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in path):
        raise InputError(f"--set {text!r}: empty key path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise InputError(f"--set {text!r}: value is not valid YAML ({err})") from None
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key=value`` applied; unknown paths are errors.

    A path is known when every step is a field of the schema (list items by index, mapping
    fields like ``cache.params`` accept new keys).
    """
    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        _set_path(out, path, value, text)
    return out


def _set_path(root: dict[str, Any], path: list[str], value: Any, text: str) -> None:
    model: Any = Scenario
    node: Any = root
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise InputError(f"--set {text}: {'.'.join(path[: i + 1])}: no such list item")
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
                    f"--set {text}: unknown key {'.'.join(path[: i + 1])!r}; allowed here: {allowed}"
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
    p = Path(path)
    if not p.is_file():
        raise InputError("no such scenario file", source=str(path))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise InputError(f"not valid YAML: {err}", source=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("a scenario must be a mapping of keys to values", source=str(path))
    return data


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
    data = apply_overrides(data, over, sc.source)
    out = validate(data, source=f"{sc.source} (variant {v.name})")
    out.name = f"{sc.name}/{v.name}"
    return out
