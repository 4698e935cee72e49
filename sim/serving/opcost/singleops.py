"""Single ops of a decoder replica on one profile: one GEMM, elementwise kernel, all-reduce or
attention call per GPU, priced from the profile's measured tables
(:mod:`sim.serving.opcost.tables`) where one covers it, else by the roofline (see
:mod:`sim.serving.opcost.iteration` for the formulas and the source labels). The iteration
model (:class:`sim.serving.opcost.iteration.OpCostModel`) composes these into iterations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import InputError
from sim.serving.models import ModelSpec
from sim.serving.opcost.shapes import DecoderShape
from sim.serving.opcost.tables import AttentionTable, ElementwiseTable, GemmTable, OpsProfile

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.opcost.moemla import MlaOps


class SingleOps:
    """Prices of single ops for ``model`` at tensor parallelism ``tp`` on ``profile``: the
    per-GPU head counts, the dtypes and the tables that apply, chosen once; every method
    is a pure function of its arguments. :class:`InputError` when ``tp`` does not divide
    the heads."""

    def __init__(self, profile: Profile, model: ModelSpec, tp: int) -> None:
        shape = DecoderShape.from_model(model)
        if tp < 1 or shape.heads % tp:
            raise InputError(f"tp={tp} must be >= 1 and divide the {shape.heads} heads")
        self.profile = profile
        self.model = model
        self.shape = shape
        self.tp = tp
        self.ops: OpsProfile = profile.ops or OpsProfile()
        gpu = profile.gpu
        db = shape.dtype_bytes
        self.peak = gpu.flops_fp16 * (2.0 if db == 1 else 1.0) if db <= 2 else gpu.flops_fp32
        self.hbm_bw = gpu.hbm_bandwidth
        n_attn = max(1, shape.n_layers)
        kv_elem = (
            float(model.kv_dtype_bytes)
            if shape.mla
            else model.kv_bytes_per_token / (2 * n_attn * shape.kv_heads * shape.head_dim)
        )
        self.kv_dtype = "fp8" if kv_elem <= 1 else ("bf16" if kv_elem <= 2 else "fp32")
        self.kv_elem_bytes = max(1.0, kv_elem)
        self.q_heads = shape.heads // tp
        self.kv_heads = max(1, shape.kv_heads // tp)
        self.act_bytes = 2 if db <= 2 else db  # activations are 16-bit unless fp32
        self._ew: dict[str, ElementwiseTable] = {t.op: t for t in self.ops.elementwise}
        self._gemm_dtype = {1: "fp8", 2: "bf16", 4: "fp32"}.get(db)
        # per dtype: the table timed with weights resident in the smallest cache that holds
        # this model's weights per GPU, else the one timed with cold weights
        weights = model.param_bytes / tp
        self._gemm_tables: dict[str, GemmTable] = {}
        for t in sorted(self.ops.gemm, key=lambda t: (t.resident_bytes == 0, t.resident_bytes)):
            if (t.resident_bytes == 0 or weights <= t.resident_bytes) and (
                t.dtype not in self._gemm_tables
            ):
                self._gemm_tables[t.dtype] = t
        self._attn = {phase: self._attention_table(phase) for phase in ("prefill", "decode")}
        self._ar = {t.group: t for t in self.ops.all_reduce if t.op == "all_reduce"}
        #: MLA attention ops (None: GQA; set by the iteration model for an MLA model)
        self.mla: MlaOps | None = None

    def roofline_time(self, flops: float, nbytes: float, eff: float) -> float:
        """``max(flops / (peak x eff), bytes / (hbm_bw x memory_efficiency)) + op_floor_s``."""
        rl = self.ops.roofline
        return (
            max(flops / (self.peak * eff), nbytes / (self.hbm_bw * rl.memory_efficiency))
            + rl.op_floor_s
        )

    def gemm_time(self, m: int, n: int, k: int, dtype: str | None = None) -> tuple[float, str]:
        """Seconds for one ``m x k @ k x n`` GEMM with weights of ``dtype`` (default: the
        model's) and its source (``table``, ``table-extrapolated`` or ``roofline``)."""
        if m <= 0:
            return 0.0, "not run"
        dtype = dtype or self._gemm_dtype
        table = self._gemm_tables.get(dtype or "")
        if table is not None:
            secs, extra = table.grid.lookup(m, n, k)
            return secs, "table-extrapolated" if extra else "table"
        wbytes = {"fp8": 1, "bf16": 2, "fp32": 4}.get(dtype or "", self.shape.dtype_bytes)
        act = 2  # activations stay 16-bit
        nbytes = n * k * wbytes + (m * k + m * n) * act
        return self.roofline_time(2.0 * m * n * k, nbytes, self.ops.roofline.gemm_efficiency), (
            "roofline"
        )

    def elementwise_time(self, tokens: int, dim_in: int, dim_out: int) -> float:
        """Seconds for an elementwise kernel reading ``dim_in`` and writing ``dim_out``
        activation elements per token (always a roofline: memory-bound)."""
        if tokens <= 0:
            return 0.0
        nbytes = tokens * (dim_in + dim_out) * self.act_bytes
        return self.roofline_time(0.0, nbytes, 1.0)

    def table_elementwise(
        self, op: str, tokens: int, width: int, fallback: float
    ) -> tuple[float, str]:
        """Seconds of elementwise ``op`` (an :class:`ElementwiseTable` op) over ``tokens`` rows
        of ``width`` from the profile's table for it, else ``fallback`` (a roofline)."""
        if tokens <= 0:
            return 0.0, "not run"
        table = self._ew.get(op)
        if table is None:
            return fallback, "roofline"
        secs, extra = table.lookup(float(tokens * width))
        return secs, "table-extrapolated" if extra else "table"

    def allreduce_time(self, nbytes: float, group: int) -> tuple[float, str]:
        """Seconds to all-reduce ``nbytes`` bytes across ``group`` GPUs, and its source."""
        if group <= 1 or nbytes <= 0:
            return 0.0, "not run"
        table = self._ar.get(group)
        if table is not None:
            secs, extra = table.lookup(nbytes)
            return secs, "table-extrapolated" if extra else "table"
        link = self.profile.links.nvlink
        eff = self.ops.roofline.link_efficiency
        steps = 2 * (group - 1)
        return steps / group * nbytes / (link.bandwidth * eff) + steps * link.latency, "roofline"

    def _attention_table(self, phase: str) -> tuple[AttentionTable, float] | None:
        """The table for this layout (scale 1), else one of the same head size, KV dtype and
        GQA group with the nearest head count (scale = heads ratio), else None."""
        group = self.q_heads // self.kv_heads
        best: tuple[AttentionTable, float] | None = None
        for t in self.ops.attention:
            if (t.phase, t.head_dim, t.kv_dtype) != (phase, self.shape.head_dim, self.kv_dtype):
                continue
            if (t.heads, t.kv_heads) == (self.q_heads, self.kv_heads):
                return t, 1.0
            if t.kv_heads * group == t.heads:
                scale = self.q_heads / t.heads
                if best is None or abs(scale - 1) < abs(best[1] - 1):
                    best = (t, scale)
        return best

    def prefill_attention_time(self, tokens: int, sq: float, n_prompts: int) -> tuple[float, str]:
        """Seconds of causal attention for prompt chunks of ``tokens`` tokens in all whose
        squared lengths sum to ``sq``, on one layer. Looked up as ``T**2 / sq`` prompts of
        ``sq / T`` tokens (exact for equal prompts). MLA: :meth:`MlaOps.prefill_time`."""
        if tokens <= 0:
            return 0.0, "not run"
        if self.mla is not None:
            return self.mla.prefill_time(tokens, sq)
        sq = max(float(sq), float(tokens))
        found = self._attn["prefill"]
        if found is not None:
            table, scale = found
            secs, extra = table.curves.lookup(tokens * tokens / sq, sq / tokens, x_power=2.0)
            src = "table-scaled" if scale != 1.0 else "table"
            return secs * scale, "table-extrapolated" if extra else src
        hd, qh, kvh = self.shape.head_dim, self.q_heads, self.kv_heads
        flops = 4.0 * qh * hd * sq / 2  # QK^T and PV over the causal half
        nbytes = tokens * (2 * qh + 2 * kvh) * hd * 2 + tokens * 2 * kvh * hd * self.kv_elem_bytes
        return self.roofline_time(flops, nbytes, self.ops.roofline.attention_efficiency), "roofline"

    def decode_attention_time(self, batch: int, context: float) -> tuple[float, str]:
        """Seconds of paged decode attention for ``batch`` sequences holding ``context``
        tokens of KV in all, on one layer (looked up at the mean context per sequence).
        MLA: :meth:`MlaOps.decode_time`."""
        if batch <= 0:
            return 0.0, "not run"
        if self.mla is not None:
            return self.mla.decode_time(batch, context)
        found = self._attn["decode"]
        if found is not None:
            table, scale = found
            secs, extra = table.curves.lookup(batch, max(1.0, context / batch), x_power=1.0)
            src = "table-scaled" if scale != 1.0 else "table"
            return secs * scale, "table-extrapolated" if extra else src
        hd, qh, kvh = self.shape.head_dim, self.q_heads, self.kv_heads
        flops = 4.0 * qh * hd * context
        nbytes = context * 2 * kvh * hd * self.kv_elem_bytes + batch * 2 * qh * hd * 2
        return self.roofline_time(flops, nbytes, self.ops.roofline.attention_efficiency), "roofline"
