"""The sections of a scenario file: one strict pydantic model each, with the units types.

Every field has a docstring (they make ``docs/scenario-reference.md``, :mod:`sim.docgen`);
unknown keys are rejected. :class:`sim.scenario.Scenario` puts the sections together.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from engine.config import StrictModel
from engine.limits import (
    MAX_REQUEST_RATE,
    MAX_REQUESTS,
    MAX_TOKENS,
    Interval,
    IntervalOrOff,
    TokenCount,
)
from engine.units import parse_duration, parse_rate, parse_size
from sim.daysections import MAX_PROFILE_PIECES, RateProfileCfg

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


class _M(StrictModel, BaseModel):  # BaseModel named too, so linters see a pydantic model
    """Every section's base (see :class:`engine.config.StrictModel`)."""


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


class GpuCfg(_M):
    """One GPU's memory and how a replica splits it (every GPU of the cluster is alike).

    Per GPU: ``hbm * memory_utilization`` is the budget; the activation workspace (sized by
    the replica's token budget) comes off it first; in ``pd`` mode ``weight_cache_fraction`` of
    the rest caches streamed weights, in ``coupled`` mode the weights take ``1 / (tp * pp)`` of
    the model; what is left holds KV blocks."""

    hbm: Size = 0
    """Usable GPU memory (HBM) per GPU, bytes or a size like `80GiB`; 0: profile `gpu.hbm_bytes`."""
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of the usable HBM the server may use (vLLM's `gpu_memory_utilization`), in (0, 1]."""
    workspace: Size | None = None
    """Activation workspace per GPU, bytes or a size; null: estimated from the token budget
    (see docs/serving-model.md)."""
    weight_cache_fraction: float = Field(default=0.5, gt=0, le=1)
    """`pd` mode: share of the budget left after the workspace used as the weight cache; (0, 1]."""


class ServerCfg(_M):
    """A server: `gpus_per_server` GPUs in one NVLink domain plus host memory and NVMe, shared
    by the replicas on it in proportion to their GPUs."""

    host: Size = 0
    """Pinned host memory tier per server (R7), bytes; 0: the profile's `host.dram_bytes`."""
    nvme: Size = "2TiB"  # type: ignore[assignment]
    """Local NVMe SSD weight cache per server (R25), bytes; 0: no NVMe tier."""


class ReplicaCfg(_M):
    """How a replica (one model copy on `tp` x `pp` GPUs) runs its iterations, vLLM-style."""

    max_num_seqs: int = Field(default=256, ge=1, le=MAX_REQUESTS)
    """Most sequences (prefilling or decoding) in one replica's running batch, 1..1e7."""
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=MAX_TOKENS)
    """Token budget of one iteration: one per decoding sequence plus prefill chunks, 1..1e9."""
    chunked_prefill: bool = True
    """Split long prompts into chunks that fill the token budget next to the decodes (vLLM v1);
    false: a prompt is prefilled whole in one iteration (the first prompt always fits)."""
    max_steps_per_turn: int = Field(default=64, ge=1)
    """Decode steps one model runs before a replica with several models switches (>= 1)."""
    streams: Literal["shared", "isolated"] = "shared"
    """Compute streams of a replica with several models (R13): `shared` (one CUDA stream:
    models take turns, round-robin, `max_steps_per_turn` steps each) or `isolated` (models whose
    deployment `cls` is in `degradation.protected` run on a stream of their own: they never wait
    for another model's turn; while both streams have work they interleave iteration by
    iteration, the priority stream getting `stream_share` of the GPU time)."""
    stream_share: float = Field(default=0.5, gt=0, lt=1)
    """`isolated`: share of the GPU time the priority stream gets while both have work, (0, 1)."""


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
    """NIC (RDMA) bandwidth per GPU, bytes/s or a rate (R3); null: profile `links.rdma`."""
    rdma_latency: Duration | None = None
    """RDMA first-byte latency, seconds or a duration like `5us`; null: the profile's."""
    object_store: Rate | None = None
    """Object-store bandwidth (cold tier, R23), bytes/s or a rate; null: the profile's."""
    object_store_latency: Duration | None = None
    """Object-store first-byte latency, seconds or a duration; null: the profile's."""


