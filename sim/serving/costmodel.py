"""Hardware profiles and the roofline cost model the simulator charges for compute and copies.

A :class:`Profile` is the JSON schema shared with hwbench calibration: datasheet profiles ship in
``sim/data/profiles/`` (``source: "datasheet"``), calibration writes ``source: "measured"``.
Unknown keys are errors; sizes and rates may be numbers (bytes, bytes/s, seconds) or strings in
human units (``"80GB"``, ``"2TB/s"``, ``"10us"``).

:class:`CostModel` turns a profile and a :class:`sim.serving.models.ModelSpec` into times, using tables
precomputed in the constructor (no model objects touched per call):

* ``layer_time(layer, tokens)`` -- roofline: ``max(flops / (peak * efficiency), bytes /
  hbm_bandwidth) + per_layer_overhead_s``, where bytes = the layer's weights (read once per
  call) and, for a decoder layer without FLOPs (an embedding table), only the looked-up rows.
* ``prefill_time(tokens, sq_tokens=None)`` -- all layers over ``tokens`` prompt tokens, plus
  causal attention ``2 * sq_tokens * heads * head_dim`` FLOPs per attention layer
  (``sq_tokens`` = sum of squared prompt lengths; default ``tokens**2``, one prompt) and the KV
  written, plus one ``kernel_launch_s``.
* ``decode_step_time(batch, total_context_tokens)`` -- one token for each of ``batch``
  sequences: weights read once per step, the whole batch's KV (``total_context_tokens``) read
  once, weight FLOPs for ``batch`` tokens plus ``4 * heads * head_dim`` FLOPs per context
  token per attention layer; plus one ``kernel_launch_s``.
* ``cnn_batch_time(batch)`` -- all layers for ``batch`` samples.
* ``transfer_time(nbytes, link)`` -- ``latency + nbytes / bandwidth`` for a profile link
  (``pcie``, ``nvlink``, ``rdma``, ``nvme``, ``object_store``) or ``hbm`` / ``dram``.

Peak FLOP/s is ``flops_fp16`` for models with ``dtype_bytes <= 2`` and ``flops_fp32`` otherwise.
Activations are not charged separately (they are small next to weights and KV at the batch
sizes simulated); calibration folds them into ``compute_efficiency`` and the overheads.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from engine.configfile import parse_mapping, read_mapping, validate_model
from engine.limits import CheckedModel
from engine.units import parse_duration, parse_rate, parse_size
from sim.serving.iterprice import RooflinePass
from sim.serving.models import ModelSpec
from sim.serving.opcost.tables import OpsProfile

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]

#: shipped profiles: datasheet figures, and op tables imported from measured kernel timings
#: (``*-vllm``; sim.serving.opcost.aic_import, attribution in NOTICE)
SHIPPED_PROFILES: tuple[str, ...] = (
    "a100-80gb",
    "h100-sxm",
    "h200-sxm",
    "a100-sxm-vllm",
    "h100-sxm-vllm",
    "h200-sxm-vllm",
    "b200-sxm-vllm",
)
LINK_NAMES: tuple[str, ...] = ("pcie", "nvlink", "rdma", "nvme", "object_store")


class _Strict(CheckedModel, BaseModel):  # BaseModel named too, for linters
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class LinkProfile(_Strict):
    """A link's sustained bandwidth (bytes/s) and first-byte latency (s)."""

    bandwidth: Rate
    """Sustained bandwidth, bytes/s or a rate like `25GB/s` (> 0)."""
    latency: Seconds
    """First-byte latency, seconds or a duration like `5us`."""


class GpuProfile(_Strict):
    """One accelerator."""

    hbm_bytes: Size
    """Usable GPU memory per GPU (what the driver reports, not the marketing figure), bytes or
    a size like `79GiB`."""
    hbm_bandwidth: Rate
    """GPU memory bandwidth, bytes/s or a rate like `2TB/s`."""
    flops_fp16: float = Field(gt=0)
    """Dense FP16/BF16 peak, FLOP/s (used for models with dtype_bytes <= 2)."""
    flops_fp32: float = Field(gt=0)
    """Dense FP32 peak, FLOP/s (used for models with dtype_bytes > 2)."""
    compute_efficiency: float = Field(gt=0, le=1)
    """Achieved / peak FLOP/s for large matmuls, in (0, 1]."""
    kernel_launch_s: Seconds
    """Overhead charged once per prefill or decode step, seconds (R16)."""
    per_layer_overhead_s: Seconds
    """Overhead charged per layer call, seconds."""


