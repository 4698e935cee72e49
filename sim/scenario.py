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
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from engine.configfile import no_bool_numbers, read_mapping, validate_model
from engine.errors import InputError
from engine.units import parse_duration, parse_rate, parse_size
from sim.faults import FaultsCfg

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


class _M(BaseModel):
    # Every field below carries a one-line attribute docstring: pydantic turns it into the
    # field's description, which sim.docgen prints in docs/scenario-reference.md.
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)
    _no_bool = no_bool_numbers()


class Deployment(_M):
    """One model served by the cluster and its share of the traffic."""

    model: str
    """Model name from the catalogue (shipped: `sim/data/models.yaml`; plus `catalogue`)."""
    share: float = Field(default=1.0, gt=0)
    """Relative share of the requests that go to this model (> 0; shares are normalised)."""
    version: int = Field(default=1, ge=1)
    """Parameter version the model starts at (R1/R4: chunks carry it; pushes raise it)."""
    cls: str | None = None
    """Workload class every request of this model gets; null: classes drawn by their share."""


class NodeCfg(_M):
    """A compute node. ``hbm``/``host`` default to the profile's figures when 0."""

    hbm: Size = 0
    """GPU memory (HBM) per node, bytes or a size like `80GiB`; 0: profile `gpu.hbm_bytes`."""
    weight_cache_fraction: float = Field(default=0.5, gt=0, le=1)
    """Share of HBM used as the weight cache (the rest holds the KV cache); in (0, 1]."""
    host: Size = 0
    """Pinned host memory tier per node (R7), bytes; 0: the profile's `host.dram_bytes`."""
    nvme: Size = "2TiB"  # type: ignore[assignment]
    """Local NVMe SSD weight cache per node (R25), bytes; 0: no NVMe tier."""
    max_batch: int = Field(default=64, ge=1)
    """Most sequences in one continuous batch on a node (>= 1)."""
    max_batch_tokens: int = Field(default=16384, ge=1)
    """Most prompt tokens a node admits into one batch step (>= 1)."""
    max_steps_per_turn: int = Field(default=64, ge=1)
    """Decode steps one model runs before a node with several models switches (>= 1)."""


class PsCfg(_M):
    """A parameter server: DRAM cache over an SSD over the object store."""

    dram: Size = "256GiB"  # type: ignore[assignment]
    """DRAM chunk cache of each parameter server (hot tier, R23), bytes or a size."""
    ssd: Size = "4TiB"  # type: ignore[assignment]
    """SSD chunk cache of each parameter server (warm tier, R23), bytes or a size."""
    ssd_bandwidth: Rate = "7GB/s"  # type: ignore[assignment]
    """Read bandwidth of a parameter server's SSD, bytes/s or a rate like `7GB/s` (> 0)."""
    nic: Rate = "200Gbit/s"  # type: ignore[assignment]
    """NIC bandwidth of each parameter server, bytes/s or a rate like `200Gbit/s` (> 0)."""


class NetworkCfg(_M):
    """Links; zero/None values fall back to the hardware profile."""

    rdma: Rate | None = None
    """Compute-node NIC (RDMA) bandwidth, bytes/s or a rate (R3); null: profile `links.rdma`."""
    rdma_latency: Duration | None = None
    """RDMA first-byte latency, seconds or a duration like `5us`; null: the profile's."""
    object_store: Rate | None = None
    """Object-store bandwidth (cold tier, R23), bytes/s or a rate; null: the profile's."""
    object_store_latency: Duration | None = None
    """Object-store first-byte latency, seconds or a duration; null: the profile's."""


class ClusterCfg(_M):
    """The machines: compute nodes, parameter servers and the links between them."""

    nodes: int = Field(default=4, ge=1, le=4096)
    """Number of compute (GPU) nodes, 1..4096."""
    param_servers: int = Field(default=2, ge=1, le=1024)
    """Number of parameter servers (R1/R8), 1..1024."""
    node: NodeCfg = NodeCfg()
    """Per compute node memory and batching (every node is alike)."""
    ps: PsCfg = PsCfg()
    """Per parameter server tiers and bandwidths (every server is alike)."""
    network: NetworkCfg = NetworkCfg()
    """Link overrides; unset values come from the hardware profile."""


class ChunkCfg(_M):
    """How model weights are cut into chunks (R1, R20, R26)."""

    size: Size = "4MiB"  # type: ignore[assignment]
    """Chunk size in bytes or a size like `4MiB` (R30 suggests 4-16 MB)."""
    sharding: Literal["layer", "layer-head", "layer-head-seq"] = "layer"
    """Sharding (R26): `layer`, `layer-head` (per attention-head group) or `layer-head-seq`."""