class ClusterCfg(_M):
    """The machines: GPU servers, the replicas they host, parameter servers and links.

    A *server* holds `gpus_per_server` GPUs in one NVLink domain. A *replica* is one copy of
    the served models on `tp` x `pp` GPUs: inside one server when `tp * pp <= gpus_per_server`
    (then `gpus_per_server` must be a multiple of `tp * pp`), else spanning whole servers (then
    `tp * pp` must be a multiple of `gpus_per_server` and `servers` of the servers per replica).
    """

    servers: int = Field(default=4, ge=1, le=4096)
    """Number of GPU servers, 1..4096."""
    gpus_per_server: int = Field(default=1, ge=1, le=64)
    """GPUs per server, all in one NVLink domain (e.g. 8 for an HGX H200), 1..64."""
    tp: int = Field(default=1, ge=1, le=512)
    """Tensor-parallel degree of a replica: each layer is split over `tp` GPUs (2 all-reduces
    per transformer layer), 1..512."""
    pp: int = Field(default=1, ge=1, le=128)
    """Pipeline-parallel degree: the layers are split into `pp` stages on different GPUs
    (one activation hand-off per stage boundary; one batch in flight, so (pp-1)/pp bubbles), 1..128."""
    ep: int = Field(default=1, ge=1, le=512)
    """Expert parallelism of mixture-of-experts models: GPUs the routed experts are sharded
    over, 1..512. A divisor of `tp`: experts split inside each replica's `tp` GPUs; a
    multiple of `tp` (pp 1): attention data parallelism, `ep / tp` replicas of one server
    share one expert group, step together and exchange tokens by all-to-all
    (docs/models.md). 1: every expert split by `tp`."""
    param_servers: int = Field(default=2, ge=1, le=1024)
    """Number of parameter servers (R1/R8), 1..1024."""
    gpu: GpuCfg = GpuCfg()
    """Per GPU memory (every GPU is alike)."""
    server: ServerCfg = ServerCfg()
    """Per server host memory and NVMe (every server is alike)."""
    replica: ReplicaCfg = ReplicaCfg()
    """Per replica batching (every replica is alike)."""
    ps: PsCfg = PsCfg()
    """Per parameter server tiers and bandwidths (every server is alike)."""
    network: NetworkCfg = NetworkCfg()
    """Link overrides; unset values come from the hardware profile."""

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica (`tp * pp`)."""
        return self.tp * self.pp

    @property
    def servers_per_replica(self) -> int:
        """Servers one replica spans (1 when it fits in one server)."""
        return max(1, self.gpus_per_replica // self.gpus_per_server)

    @property
    def replicas(self) -> int:
        """Number of replicas (every GPU of the cluster in one; see the class docstring)."""
        g = self.gpus_per_replica
        if g <= self.gpus_per_server:
            return self.servers * (self.gpus_per_server // g)
        return self.servers // self.servers_per_replica

    @property
    def gpus(self) -> int:
        """GPUs of the whole cluster."""
        return self.servers * self.gpus_per_server


class ChunkCfg(_M):
    """How model weights are cut into chunks (R1, R20, R26)."""

    size: Size = "4MiB"  # type: ignore[assignment]
    """Chunk size in bytes or a size like `4MiB` (R30 suggests 4-16 MB)."""
    sharding: Literal["layer", "layer-head", "layer-head-seq"] = "layer"
    """Sharding (R26): `layer`, `layer-head` (per attention-head group) or `layer-head-seq`."""


class RingCfg(_M):
    """Consistent-hash placement; ``placement``: ring key per ``chunk`` (default) or per
    ``shard`` (layer / head group, following ``chunks.sharding``)."""

    vnodes: int = Field(default=128, ge=1, le=65536)
    """Virtual nodes per parameter server on the consistent-hash ring (R1), 1..65536."""
    replication: int = Field(default=1, ge=1)
    """Initial replicas of each chunk (capped at the number of parameter servers), >= 1."""
    load_factor: float | None = Field(default=None, gt=1)
    """Bounded-load cap: a server holds at most this x its fair share (> 1); null: unbounded."""
    placement: Literal["shard", "chunk"] = "chunk"
    """Ring key: `chunk` (each chunk on its own, even byte load) or `shard` (a layer per server)."""


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
    max_wait: Interval = 1.0
    """... or when its oldest queued request has waited this long, seconds or a duration
    (>= 1 us: an overloaded node is re-checked every `max_wait / 4`)."""


class HotShardCfg(_M):
    """Hot-shard detection (R8/R11): a chunk whose per-window request count exceeds
    ``factor`` x its decayed baseline (and ``min_count``) gains a replica, up to
    ``max_replicas``."""

    enabled: bool = False
    """Turn hot-shard detection and dynamic replication on."""
    window: Interval = 1.0
    """Length of one counting window, seconds or a duration (>= 1 us)."""
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
    longest context a node can serve (:class:`engine.kv.longctx.AttentionMemoryModel`)."""

    block_tokens: Literal[8, 16, 32, 64, 128, 256, 512] = 16
    """Tokens per paged KV block (R9 uses 64-128); one of 8, 16, ..., 512."""
    allocator: Literal["engine", "count"] = "engine"
    """`engine`: block tables in engine.kv.allocator.KVBlockAllocator; `count`: byte counts only."""
    attention: Literal["chunked", "unchunked"] = "chunked"
    """Attention memory model (R12): `chunked` (O(chunk) scratch) or `unchunked` (O(context^2))."""
    chunk_tokens: int = Field(default=512, ge=1, le=MAX_TOKENS)
    """`chunked`: KV tokens attended per piece (R12: 512), 1..1e9."""
    storage: Literal["paged", "chunked", "contiguous"] = "paged"
    """KV storage layout that bounds the longest context (R12, engine.kv.footprint): `paged`
    (blocks), `chunked` (`chunk_tokens` pieces, never copied) or `contiguous` (one buffer per
    sequence regrown by `regrowth` when full: old + new coexist while copying, freed buffers
    fragment). Serving still allocates paged blocks; this sets `max_context_limit`."""
    regrowth: float = Field(default=1.5, gt=1)
    """`contiguous`: factor a full buffer grows by (the article's 1.5), > 1."""
    preemption: Literal["recompute", "swap"] = "recompute"
    """When KV blocks run out mid-decode, the newest running sequence is preempted: `recompute`
    (its blocks are freed; it re-queues and prefills prompt + generated tokens again) or `swap`
    (its KV is copied to host swap space over PCIe and back when it resumes)."""
    swap_space: Size = "4GiB"  # type: ignore[assignment]
    """`swap`: host swap space per GPU (vLLM's default 4 GiB); a full swap space recomputes."""
    admission_watermark: float = Field(default=0.01, ge=0, lt=1)
    """Share of KV blocks a new prompt must leave free for running sequences to grow (0.01)."""
    prefix_caching: bool = True
    """Reuse the KV blocks of a cached prompt prefix (vLLM's default: on) when the trace names its
    prompt blocks (Mooncake `hash_ids`); needs `allocator: engine`. See docs/serving-model.md."""

    @model_validator(mode="after")
    def _prefix_caching_needs_block_tables(self) -> KvCfg:
        explicit = "prefix_caching" in self.model_fields_set
        if self.prefix_caching and explicit and self.allocator == "count":
            raise ValueError(
                "prefix_caching: true needs allocator: engine (block tables); "
                "allowed with allocator: count: prefix_caching: false"
            )
        return self


