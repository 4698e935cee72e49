"""The ops of mixture-of-experts blocks and of multi-head latent attention, per GPU, for
:class:`sim.serving.opcost.OpCostModel`.

**Expert block** (:class:`MoeOps`, per block with routed experts, at ``T`` tokens of the
replica's batch and its :class:`sim.serving.moeparallel.ExpertParallel`):

================== ==============================================================================
op                 price
================== ==============================================================================
router_gemm        GEMM ``m = T``, ``n = n_experts``, ``k = hidden``, bf16 (replicated)
shared_gate_up_gemm GEMM ``n = 2 shared_ffn / tp`` (shared experts only)
shared_activation  SiLU-and-mul over ``shared_ffn / tp``
shared_down_gemm   GEMM ``n = hidden``, ``k = shared_ffn / tp``
moe_experts        the profile's :class:`MoeTable` of this expert shape, dtype, ``moe_tp`` x
                   ``moe_ep`` and the nearest routing skew, at ``T * dp`` tokens (the expert
                   group's); else the roofline of the busiest rank: its routed tokens
                   (``T dp top_k / moe_ep`` x :func:`skew_imbalance`) through the gate/up and
                   down matrices of ``moe_ffn / moe_tp``, reading the weights of the experts
                   ``T dp`` tokens touch (:func:`expected_experts`, its ``1 / moe_ep`` share)
moe_dispatch       all-to-all of :func:`alltoall_bytes` over the group (``dp > 1`` only): the
                   profile's ``all_to_all`` table of the group size, else
                   :func:`alltoall_seconds` at ``link_bw x link_efficiency``
moe_combine        as moe_dispatch (the same bytes back)
================== ==============================================================================

**MLA** (:class:`MlaOps`, every block): with the profile's :class:`MlaTable` of this model's
dimensions, heads per GPU and projection dtype, the whole module (projections, attention over
the cached latent, output projection) is one op per phase (``attention_prefill`` /
``attention_decode``; ``qkv_gemm`` and ``o_gemm`` read ``in mla module``). Otherwise:
``qkv_gemm`` is the replicated down-projection (``q_lora_rank + kv_lora_rank + rope`` outputs),
the query up-projection and the latent's key/value up-projection (absorbed into the query and
output at decode: the same weights and FLOPs); prefill attention runs ``(nope + rope)``-wide
scores and ``v_head_dim``-wide values over the causal half; decode attention reads each
sequence's latent (``kv_lora_rank + rope`` per token, every GPU a full copy) once for all of
its heads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.serving.decoderblock import expected_experts
from sim.serving.moeparallel import ExpertParallel, alltoall_bytes, alltoall_seconds, skew_imbalance
from sim.serving.opcost.tables import CollectiveTable, MlaTable, MoeTable

if TYPE_CHECKING:
    from sim.serving.opcost.iteration import OpCostModel

#: the ops of an expert block, in execution order
MOE_OP_NAMES: tuple[str, ...] = (
    "router_gemm",
    "shared_gate_up_gemm",
    "shared_activation",
    "shared_down_gemm",
    "moe_dispatch",
    "moe_experts",
    "moe_combine",
)
IN_MODULE = "in mla module"


class MoeOps:
    """Seconds of one expert block's ops on one GPU (see the module docstring)."""

    def __init__(
        self,
        cm: OpCostModel,
        layout: ExpertParallel,
        routing_skew: float,
        cross_node: bool = False,
    ) -> None:
        s = cm.shape
        self.cm = cm
        self.layout = layout
        self.routing_skew = routing_skew
        if s.n_experts % layout.moe_ep or s.moe_ffn % layout.moe_tp:
            from engine.errors import InputError

            raise InputError(
                f"ep={layout.ep}: the {s.n_experts} experts (inner width {s.moe_ffn}) do not "
                f"split into {layout.moe_ep} x {layout.moe_tp} equal shards"
            )
        self.imbalance = skew_imbalance(s.n_experts, layout.moe_ep, routing_skew)
        dtype = {1: "fp8_block", 2: "bf16"}.get(s.dtype_bytes, "")
        self.table = self._table(cm.ops.moe, dtype)
        link = cm.profile.links.rdma if cross_node else cm.profile.links.nvlink
        self.link = (link.latency, link.bandwidth)
        a2a = [t for t in cm.ops.all_reduce if t.op == "all_to_all" and t.group == layout.group]
        self.a2a: CollectiveTable | None = a2a[0] if a2a and not cross_node else None

    def _table(self, tables: list[MoeTable], dtype: str) -> MoeTable | None:
        """The expert table of this shape, dtype and split with the nearest routing skew."""
        s, lay = self.cm.shape, self.layout
        key = (dtype, s.hidden, s.moe_ffn, s.top_k, s.n_experts, lay.moe_tp, lay.moe_ep)
        found = [
            t
            for t in tables
            if (t.dtype, t.hidden, t.moe_ffn, t.top_k, t.n_experts, t.moe_tp, t.moe_ep) == key
        ]
        if not found:
            return None
        return min(found, key=lambda t: (abs(t.routing_skew - self.routing_skew), t.routing_skew))

    def experts_time(self, tokens: int) -> tuple[float, str]:
        """Seconds of the routed experts of one block on the busiest GPU at ``tokens`` tokens
        of this replica, and the source."""
        if tokens <= 0:
            return 0.0, "not run"
        s, lay, cm = self.cm.shape, self.layout, self.cm
        group_tokens = tokens * lay.dp
        if self.table is not None:
            secs, extra = self.table.lookup(float(group_tokens))
            return secs, "table-extrapolated" if extra else "table"
        ffn = s.moe_ffn // lay.moe_tp
        rank_tokens = group_tokens * s.top_k / lay.moe_ep * self.imbalance
        flops = 2.0 * 3 * s.hidden * ffn * rank_tokens
        touched = expected_experts(s.n_experts, s.top_k, group_tokens) / lay.moe_ep
        weights = touched * 3 * s.hidden * ffn * s.dtype_bytes
        acts = rank_tokens * (2 * s.hidden + 3 * ffn) * cm.act_bytes
        return cm.roofline_time(flops, weights + acts, cm.ops.roofline.gemm_efficiency), "roofline"

    def dispatch_bytes(self, tokens: int) -> int:
        """Bytes one GPU sends in one dispatch (:func:`alltoall_bytes`)."""
        s = self.cm.shape
        return alltoall_bytes(tokens, s.top_k, s.hidden, self.cm.act_bytes, self.layout)

    def alltoall_time(self, nbytes: float) -> tuple[float, str]:
        """Seconds of one all-to-all in which each GPU sends ``nbytes``, and the source."""
        if nbytes <= 0:
            return 0.0, "not run"
        if self.a2a is not None:
            secs, extra = self.a2a.lookup(nbytes)
            return secs, "table-extrapolated" if extra else "table"
        latency, bandwidth = self.link
        eff = self.cm.ops.roofline.link_efficiency
        return alltoall_seconds(nbytes, self.layout.group, latency, bandwidth * eff), "roofline"

    def block(self, tokens: int) -> dict[str, tuple[float, str]]:
        """``{op: (seconds, source)}`` of one expert block at ``tokens`` tokens."""
        s, cm, tp = self.cm.shape, self.cm, self.cm.tp
        out: dict[str, tuple[float, str]] = {}
        out["router_gemm"] = cm.gemm_time(tokens, s.n_experts, s.hidden, "bf16")
        if s.shared_ffn:
            f = -(-s.shared_ffn // tp)
            out["shared_gate_up_gemm"] = cm.gemm_time(tokens, 2 * f, s.hidden)
            act = cm.elementwise_time(tokens, 2 * f, f)
            out["shared_activation"] = cm.table_elementwise("activation", tokens, f, act)
            out["shared_down_gemm"] = cm.gemm_time(tokens, s.hidden, f)
        else:
            for name in ("shared_gate_up_gemm", "shared_activation", "shared_down_gemm"):
                out[name] = (0.0, "not run")
        a2a = self.alltoall_time(self.dispatch_bytes(tokens))
        out["moe_dispatch"] = a2a
        out["moe_experts"] = self.experts_time(tokens)
        out["moe_combine"] = a2a
        return out


class MlaOps:
    """Seconds of one MLA block's attention ops on one GPU (see the module docstring)."""

    def __init__(self, cm: OpCostModel) -> None:
        s = cm.shape
        self.cm = cm
        self.heads = s.heads // cm.tp
        gemm = "fp8_block" if s.dtype_bytes == 1 else "bf16"
        kv = "fp8" if cm.kv_elem_bytes <= 1 else "bf16"
        self.tables: dict[str, MlaTable] = {}
        for t in cm.ops.mla:
            key = (t.heads, t.hidden, t.q_lora_rank, t.kv_lora_rank, t.qk_rope_head_dim)
            want = (self.heads, s.hidden, s.q_lora_rank, s.kv_lora_rank, s.qk_rope_head_dim)
            if key == want and (t.gemm_dtype, t.kv_dtype) == (gemm, kv):
                self.tables[t.phase] = t
        nope, rope, v = s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim
        q_in = s.q_lora_rank or s.hidden
        down = (s.q_lora_rank + s.kv_lora_rank + rope, s.hidden)
        #: (n, k) of the projections: down (replicated), query up, latent key/value up
        self.qkv_parts: tuple[tuple[int, int], ...] = (
            down,
            (self.heads * (nope + rope), q_in),
            (self.heads * (nope + v), s.kv_lora_rank),
        )
        self.o_part = (s.hidden, self.heads * v)

    @property
    def module_tables(self) -> bool:
        """Both phases have a measured module table (then the projections are inside it)."""
        return len(self.tables) == 2

    def prefill_time(self, tokens: int, sq: float) -> tuple[float, str]:
        """Seconds of one layer's prefill attention for chunks of ``tokens`` tokens whose
        squared lengths sum to ``sq``."""
        if tokens <= 0:
            return 0.0, "not run"
        sq = max(float(sq), float(tokens))
        table = self.tables.get("prefill")
        if table is not None:
            secs, extra = table.curves.lookup(tokens * tokens / sq, sq / tokens, x_power=2.0)
            return secs, "table-extrapolated" if extra else "table"
        s, cm = self.cm.shape, self.cm
        qk, v = s.qk_nope_head_dim + s.qk_rope_head_dim, s.v_head_dim
        flops = 2.0 * self.heads * (qk + v) * sq / 2
        nbytes = tokens * self.heads * (2 * qk + 2 * v) * cm.act_bytes
        eff = cm.ops.roofline.attention_efficiency
        return cm.roofline_time(flops, nbytes, eff), "roofline"

    def decode_time(self, batch: int, context: float) -> tuple[float, str]:
        """Seconds of one layer's decode attention for ``batch`` sequences holding
        ``context`` tokens of latent in all."""
        if batch <= 0:
            return 0.0, "not run"
        table = self.tables.get("decode")
        if table is not None:
            secs, extra = table.curves.lookup(batch, max(1.0, context / batch), x_power=1.0)
            return secs, "table-extrapolated" if extra else "table"
        s, cm = self.cm.shape, self.cm
        lat = s.kv_lora_rank + s.qk_rope_head_dim
        flops = 2.0 * self.heads * context * (lat + s.kv_lora_rank)
        nbytes = context * lat * cm.kv_elem_bytes + batch * self.heads * 2 * lat * cm.act_bytes
        eff = cm.ops.roofline.attention_efficiency
        return cm.roofline_time(flops, nbytes, eff), "roofline"