class HostProfile(_Strict):
    """The host's DRAM (pinned host memory tier)."""

    dram_bytes: Size
    """Host DRAM per server (the pinned host memory tier's default size), bytes or a size."""
    dram_bandwidth: Rate
    """Host DRAM bandwidth, bytes/s or a rate."""


class LinksProfile(_Strict):
    """The links of a server, one profile each: `pcie`, `nvlink` and `rdma` per GPU (a server
    has one of each per GPU), `nvme` and `object_store` per server."""

    pcie: LinkProfile
    """Host <-> GPU PCIe link, per GPU."""
    nvlink: LinkProfile
    """GPU <-> GPU NVLink inside a server, per GPU and direction (TP all-reduce, PP hand-off)."""
    rdma: LinkProfile
    """NIC (RDMA) per GPU: parameter servers (R3), and TP/PP traffic across servers."""
    nvme: LinkProfile
    """Local NVMe SSD, per server."""
    object_store: LinkProfile
    """Object store (cold tier, R23), per server."""


class Profile(_Strict):
    """A calibration profile (datasheet or measured). ``hostname`` names the machine measured;
    ``host`` is its DRAM. ``fitted`` holds optional fitted tables (rows of numbers by table
    name, e.g. ``{"matmul": [{"m": 4096, "n": 4096, "k": 4096, "flops_per_s": 6.1e14}]}``)."""

    name: str
    """Profile name, e.g. `a100-80gb`."""
    source: Literal["datasheet", "measured"]
    """`datasheet` (vendor figures) or `measured` (written by `pdsim calibrate`)."""
    measured_at: str | None = None
    """When it was measured (ISO 8601); null for datasheets."""
    hostname: str | None = None
    """Machine measured; null for datasheets."""
    notes: str = ""
    """Free text: sources of the figures, caveats."""
    gpu: GpuProfile
    """The accelerator."""
    host: HostProfile
    """The host's DRAM."""
    links: LinksProfile
    """The links a node uses."""
    fitted: dict[str, list[dict[str, float]]] = Field(default_factory=dict)
    """Optional fitted tables: rows of numbers by table name (e.g. `matmul`)."""
    ops: OpsProfile | None = None
    """Op tables (measured kernel times) and roofline terms for `sim.serving.opcost`; null: none."""