class TokenDist(_M):
    """A distribution of token counts, clipped to ``[max(low, 1), high]``."""

    dist: Literal["fixed", "uniform", "lognormal", "geometric"] = "fixed"
    """`fixed` (always `mean`), `uniform` on [low, high], `lognormal` with mean `mean`, or
    `geometric` (memoryless, P(k) = (1-p)^(k-1) p, mean `mean` >= 1 before clipping)."""
    mean: float = Field(default=256, gt=0, le=MAX_TOKENS)
    """Mean tokens (> 0, at most 1e9); the value itself for `fixed`."""
    low: TokenCount = 1
    """Smallest count (clip; at least 1 is used), 0..1e9."""
    high: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 4096
    """Largest count (clip), 1..1e9, at least `low`."""
    sigma: float = Field(default=0.5, ge=0)
    """`lognormal`: sigma of the underlying normal, >= 0."""

    @model_validator(mode="after")
    def _low_not_above_high(self) -> TokenDist:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}; allowed: low <= high")
        return self


class ClassCfg(_M):
    """A workload class (e.g. ``high`` / ``low`` priority) with its latency SLO."""

    name: str
    """Class name (referenced by `degradation.protected` and `deployments[].cls`)."""
    share: float = Field(default=1.0, gt=0)
    """Relative share of requests in this class (> 0)."""
    slo: Duration = 10.0
    """End-to-end latency objective of the class, seconds or a duration (availability counts it)."""
    ttft_slo: Duration | None = None
    """Time-to-first-token objective, seconds or a duration; null: none (goodput ignores it)."""
    tpot_slo: Duration | None = None
    """Time-per-output-token objective (mean gap between a request's tokens after the first),
    seconds or a duration; null: none."""