class CacheCfg(_M):
    """Eviction policies of the node tiers (R3, R13, R24) and HBM watermarks (R30)."""

    hbm_policy: str = "lru"
    """Eviction policy of the HBM weight cache; one of the eviction policies listed below."""
    host_policy: str = "lru"
    """Eviction policy of the pinned host memory tier; an eviction policy name."""
    nvme_policy: str = "lru"
    """Eviction policy of the node NVMe tier; an eviction policy name."""
    params: dict[str, Any] = {}
    """Keyword parameters of the HBM policy, e.g. `{k: 2}` for `lru-k`; unknown ones are errors."""
    high_watermark: float = Field(default=1.0, gt=0, le=1)
    """HBM cache evicts when use exceeds this share of capacity (R30: 0.8); 1.0: only when full."""
    low_watermark: float = Field(default=1.0, gt=0, le=1)
    """Eviction after crossing the high watermark stops at this share (capped at the high one)."""


class PrefetchCfg(_M):
    """Asynchronous weight prefetch guided by an access heat map (R7, R30)."""

    enabled: bool = True
    """Prefetch the weights of the next batches while the current one computes."""
    window_batches: int = Field(default=3, ge=1, le=16)
    """How many batches ahead to prefetch (R30 suggests 3-5), 1..16."""
    heat_half_life: Duration = 10.0
    """Half-life of the access heat map, seconds or a duration."""


class RingCfg(_M):
    """Consistent-hash placement; ``placement``: ring key per ``shard`` (layer / head group,
    following ``chunks.sharding``) or per ``chunk``."""

    vnodes: int = Field(default=128, ge=1)
    """Virtual nodes per parameter server on the consistent-hash ring (R1), >= 1."""
    replication: int = Field(default=1, ge=1)
    """Initial replicas of each chunk (capped at the number of parameter servers), >= 1."""
    load_factor: float | None = Field(default=None, gt=1)
    """Bounded-load cap: a server holds at most this x its fair share (> 1); null: unbounded."""
    placement: Literal["shard", "chunk"] = "shard"
    """Ring key: `shard` (a layer or head group lives on one server) or `chunk` (each chunk)."""


class SchedulerCfg(_M):
    """Request placement on compute nodes (R2)."""

    policy: Literal["random", "round-robin", "least-loaded", "score"] = "least-loaded"
    """Placement policy (see the placement policies below); `score` uses the weights below."""
    w_fragmentation: float = 1.0
    """`score`: weight of the node's KV-memory fragmentation (R2)."""
    w_pcie: float = 1.0
    """`score`: weight of the node's PCIe link utilisation (R2)."""
    w_affinity: float = 2.0
    """`score`: weight (subtracted) of the share of the model already resident in HBM (R2)."""
    w_load: float = 1.0
    """`score`: weight of (queued + running) / max_batch."""


class DegradationCfg(_M):
    """Tiered degradation (R11): under overload, shed or hold non-protected classes."""

    enabled: bool = False
    """Turn tiered degradation on."""
    protected: list[str] = ["high"]
    """Workload class names that are never shed (always queued)."""
    action: Literal["shed", "queue"] = "shed"
    """What happens to a non-protected request under overload: `shed` or `queue` (held)."""
    queue_per_node: int = Field(default=64, ge=1)
    """A node is overloaded when this many requests wait in its queue (>= 1)."""
    max_wait: Duration = 1.0
    """... or when its oldest queued request has waited this long, seconds or a duration."""


class HotShardCfg(_M):
    """Hot-shard detection (R8/R11): a chunk whose per-window request count exceeds
    ``factor`` x its decayed baseline (and ``min_count``) gains a replica, up to
    ``max_replicas``."""

    enabled: bool = False
    """Turn hot-shard detection and dynamic replication on."""
    window: Duration = 1.0
    """Length of one counting window, seconds or a duration."""
    factor: float = Field(default=3.0, gt=1)
    """A chunk is hot when its window count exceeds this x its baseline (> 1)."""
    min_count: int = Field(default=8, ge=1)
    """... and at least this many requests in the window (>= 1)."""
    max_replicas: int = Field(default=3, ge=1)
    """Most replicas a hot chunk may reach (>= 1)."""


class WarmupCfg(_M):
    """Cold-start warm-up (R8): preload the hottest chunks into PS DRAM (and node HBM)."""

    enabled: bool = True
    """Preload before the first request arrives (at no simulated cost)."""
    ps_fraction: float = Field(default=1.0, ge=0, le=1)
    """Share of parameter-server DRAM filled with the hottest chunks, 0..1."""
    node_hbm: bool = False
    """Also preload node HBM weight caches (always done in `coupled` mode)."""


class KvCfg(_M):
    """KV accounting: paged blocks; attention ``chunked`` (R12: KV walked in ``chunk_tokens``
    pieces, O(chunk) scratch) or ``unchunked`` (O(context^2) prefill scores), which bounds the
    longest context a node can serve (:class:`engine.kv.chunks.AttentionMemoryModel`)."""

    block_tokens: Literal[8, 16, 32, 64, 128, 256, 512] = 16
    """Tokens per paged KV block (R9 uses 64-128); one of 8, 16, ..., 512."""
    allocator: Literal["engine", "count"] = "engine"
    """`engine`: block tables in engine.kv.allocator.KVBlockAllocator; `count`: byte counts only."""
    attention: Literal["chunked", "unchunked"] = "chunked"
    """Attention memory model (R12): `chunked` (O(chunk) scratch) or `unchunked` (O(context^2))."""
    chunk_tokens: int = Field(default=512, ge=1)
    """`chunked`: KV tokens attended per piece (R12: 512), >= 1."""


