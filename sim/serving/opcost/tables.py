"""Op tables of a profile: measured kernel times with interpolation (the scalar terms are in
:mod:`sim.serving.opcost.terms`).

The ``ops`` section of a :class:`sim.serving.costmodel.Profile` is an :class:`OpsProfile`. Units:
seconds for every latency, bytes for message sizes, tokens for ``m`` / ``context`` /
``batch`` axes, FLOP/s and bytes/s for rates (those come from the profile's ``gpu`` section).
Every table carries a :class:`TableOrigin` saying where and when it was measured.

Interpolation (:func:`interp_axis`, :class:`Grid3`, :class:`Curves`) is piecewise linear
between knots, so it is exact at every knot and monotone between two neighbouring knots.
Outside the knots: below the first knot the first value is used (small shapes are dominated
by a kernel's fixed floor); above the last knot the last value is scaled by
``(x / x_last) ** power``, where ``power`` is the axis's growth order (1 for GEMM dimensions,
batch, decode context and message bytes; 2 for a prefill's prompt length, whose attention
work is quadratic). A lookup reports whether it extrapolated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from sim.serving.opcost.terms import (
    EngineTerms,
    FrameworkTerms,
    RooflineTerms,
    Strict,
    ascending,
)


def interp_axis(knots: Sequence[float], x: float) -> tuple[int, int, float, float]:
    """Bracket ``x`` in ascending ``knots``: ``(i0, i1, w1, scale)`` such that the value at
    ``x`` is ``((1 - w1) * v[i0] + w1 * v[i1]) * scale`` before any growth exponent.

    ``scale`` is ``x / knots[-1]`` above the last knot (1 otherwise); below the first knot
    the first knot is used (``w1`` = 0)."""
    n = len(knots)
    if x <= knots[0]:
        return 0, 0, 0.0, 1.0
    if x >= knots[-1]:
        return n - 1, n - 1, 0.0, x / knots[-1]
    i1 = bisect.bisect_right(knots, x)
    i0 = i1 - 1
    w1 = (x - knots[i0]) / (knots[i1] - knots[i0])
    return i0, i1, w1, 1.0


class TableOrigin(Strict):
    """Where and when a table was measured."""

    device: str = Field(min_length=1)
    """The accelerator measured, e.g. `NVIDIA H200`."""
    framework: str = Field(min_length=1)
    """Software whose kernels were timed, e.g. `vllm 0.24.0`."""
    measured_at: str = Field(min_length=1)
    """When it was measured (ISO 8601 date), or the release that shipped the data."""
    source: str = Field(min_length=1)
    """Where the numbers come from (a file of a package, a `pdsim calibrate` run)."""


class Grid3(Strict):
    """A dense table ``latency_s[i][j][l]`` over ascending knots ``m[i]``, ``n[j]``, ``k[l]``."""

    m: list[int] = Field(min_length=1)
    """Rows of the left operand (tokens), ascending."""
    n: list[int] = Field(min_length=1)
    """Output features, ascending."""
    k: list[int] = Field(min_length=1)
    """Reduction (input) features, ascending."""
    latency_s: list[list[list[float]]]
    """Measured seconds, indexed [m][n][k] (all > 0)."""

    @model_validator(mode="after")
    def _check(self) -> Grid3:
        for name in ("m", "n", "k"):
            axis = getattr(self, name)
            if not ascending(axis):
                raise ValueError(f"{name} must be positive and strictly ascending")
        shape = (len(self.m), len(self.n), len(self.k))
        ok = len(self.latency_s) == shape[0] and all(
            len(row) == shape[1] and all(len(col) == shape[2] for col in row)
            for row in self.latency_s
        )
        if not ok:
            raise ValueError(f"latency_s must have shape {shape} (m x n x k)")
        if any(v <= 0 for row in self.latency_s for col in row for v in col):
            raise ValueError("latency_s values must be > 0")
        return self

    def lookup(self, m: float, n: float, k: float) -> tuple[float, bool]:
        """Trilinear interpolation at ``(m, n, k)``; linear growth beyond the last knots.
        Returns ``(seconds, extrapolated)``."""
        am, an, ak = interp_axis(self.m, m), interp_axis(self.n, n), interp_axis(self.k, k)
        total = 0.0
        for i, wi in ((am[0], 1 - am[2]), (am[1], am[2])):
            for j, wj in ((an[0], 1 - an[2]), (an[1], an[2])):
                for li, wl in ((ak[0], 1 - ak[2]), (ak[1], ak[2])):
                    w = wi * wj * wl
                    if w:
                        total += w * self.latency_s[i][j][li]
        scale = am[3] * an[3] * ak[3]
        return total * scale, scale != 1.0


class Curves(Strict):
    """A ragged 2-D table: for each ``batch`` knot, a curve of seconds over ``x`` knots
    (each batch may have been measured at different ``x``)."""

    batch: list[int] = Field(min_length=1)
    """Batch sizes (sequences), ascending."""
    x: list[list[int]]
    """Per batch knot: ascending x knots (tokens: prompt length or context length)."""
    latency_s: list[list[float]]
    """Per batch knot: measured seconds at each x knot (all > 0)."""

    @model_validator(mode="after")
    def _check(self) -> Curves:
        b = self.batch
        if not ascending(b):
            raise ValueError("batch must be positive and strictly ascending")
        if len(self.x) != len(b) or len(self.latency_s) != len(b):
            raise ValueError("x and latency_s need one list per batch knot")
        for xs, ys in zip(self.x, self.latency_s, strict=True):
            if not xs or len(xs) != len(ys):
                raise ValueError("each x list needs as many latency_s values, at least one")
            if not ascending(xs):
                raise ValueError("x knots must be positive and strictly ascending")
            if any(v <= 0 for v in ys):
                raise ValueError("latency_s values must be > 0")
        return self

    def lookup(self, batch: float, x: float, x_power: float) -> tuple[float, bool]:
        """Linear in x within each batch's curve (``x_power`` growth beyond its last knot),
        then linear across batch knots (linear growth beyond the last). Returns
        ``(seconds, extrapolated)``."""
        i0, i1, w1, bscale = interp_axis(self.batch, batch)
        extrapolated = bscale != 1.0
        vals = [0.0, 0.0]
        for slot, (i, w) in enumerate(((i0, 1 - w1), (i1, w1))):
            if not w:
                continue  # a knot with no weight neither contributes nor extrapolates
            xs, ys = self.x[i], self.latency_s[i]
            j0, j1, v1, xscale = interp_axis(xs, x)
            extrapolated |= xscale != 1.0
            vals[slot] = ((1 - v1) * ys[j0] + v1 * ys[j1]) * xscale**x_power
        return ((1 - w1) * vals[0] + w1 * vals[1]) * bscale, extrapolated


class GemmTable(Strict):
    """Measured GEMM times ``C[m, n] = A[m, k] @ W[k, n]`` for one weight dtype."""

    origin: TableOrigin
    """Where and when it was measured."""
    dtype: Literal["bf16", "fp8", "fp32"]
    """Weight/compute dtype: `bf16` (2-byte weights), `fp8` (1-byte weights) or `fp32`
    (4-byte weights; `pdsim calibrate` on the NumPy engine)."""
    kernel: str = ""
    """The kernel timed, e.g. `torch.nn.functional.linear`."""
    resident_bytes: int = Field(default=0, ge=0)
    """0: timed with the weights read from device memory (cold), which prices every model;
    > 0: timed with the weights resident in a cache of this many bytes (a CPU's last-level
    cache), which prices models whose weights per GPU fit in it."""
    grid: Grid3
    """Seconds over m (tokens) x n (output features) x k (input features)."""


class AttentionTable(Strict):
    """Measured attention times for one head layout on one GPU (heads already divided by TP).

    ``phase: prefill``: causal attention of ``batch`` prompts of ``x`` tokens each (no earlier
    context). ``phase: decode``: one query token for each of ``batch`` sequences, each
    attending to ``x`` tokens of paged KV."""

    origin: TableOrigin
    """Where and when it was measured."""
    phase: Literal["prefill", "decode"]
    """`prefill` (x = prompt length) or `decode` (x = context length per sequence)."""
    heads: int = Field(ge=1)
    """Query heads on one GPU."""
    kv_heads: int = Field(ge=1)
    """Key/value heads on one GPU."""
    head_dim: int = Field(ge=1)
    """Dimension of one head."""
    kv_dtype: Literal["bf16", "fp8", "fp32"] = "bf16"
    """KV-cache dtype."""
    kernel: str = ""
    """The kernel timed, e.g. `vllm_flash_attn_fa3`."""
    curves: Curves
    """Seconds over batch x prompt/context length."""


class CollectiveTable(Strict):
    """Measured collective times by message size for one collective and group size."""

    origin: TableOrigin
    """Where and when it was measured."""
    op: Literal["all_reduce", "all_to_all"] = "all_reduce"
    """The collective: `all_reduce` (bytes: the message each GPU contributes) or
    `all_to_all` (bytes: what each GPU sends in one expert dispatch or combine)."""
    group: int = Field(ge=2)
    """GPUs in the group (the TP size)."""
    kernel: str = ""
    """The implementation timed, e.g. `vLLM_custom_graph`."""
    bytes: list[int] = Field(min_length=1)
    """Message sizes in bytes (per GPU, before reduction), ascending."""
    latency_s: list[float]
    """Measured seconds at each message size (all > 0)."""

    @model_validator(mode="after")
    def _check(self) -> CollectiveTable:
        b = self.bytes
        if not ascending(b):
            raise ValueError("bytes must be positive and strictly ascending")
        if len(self.latency_s) != len(b) or any(v <= 0 for v in self.latency_s):
            raise ValueError("latency_s needs one value > 0 per message size")
        return self

    def lookup(self, nbytes: float) -> tuple[float, bool]:
        """Seconds for ``nbytes`` (linear between knots, linear growth beyond the last)."""
        i0, i1, w1, scale = interp_axis(self.bytes, nbytes)
        value = ((1 - w1) * self.latency_s[i0] + w1 * self.latency_s[i1]) * scale
        return value, scale != 1.0


class MoeTable(Strict):
    """Measured seconds of one mixture-of-experts layer's routed experts (the grouped GEMMs:
    gate/up, activation, down, with the token permutation around them) on one GPU of an
    expert group, by the tokens routed in the whole group, for one expert shape, one split
    (`moe_tp` x `moe_ep`) and one routing distribution."""

    origin: TableOrigin
    """Where and when it was measured."""
    dtype: Literal["bf16", "fp8", "fp8_block"]
    """Expert weight dtype: `bf16`, `fp8` (per tensor) or `fp8_block` (block scales)."""
    kernel: str = ""
    """The kernel timed, e.g. `vllm_unquantizedfusedmoe_triton_tritonexperts`."""
    hidden: int = Field(ge=1)
    """Hidden dimension (each expert's input and output width)."""
    moe_ffn: int = Field(ge=1)
    """Inner dimension of one expert (before `moe_tp` splits it)."""
    top_k: int = Field(ge=1)
    """Experts each token is routed to."""
    n_experts: int = Field(ge=1)
    """Routed experts of the layer (before `moe_ep` shards them)."""
    moe_tp: int = Field(default=1, ge=1)
    """Ways each expert's inner dimension is split."""
    moe_ep: int = Field(default=1, ge=1)
    """Ways the experts are sharded (expert parallelism)."""
    routing_skew: float = Field(default=0.0, ge=0)
    """Power-law exponent of the expert popularity the tokens were routed with (0: balanced,
    every expert equally likely)."""
    tokens: list[int] = Field(min_length=1)
    """Tokens entering the layer across the expert group, ascending."""
    latency_s: list[float]
    """Measured seconds at each token count (all > 0)."""

    @model_validator(mode="after")
    def _check(self) -> MoeTable:
        if not ascending(self.tokens):
            raise ValueError("tokens must be positive and strictly ascending")
        if len(self.latency_s) != len(self.tokens) or any(v <= 0 for v in self.latency_s):
            raise ValueError("latency_s needs one value > 0 per token count")
        return self

    def lookup(self, tokens: float) -> tuple[float, bool]:
        """Seconds at ``tokens`` (linear between knots, linear growth beyond the last) and
        whether it extrapolated."""
        i0, i1, w1, scale = interp_axis(self.tokens, tokens)
        value = ((1 - w1) * self.latency_s[i0] + w1 * self.latency_s[i1]) * scale
        return value, scale != 1.0


class MlaTable(Strict):
    """Measured seconds of one multi-head latent attention module (DeepSeek-V2/V3: the query
    and latent projections, attention over the cached latent and the output projection) on
    one GPU, for one model shape and the heads of one GPU.

    ``phase: prefill``: ``batch`` prompts of ``x`` tokens each; ``phase: decode``: one token
    for each of ``batch`` sequences holding ``x`` tokens of cached latent."""

    origin: TableOrigin
    """Where and when it was measured."""
    phase: Literal["prefill", "decode"]
    """`prefill` (x = prompt length) or `decode` (x = context length per sequence)."""
    heads: int = Field(ge=1)
    """Query heads on one GPU."""
    hidden: int = Field(ge=1)
    """Hidden dimension of the model measured."""
    q_lora_rank: int = Field(ge=0)
    """Query latent rank of the model measured (0: a full query projection)."""
    kv_lora_rank: int = Field(ge=1)
    """Cached latent rank of the model measured."""
    qk_rope_head_dim: int = Field(ge=0)
    """Rotary key dimension of the model measured."""
    gemm_dtype: Literal["bf16", "fp8_block"] = "bf16"
    """Dtype of the module's projection weights."""
    kv_dtype: Literal["bf16", "fp8"] = "bf16"
    """Dtype of the cached latent."""
    kernel: str = ""
    """The attention kernel timed, e.g. `FLASH_ATTN_MLA`."""
    curves: Curves
    """Seconds over batch x prompt/context length."""


class ElementwiseTable(Strict):
    """Measured seconds of one of the serving engine's elementwise ops by the activation
    elements it reads per call (tokens x width), for ops a profile times rather than prices
    from a roofline: `norm` (residual add then RMSNorm, width = hidden), `activation`
    (SiLU of the gate times up, width = MLP width), `embedding` (row gather, width =
    hidden). Linear between knots; below the first knot the first value, beyond the last
    linear growth (elementwise work is proportional to the elements)."""

    origin: TableOrigin
    """Where and when it was measured."""
    op: Literal["norm", "activation", "embedding"]
    """The op: `norm`, `activation` or `embedding`."""
    kernel: str = ""
    """What was timed, e.g. `engine.runtime.model._rmsnorm after x + y`."""
    elements: list[int] = Field(min_length=1)
    """Activation elements per call (tokens x width), ascending."""
    latency_s: list[float]
    """Measured seconds at each element count (all > 0)."""

    @model_validator(mode="after")
    def _check(self) -> ElementwiseTable:
        if not ascending(self.elements):
            raise ValueError("elements must be positive and strictly ascending")
        if len(self.latency_s) != len(self.elements) or any(v <= 0 for v in self.latency_s):
            raise ValueError("latency_s needs one value > 0 per element count")
        return self

    def lookup(self, elements: float) -> tuple[float, bool]:
        """Seconds for ``elements`` and whether it extrapolated beyond the last knot."""
        i0, i1, w1, scale = interp_axis(self.elements, elements)
        value = ((1 - w1) * self.latency_s[i0] + w1 * self.latency_s[i1]) * scale
        return value, scale != 1.0


class OpsProfile(Strict):
    """The `ops` section of a profile: measured op tables plus roofline terms."""

    roofline: RooflineTerms = Field(default_factory=RooflineTerms)
    """Efficiencies and floors for ops no table covers."""
    gemm: list[GemmTable] = Field(default_factory=list)
    """GEMM tables, at most one per (dtype, resident_bytes)."""
    attention: list[AttentionTable] = Field(default_factory=list)
    """Attention tables, at most one per (phase, heads, kv_heads, head_dim, kv_dtype)."""
    all_reduce: list[CollectiveTable] = Field(default_factory=list)
    """Collective tables (`all_reduce`, and `all_to_all` for expert dispatch and combine),
    at most one per (op, group size)."""
    moe: list[MoeTable] = Field(default_factory=list)
    """Mixture-of-experts expert tables, at most one per (dtype, shape, split, skew)."""
    mla: list[MlaTable] = Field(default_factory=list)
    """Multi-head latent attention module tables, at most one per (phase, heads, shape,
    dtypes)."""
    elementwise: list[ElementwiseTable] = Field(default_factory=list)
    """Elementwise op tables (norm, activation, embedding), at most one per op; ops without
    one are priced by the roofline."""
    engine: EngineTerms | None = None
    """Engine-specific terms fitted by `pdsim calibrate` (null: a fused vLLM-style engine)."""
    framework: FrameworkTerms | None = None
    """The serving framework's overheads per request and per token, with their provenance
    (null: none known; `pdsim cost` then says so on the ops it would price)."""

    @model_validator(mode="after")
    def _unique(self) -> OpsProfile:
        seen: set[tuple[object, ...]] = set()
        keys: list[tuple[object, ...]] = [("gemm", t.dtype, t.resident_bytes) for t in self.gemm]
        keys += [(t.phase, t.heads, t.kv_heads, t.head_dim, t.kv_dtype) for t in self.attention]
        keys += [(t.op, t.group) for t in self.all_reduce]
        keys += [
            ("moe", t.dtype, t.hidden, t.moe_ffn, t.top_k, t.n_experts, t.moe_tp, t.moe_ep,
             t.routing_skew)
            for t in self.moe
        ]  # fmt: skip
        keys += [
            ("mla", t.phase, t.heads, t.hidden, t.q_lora_rank, t.kv_lora_rank,
             t.qk_rope_head_dim, t.gemm_dtype, t.kv_dtype)
            for t in self.mla
        ]  # fmt: skip
        keys += [("elementwise", t.op) for t in self.elementwise]
        for key in keys:
            if key in seen:
                raise ValueError(f"two tables for {key}")
            seen.add(key)
        return self