class StepCfg(_M):
    """One step of a ``step`` workload: from ``at`` on, arrivals come at ``rate``."""

    at: Duration
    """Time the step starts, seconds or a duration (>= 0)."""
    rate: float = Field(gt=0, le=MAX_REQUEST_RATE)
    """Arrival rate from then on, requests/s (> 0, at most 1e7)."""


#: most periods of the diurnal rate one workload spans (its rate curve is tabulated per period)
MAX_PERIODS = 20_000


class WorkloadCfg(_M):
    """The requests: arrival process, token counts and classes."""

    kind: Literal["poisson", "step", "diurnal", "profile", "closed-loop", "trace"] = "poisson"
    """Arrival process; see the workload kinds below."""
    requests: int = Field(default=1000, ge=1, le=MAX_REQUESTS)
    """Number of requests to generate (a trace: at most this many records), 1..1e7; ignored
    when `duration` bounds the workload."""
    duration: Duration = 0.0
    """Bound the workload by time instead: every arrival in `[0, duration)` seconds (open-loop
    kinds; a trace: its records in that span); 0: bounded by `requests`."""
    rate: float = Field(default=10.0, gt=0, le=MAX_REQUEST_RATE)
    """Mean arrival rate, requests/s (`poisson`, `diurnal`; `step` before its first step;
    `profile`: the mean of its daily shape, before noise, bursts and surges), at most 1e7;
    with `duration`, the peak rate x `duration` is at most 1e7 requests."""
    steps: list[StepCfg] = []
    """`step`: the rate changes, in time order (R11: 50 -> 1200 QPS)."""
    period: Interval = 60.0
    """`diurnal`: period of the sinusoidal rate, seconds or a duration (>= 1 us; the run spans
    at most 20,000 periods)."""
    amplitude: float = Field(default=0.5, ge=0, lt=1)
    """`diurnal`: rate = rate x (1 + amplitude x sin(2 pi t / period)), in [0, 1)."""
    rate_profile: RateProfileCfg = RateProfileCfg()
    """`profile`: the rate over a day (shape, noise, bursts, surges, time compression)."""
    clients: int = Field(default=16, ge=1, le=MAX_REQUESTS)
    """`closed-loop`: concurrent clients, each waiting for its answer before the next request."""
    think_time: Duration = 0.5
    """`closed-loop`: mean exponential think time between a client's requests, seconds."""
    trace: str | None = None
    """`trace`: path of the trace file (relative to the scenario file); `shipped:NAME`: a trace
    shipped in the package, e.g. `shipped:mooncake_slice.jsonl`."""
    trace_format: Literal["auto", "mooncake", "csv", "azure"] = "auto"
    """`trace`: `mooncake` JSONL (timestamp ms, input_length, output_length), `csv`
    (`time,input_tokens,output_tokens`, seconds), `azure` (the Azure LLM inference trace's
    `TIMESTAMP,ContextTokens,GeneratedTokens`, a date and time) or `auto`: `.jsonl`/`.json` or
    a first line starting with `{` is Mooncake, a CSV header naming the Azure columns is
    Azure, any other CSV is `csv`."""
    trace_time_scale: float = Field(default=1.0, gt=0, le=1e6)
    """`trace`: multiply trace inter-arrival times by this (< 1 replays faster), in (0, 1e6]."""
    trace_peak_rate: float | None = Field(default=None, gt=0, le=MAX_REQUEST_RATE)
    """`trace`: scale the trace's time so that its busiest `trace_peak_window` averages this
    many requests/s (replaces `trace_time_scale`, which must then stay 1); null: off."""
    trace_peak_window: Duration = Field(default=60.0, gt=0)
    """`trace`: the window `trace_peak_rate` is measured over, on the trace's own clock
    (before scaling; 60 s: the busiest minute), > 0."""
    input_tokens: TokenDist = TokenDist()
    """Prompt length distribution (not for `trace`)."""
    output_tokens: TokenDist = TokenDist(mean=64)
    """Generated length distribution (not for `trace`)."""
    classes: list[ClassCfg] = [ClassCfg(name="normal")]
    """Workload classes, drawn by share per request."""

    @model_validator(mode="after")
    def _arrivals_bounded(self) -> WorkloadCfg:
        """A generated open-loop workload stays within :data:`engine.limits.MAX_REQUESTS`
        (rate x duration), when diurnal within 20,000 periods, when a profile within
        :data:`sim.daysections.MAX_PROFILE_PIECES` pieces of rate table; a trace's
        `trace_peak_rate` and `trace_time_scale` exclude each other."""
        if self.kind == "trace" and self.trace_peak_rate and self.trace_time_scale != 1.0:
            raise ValueError(
                "trace_peak_rate sets the time scale; allowed: trace_time_scale 1 (unset) with it"
            )
        if self.kind in ("trace", "closed-loop"):
            return self
        peak = self.rate
        if self.kind == "step":
            peak = max([self.rate, *(st.rate for st in self.steps)])
        elif self.kind == "diurnal":
            peak = self.rate * (1 + self.amplitude)
        elif self.kind == "profile":
            peak = self.rate * self.rate_profile.peak_shape()  # noise, bursts: checked when drawn
            days = (self.duration or 0.0) / self.rate_profile.day
            pieces = days * self.rate_profile.pieces_per_day()
            if pieces > MAX_PROFILE_PIECES:
                raise ValueError(
                    f"rate_profile: {days:.3g} days at resolution "
                    f"{self.rate_profile.resolution:g} s tabulate about {pieces:.3g} rate pieces; "
                    f"allowed: at most {MAX_PROFILE_PIECES:.0e} (a coarser resolution or "
                    "noise_interval, or a shorter duration)"
                )
        if self.duration > 0 and peak * self.duration > MAX_REQUESTS:
            raise ValueError(
                f"rate x duration: {peak:g} requests/s for {self.duration:g} s is about "
                f"{peak * self.duration:.3g} requests; allowed: at most {MAX_REQUESTS:.0e}"
            )
        if self.kind == "diurnal":
            span = self.duration or self.requests / (self.rate * (1 - self.amplitude))
            if span / self.period > MAX_PERIODS:
                raise ValueError(
                    f"period: {self.period:g} s is {span / self.period:.3g} periods of the "
                    f"{span:.3g} s the workload spans; allowed: at most {MAX_PERIODS:,}"
                )
        return self


class MetricsCfg(_M):
    """Time series sampling, the steady-state window, the stall limit and invariant checks.

    Headline figures (latency percentiles, offered and achieved throughput, goodput,
    utilisation) come from the *steady window*: requests that arrive in
    ``[warmup, last arrival - cooldown]``; see docs/metrics.md."""

    interval: IntervalOrOff = 0.0
    """Time-series sampling interval, seconds or a duration (>= 1 us); 0: about 200 samples
    per run."""
    check_invariants: bool = False
    """Check cache and allocator invariants during the run (slower; for tests)."""
    warmup: Duration | None = None
    """Start of the steady window, seconds or a duration; null: 10% of the arrival span."""
    cooldown: Duration = 0.0
    """The steady window ends this long before the last arrival, seconds or a duration."""
    max_waiting: int | None = Field(default=None, ge=1)
    """Stop the run when more than this many requests wait in the replicas' queues (a run
    that cannot keep up, e.g. a capacity plan's undersized probe); they are reported as
    unfinished. null: never."""
    stall_timeout: Duration = Field(default=600.0, gt=0)
    """Stop when no request has finished for this long (simulated) while some are unfinished;
    they are reported as unfinished and `pdsim run` exits 3. Seconds or a duration (> 0)."""