class TokenDist(_M):
    """A distribution of token counts, clipped to ``[max(low, 1), high]``."""

    dist: Literal["fixed", "uniform", "lognormal"] = "fixed"
    """`fixed` (always `mean`), `uniform` on [low, high], or `lognormal` with mean `mean`."""
    mean: float = Field(default=256, gt=0)
    """Mean tokens (> 0); the value itself for `fixed`."""
    low: int = Field(default=1, ge=0)
    """Smallest count (clip; at least 1 is used)."""
    high: int = Field(default=4096, ge=1)
    """Largest count (clip), >= 1."""
    sigma: float = Field(default=0.5, ge=0)
    """`lognormal`: sigma of the underlying normal, >= 0."""


class ClassCfg(_M):
    """A workload class (e.g. ``high`` / ``low`` priority) with its latency SLO."""

    name: str
    """Class name (referenced by `degradation.protected` and `deployments[].cls`)."""
    share: float = Field(default=1.0, gt=0)
    """Relative share of requests in this class (> 0)."""
    slo: Duration = 10.0
    """End-to-end latency objective of the class, seconds or a duration (availability counts it)."""


class StepCfg(_M):
    """One step of a ``step`` workload: from ``at`` on, arrivals come at ``rate``."""

    at: Duration
    """Time the step starts, seconds or a duration (>= 0)."""
    rate: float = Field(gt=0)
    """Arrival rate from then on, requests/s (> 0)."""


class WorkloadCfg(_M):
    """The requests: arrival process, token counts and classes."""

    kind: Literal["poisson", "step", "diurnal", "closed-loop", "trace"] = "poisson"
    """Arrival process; see the workload kinds below."""
    requests: int = Field(default=1000, ge=1)
    """Number of requests to generate (a trace: at most this many records), >= 1."""
    rate: float = Field(default=10.0, gt=0)
    """Mean arrival rate, requests/s (`poisson`, `diurnal`; `step` before its first step)."""
    steps: list[StepCfg] = []
    """`step`: the rate changes, in time order (R11: 50 -> 1200 QPS)."""
    period: Duration = 60.0
    """`diurnal`: period of the sinusoidal rate, seconds or a duration."""
    amplitude: float = Field(default=0.5, ge=0, lt=1)
    """`diurnal`: rate = rate x (1 + amplitude x sin(2 pi t / period)), in [0, 1)."""
    clients: int = Field(default=16, ge=1)
    """`closed-loop`: concurrent clients, each waiting for its answer before the next request."""
    think_time: Duration = 0.5
    """`closed-loop`: mean exponential think time between a client's requests, seconds."""
    trace: str | None = None
    """`trace`: path of the trace file (relative to the scenario file)."""
    trace_format: Literal["mooncake", "csv"] = "mooncake"
    """`trace`: `mooncake` JSONL (timestamp ms, input_length, output_length) or `csv`."""
    trace_time_scale: float = Field(default=1.0, gt=0)
    """`trace`: multiply trace inter-arrival times by this (< 1 replays faster), > 0."""
    input_tokens: TokenDist = TokenDist()
    """Prompt length distribution (not for `trace`)."""
    output_tokens: TokenDist = TokenDist(mean=64)
    """Generated length distribution (not for `trace`)."""
    classes: list[ClassCfg] = [ClassCfg(name="normal")]
    """Workload classes, drawn by share per request."""


class MetricsCfg(_M):
    """Time series sampling and run-time invariant checks."""

    interval: Duration = 0.0
    """Time-series sampling interval, seconds or a duration; 0: about 200 samples per run."""
    check_invariants: bool = False
    """Check cache and allocator invariants during the run (slower; for tests)."""


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
            names = [d.model for d in self.deployments]
            bad = [k for k in shares if k not in names and k != "default"]
            if bad:
                raise ValueError(
                    f"cache.params.shares: no deployed model named {', '.join(map(repr, bad))}; "
                    f"allowed: {', '.join([*names, 'default'])}"
                )
        return self


def validate(data: Any, source: str = "<memory>") -> Scenario:
    """Validate a parsed mapping; ``InputError`` naming ``source`` and the field otherwise
    (:func:`engine.configfile.validate_model`)."""
    sc = validate_model(Scenario, data, source)
    sc.source = source
    return sc


def parse_override(text: str, label: str = "--set") -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (path, YAML-parsed value); errors start with ``label``."""
    if "=" not in text:
        raise InputError(f"{label} {text!r}: expected KEY=VALUE, e.g. cluster.nodes=8")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in path):
        raise InputError(f"{label} {text!r}: empty key path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise InputError(f"{label} {text!r}: value is not valid YAML ({err})") from None
    return path, value


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