def parse_profile(text: str, source: str) -> Profile:
    """Parse profile JSON ``text``; :class:`InputError` naming ``source`` and the field."""
    return validate_model(Profile, parse_mapping(text, source, "profile", fmt="json"), source)


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (:data:`SHIPPED_PROFILES`) or a JSON file."""
    name = str(name_or_path)
    if name in SHIPPED_PROFILES:
        text = resources.files("sim").joinpath(f"data/profiles/{name}.json").read_text("utf-8")
        return parse_profile(text, f"sim/data/profiles/{name}.json")
    path = Path(name_or_path)
    hint = f"shipped profiles: {', '.join(SHIPPED_PROFILES)}"
    raw = read_mapping(path, "profile", hint=hint, fmt="json")
    return validate_model(Profile, raw, str(path))


class CostModel:
    """Times for one model on one profile's hardware; see the module docstring."""

    #: warm-up costs the simulator's node adds (sim.serving.replica): seconds for the first iteration
    #: after the node sat idle, less ``wake_hide`` seconds per second of that iteration's own
    #: compute (a long prefill hides the cold start), floored at 0; seconds for the first
    #: decode step after a prefill, each later step ``rewarm_decay`` times the one before (in
    #: [0, 1)). Zero here: datasheet profiles describe a warm machine; a calibrated engine's
    #: cost model sets them.
    wake_s: float = 0.0
    wake_hide: float = 0.0
    rewarm_s: float = 0.0
    rewarm_decay: float = 0.0
    #: seconds the serving loop spends between two back-to-back iterations (scheduling,
    #: bookkeeping: no compute), charged once per iteration; zero here for the same reason
    iter_gap_s: float = 0.0
    #: compute seconds lost per byte prefetched while computing, and seconds from a
    #: prefetch's planning to its copy's start
    #: (:attr:`sim.serving.opcost.EngineTerms.prefetch_compute_s_per_byte`,
    #: ``prefetch_handoff_s``); zero here, as above
    prefetch_compute_s_per_byte: float = 0.0
    prefetch_handoff_s: float = 0.0
    #: the calibrated engine's terms, whose ``prefetch_per_byte`` gives the per-byte figure
    #: by a replica's weight cache (None: the single figure above)
    engine_terms: Any = None

    #: whether an iteration that mixes prefill chunks and decodes is ONE pass over the weights
    #: (a vLLM / SGLang server: :meth:`iteration_time`) or a prefill pass plus a decode pass
    #: (the project's real engine, whose cost model turns this off)
    fused_iterations: bool = True

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec,
        tp: int = 1,
        pp: int = 1,
        gpus_per_server: int = 1,
    ) -> None:
        """``tp`` x ``pp`` GPUs per replica; a replica wider than ``gpus_per_server`` runs its
        collectives over the NIC (``rdma``) instead of NVLink."""
        if tp < 1 or pp < 1 or gpus_per_server < 1:
            raise ValueError(
                f"tp, pp, gpus_per_server must be >= 1, got {tp}, {pp}, {gpus_per_server}"
            )
        self.profile = profile
        self.model = model
        self.tp, self.pp = tp, pp
        link = profile.links.nvlink if tp * pp <= gpus_per_server else profile.links.rdma
        self.tp_link = (link.latency, link.bandwidth)
        #: activations travel in 16 bits unless the weights are wider (fp8 weights: bf16 activations)
        self.act_bytes = max(2, model.dtype_bytes)
        #: KV heads are split over TP ranks; with more ranks than KV heads each rank keeps a copy
        self.kv_replication = max(1, tp // max(model.kv_heads, 1)) if model.kv_heads else 1
        #: a profile with measured op tables prices an iteration op by op (sim.serving.opcost); the
        #: roofline below then only counts FLOPs and bytes (MFU, MBU)
        self.ops: Any = None
        if profile.ops is not None and model.kind == "decoder":
            from sim.serving.opcost import OpCostModel

            self.ops = OpCostModel(profile, model, tp=tp)
            eng = (
                profile.ops.engine
            )  # a calibrated engine's own terms (sim.serving.opcost.EngineTerms)
            if eng is not None:
                self.wake_s = eng.wake_s
                self.iter_gap_s = eng.iter_gap_s
                self.prefetch_compute_s_per_byte = eng.prefetch_compute_s_per_byte
                self.prefetch_handoff_s = eng.prefetch_handoff_s
                self.engine_terms = eng
        gpu = profile.gpu
        peak = gpu.flops_fp16 if model.dtype_bytes <= 2 else gpu.flops_fp32
        self.flop_rate = peak * gpu.compute_efficiency  # achieved FLOP/s
        self.hbm_bandwidth = gpu.hbm_bandwidth
        self.overhead = gpu.per_layer_overhead_s
        self.launch = gpu.kernel_launch_s
        is_cnn = model.kind == "cnn"
        n = model.n_layers
        # Per-layer tables, indexed by layer number.
        self.layer_flops = np.array(
            [ly.flops_per_sample if is_cnn else ly.flops_per_token for ly in model.layers]
        )
        self.layer_bytes = np.array([ly.param_bytes for ly in model.layers], dtype=np.float64)
        self.layer_attention = np.array([ly.attention for ly in model.layers], dtype=bool)
        # A decoder layer without FLOPs is a lookup table: a token reads one row of it.
        self.layer_lookup = (self.layer_flops == 0) & (not is_cnn)
        row = model.hidden * model.dtype_bytes
        self.layer_row_bytes = np.where(self.layer_lookup, float(row), 0.0)
        n_attn = max(1, model.n_attention_layers)
        self.kv_bytes_per_token_layer = model.kv_bytes_per_token / n_attn
        self.attn_flops_per_ctx = 4.0 * model.heads * model.head_dim  # per attention layer
        # Distinct layer kinds with multiplicities, for the scalar fast paths.
        groups: dict[tuple[float, float, bool, bool], int] = {}
        for i in range(n):
            sig = (
                float(self.layer_flops[i]),
                float(self.layer_bytes[i]),
                bool(self.layer_attention[i]),
                bool(self.layer_lookup[i]),
            )
            groups[sig] = groups.get(sig, 0) + 1
        self._groups = [(*sig, count) for sig, count in groups.items()]
        # The fused, parallel pass (iteration_time): per layer kind, FLOPs per token and weight
        # bytes per TP rank (a layer lives on one PP stage).
        head = np.array([ly.name == "lm_head" for ly in model.layers], dtype=bool)
        self._fgroups: list[tuple[float, float, bool, bool, bool, int]] = []
        fsig: dict[tuple[float, float, bool, bool, bool], int] = {}
        for i in range(n):
            key = (
                float(self.layer_flops[i]) / tp,
                float(self.layer_bytes[i]) / tp,
                bool(self.layer_attention[i]),
                bool(self.layer_lookup[i]),
                bool(head[i]),
            )
            fsig[key] = fsig.get(key, 0) + 1
        self._fgroups = [(*k, c) for k, c in fsig.items()]
        self.n_allreduce = 2 * model.n_attention_layers + 1  # attention + MLP per layer, embedding
        #: the fused pass's arithmetic (sim.serving.iterprice); ``roofline`` is what a
        #: simulator asks directly, None when op tables price the pass instead
        self._roof = RooflinePass(
            self._fgroups,
            tp=tp,
            pp=pp,
            flop_rate=self.flop_rate,
            hbm_bandwidth=self.hbm_bandwidth,
            overhead=self.overhead,
            launch=self.launch,
            attn_flops_per_ctx=self.attn_flops_per_ctx,
            kv_bytes_per_token_layer=self.kv_bytes_per_token_layer,
            kv_replication=self.kv_replication,
            hidden=model.hidden,
            dtype_bytes=model.dtype_bytes,
            act_bytes=self.act_bytes,
            n_allreduce=self.n_allreduce,
            link=self.tp_link,
        )
        self.roofline: RooflinePass | None = self._roof if self.ops is None else None
        self._links: dict[str, tuple[float, float]] = {
            name: (getattr(profile.links, name).latency, getattr(profile.links, name).bandwidth)
            for name in LINK_NAMES
        }
        self._links["hbm"] = (0.0, gpu.hbm_bandwidth)
        self._links["dram"] = (0.0, profile.host.dram_bandwidth)

    # -- per layer ------------------------------------------------------------------------------
    def layer_time(self, layer: int, tokens: int) -> float:
        """Seconds for ``layer`` over ``tokens`` tokens (samples for a CNN), no attention."""
        flops = self.layer_flops[layer] * tokens
        if self.layer_lookup[layer]:
            nbytes = min(self.layer_bytes[layer], self.layer_row_bytes[layer] * tokens)
        else:
            nbytes = self.layer_bytes[layer]
        return float(max(flops / self.flop_rate, nbytes / self.hbm_bandwidth) + self.overhead)

    def layer_times(self, tokens: int) -> np.ndarray:
        """Vector of :meth:`layer_time` for every layer."""
        nbytes = np.where(
            self.layer_lookup,
            np.minimum(self.layer_bytes, self.layer_row_bytes * tokens),
            self.layer_bytes,
        )
        return (
            np.maximum(self.layer_flops * tokens / self.flop_rate, nbytes / self.hbm_bandwidth)
            + self.overhead
        )

    # -- whole passes ---------------------------------------------------------------------------
    def _pass(self, tokens: float, ctx_flops: float, ctx_bytes: float) -> float:
        """Sum over layer groups of max(compute, memory) time; attention layers add
        ``ctx_flops`` FLOPs and ``ctx_bytes`` bytes each."""
        total = 0.0
        rate, bw = self.flop_rate, self.hbm_bandwidth
        for flops, nbytes, attention, lookup, count in self._groups:
            f = flops * tokens
            b = (
                min(nbytes, tokens * self.model.hidden * self.model.dtype_bytes)
                if lookup
                else nbytes
            )
            if attention:
                f += ctx_flops
                b += ctx_bytes
            total += count * (max(f / rate, b / bw) + self.overhead)
        return total + self.launch

    def prefill_time(self, tokens: int, sq_tokens: int | None = None) -> float:
        """Seconds to prefill ``tokens`` prompt tokens (``sq_tokens``: sum of squared prompt
        lengths when several prompts are batched; default one prompt)."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        sq = float(tokens) ** 2 if sq_tokens is None else float(sq_tokens)
        attn_flops = 0.5 * self.attn_flops_per_ctx * sq  # causal: half the score matrix
        kv_written = self.kv_bytes_per_token_layer * tokens
        return self._pass(float(tokens), attn_flops, kv_written)

    def decode_step_time(self, batch: int, total_context_tokens: int) -> float:
        """Seconds for one decode step of ``batch`` sequences holding ``total_context_tokens``
        tokens of KV in all. Increases with both arguments."""
        if batch < 0 or total_context_tokens < 0:
            raise ValueError("batch and total_context_tokens must be >= 0")
        ctx = float(total_context_tokens)
        return self._pass(
            float(batch), self.attn_flops_per_ctx * ctx, self.kv_bytes_per_token_layer * ctx
        )

    def decode_step_times(self, batch: np.ndarray, total_context_tokens: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`decode_step_time` over arrays of equal shape."""
        b = np.asarray(batch, dtype=np.float64)
        ctx = np.asarray(total_context_tokens, dtype=np.float64)
        total = np.zeros(np.broadcast(b, ctx).shape)
        for flops, nbytes, attention, lookup, count in self._groups:
            f = flops * b
            row = self.model.hidden * self.model.dtype_bytes
            by = np.minimum(nbytes, b * row) if lookup else np.full_like(b, nbytes)
            if attention:
                f = f + self.attn_flops_per_ctx * ctx
                by = by + self.kv_bytes_per_token_layer * ctx
            total += count * (
                np.maximum(f / self.flop_rate, by / self.hbm_bandwidth) + self.overhead
            )
        return total + self.launch

    # -- the fused, tensor/pipeline-parallel iteration ---------------------------------------
    def allreduce_time(self, nbytes: float) -> float:
        """One ring all-reduce of ``nbytes`` over the replica's ``tp`` GPUs: ``2 (tp-1)`` steps,
        each moving ``nbytes / tp`` over the TP link (NVLink inside a server, else the NIC) and
        paying its latency; 0 at ``tp = 1``."""
        return self._roof.allreduce_time(nbytes)

    def iteration_work(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> tuple[float, float, float, float]:
        """``(compute_s, collective_s, flops, bytes)`` of one fused iteration, per replica.

        The iteration runs ``prefill_tokens`` prompt tokens (chunks whose squared lengths plus
        twice length x prior context sum to ``prefill_sq``) and one token of each of
        ``n_decode`` sequences holding ``decode_ctx`` context tokens in all, in ONE pass over
        the weights. The LM head computes logits only for sampled tokens: ``n_prompts`` prompts
        whose prefill ends in this iteration, and every decode. Each layer is split over ``tp``
        GPUs (weights, FLOPs and KV heads) and the layers over ``pp`` stages, which run one
        after another for the one batch in flight. ``compute_s`` = sum over layers of
        ``max(flops / rate, bytes / hbm_bandwidth) + per_layer_overhead`` per GPU plus one
        kernel launch; ``collective_s`` = ``2`` all-reduces per transformer layer and one for
        the embedding, of ``tokens x hidden x act_bytes`` each, plus ``pp - 1`` activation
        hand-offs. ``flops``/``bytes`` are the whole replica's (for MFU and MBU). A profile with
        op tables (``profile.ops``) prices the pass op by op instead
        (:meth:`sim.serving.opcost.OpCostModel.iteration_time`: measured kernels, all-reduces
        included), keeping the roofline's FLOPs and bytes and the PP hand-offs."""
        compute, coll, flops, nbytes = self._roof.work(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )
        if self.ops is not None and (prefill_tokens + n_decode) > 0:
            # measured op tables: their sum, all-reduces included; the PP hand-offs stay
            compute = self.ops.iteration_time(
                prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
            )
            coll = self._roof.handoff_time(float(prefill_tokens + n_decode))
        return compute, coll, flops, nbytes

    def iteration_time(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> float:
        """Seconds of one fused iteration (see :meth:`iteration_work`)."""
        c, k, _, _ = self.iteration_work(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )
        return c + k

    def cnn_batch_time(self, batch: int) -> float:
        """Seconds for a forward pass of ``batch`` samples through a CNN."""
        if self.model.kind != "cnn":
            raise ValueError(f"{self.model.name} is a {self.model.kind}, not a cnn")
        if batch < 0:
            raise ValueError(f"batch must be >= 0, got {batch}")
        return self._pass(float(batch), 0.0, 0.0)

    # -- copies ---------------------------------------------------------------------------------
    def transfer_time(self, nbytes: int, link_name: str) -> float:
        """``latency + nbytes / bandwidth`` over a profile link, without contention."""
        try:
            latency, bandwidth = self._links[link_name]
        except KeyError:
            allowed = ", ".join(self._links)
            raise ValueError(f"unknown link {link_name!r}; allowed: {allowed}") from None
        return latency + nbytes / bandwidth

    def link(self, link_name: str) -> tuple[float, float]:
        """``(latency_s, bandwidth_Bps)`` of a link (see :meth:`transfer_time` for names)."""
        self.transfer_time(0, link_name)
        return self._links[link_name]

    def weights_fit(self, fraction: float = 1.0) -> bool:
        """Whether ``fraction`` of the model's weights fit in one GPU's HBM."""
        return self.model.param_bytes * fraction <= self.profile.gpu.hbm_bytes

    def summary(self) -> dict[str, Any]:
        """A few headline numbers (for logs and sanity checks)."""
        return {
            "profile": self.profile.name,
            "model": self.model.name,
            "flop_rate": self.flop_rate,
            "hbm_bandwidth": self.hbm_bandwidth,
            "weights_read_s": self.model.param_bytes / self.hbm_bandwidth,
        }
