"""The parameter arithmetic of a decoder's block stack, shared by the catalogue and the cost
models: the block shape schema (:class:`LlamaShape`, the Hugging Face families it covers), the
parameter count of one block (:func:`block_count`, the one place it is computed), the KV
elements a token stores, and how many distinct experts a batch of tokens touches."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.limits import CheckedModel


def expected_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts ``tokens`` tokens route to when each picks ``top_k`` of
    ``n_experts`` uniformly at random: ``E * (1 - (1 - k/E) ** T)`` (an expert escapes one
    token with probability ``1 - k/E``); at least ``k`` and at most ``min(E, T * k)``. 0
    without experts or tokens."""
    if n_experts <= 0 or tokens <= 0 or top_k <= 0:
        return 0.0
    k = min(top_k, n_experts)
    if k == n_experts:
        return float(n_experts)
    expected = -n_experts * math.expm1(tokens * math.log1p(-k / n_experts))
    return float(min(max(expected, k), n_experts, tokens * k))  # the bounds despite rounding


# -- shapes ------------------------------------------------------------------------------------
#: decoder shape families: Hugging Face ``model_type`` values :mod:`sim.serving.hfconfig` reads
#: (``llama`` is also the tag of any hand-written dense decoder)
DECODER_FAMILIES = (
    "llama",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
    "llama4",
)


class LlamaShape(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A decoder block stack: RMSNorms, attention (GQA, or MLA when `kv_lora_rank` is set), a
    SwiGLU MLP (3 matrices) or a mixture of SwiGLU experts; biases only where stated."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    family: Literal[
        "llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4"
    ]
    """Shape family tag: `llama` for any dense decoder, or the Hugging Face `model_type` it was
    imported from (all share this schema; the fields below decide the layers)."""
    n_layers: int = Field(ge=1)
    """Transformer blocks, >= 1."""
    hidden: int = Field(ge=1)
    """Hidden dimension (divisible by `heads` unless `head_dim` is given)."""
    heads: int = Field(ge=1)
    """Attention heads, >= 1."""
    kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads (GQA, divides `heads`); null: = heads. Ignored with MLA."""
    head_dim: int | None = Field(default=None, ge=1)
    """Dimension of one attention head; null: hidden / heads (Qwen3-32B: 128 != 5120 / 64)."""
    qk_norm: bool = False
    """RMSNorm on each head's query and key (Qwen3): 2 * head_dim more weights per block."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2, gpt-oss)."""
    o_bias: bool = False
    """A bias on the output projection (gpt-oss)."""
    attention_sinks: bool = False
    """A learned sink logit per head and block (gpt-oss): `heads` more weights per block."""
    sliding_window: int = Field(default=0, ge=0)
    """Sliding-window length of the windowed layers (gpt-oss: 128 on every other layer);
    recorded only: KV and attention are counted as full attention. 0: none."""
    ffn: int = Field(default=0, ge=0)
    """Inner dimension of a dense layer's SwiGLU MLP; required when any layer is dense."""
    vocab: int = Field(ge=1)
    """Vocabulary size."""
    tie_embeddings: bool = False
    """The LM head shares the embedding matrix."""
    n_experts: int = Field(default=0, ge=0)
    """Routed experts per mixture-of-experts layer; 0: a dense model."""
    top_k: int = Field(default=0, ge=0)
    """Routed experts each token runs, 1..n_experts (required with experts)."""
    moe_ffn: int = Field(default=0, ge=0)
    """Inner dimension of one routed expert's SwiGLU MLP (required with experts)."""
    n_shared_experts: int = Field(default=0, ge=0)
    """Shared experts every token runs besides its routed ones (DeepSeek-V3: 1, Llama 4: 1)."""
    shared_ffn: int = Field(default=0, ge=0)
    """Inner dimension of the shared experts together (one SwiGLU MLP of this width)."""
    router_bias: bool = False
    """The router has a bias per expert (gpt-oss; DeepSeek-V3's score-correction bias)."""
    expert_bias: bool = False
    """Each expert's projections have biases (gpt-oss): 2 * moe_ffn + hidden per expert."""
    first_dense_layers: int = Field(default=0, ge=0)
    """The first this many blocks are dense (DeepSeek-V3: 3); the rest follow `moe_layer_step`."""
    moe_layer_step: int = Field(default=1, ge=1)
    """Every n-th block (blocks n, 2n, ... counting from 1) has experts, the others are dense
    (Llama-4-Maverick: 2); 1: every block past `first_dense_layers`."""
    q_lora_rank: int = Field(default=0, ge=0)
    """MLA: rank of the query down-projection; 0: a full query projection."""
    kv_lora_rank: int = Field(default=0, ge=0)
    """MLA: rank of the compressed key/value latent that is cached; 0: no MLA (GQA)."""
    qk_nope_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head query/key dimension without rotary embedding."""
    qk_rope_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head query/key rotary dimension (one rotary key shared by all heads, cached)."""
    v_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head value dimension."""

    def is_moe_block(self, i: int) -> bool:
        """Block ``i`` (0-based) has routed experts."""
        return (
            self.n_experts > 0
            and i >= self.first_dense_layers
            and (i + 1) % self.moe_layer_step == 0
        )


@dataclass(frozen=True)
class BlockCount:
    """Parameters of one decoder block (see :func:`block_count`)."""

    params: int
    """All its weights: matrices, norms, biases, sinks, every expert."""
    active_matmul: int
    """Matrix weights one token multiplies by (router, top-k and shared experts only)."""
    expert_params: int
    """Weights of ONE routed expert (0 for a dense block)."""


def head_dim_of(s: LlamaShape) -> int:
    if s.head_dim is not None:
        return s.head_dim
    if s.hidden % s.heads:
        raise ValueError(f"hidden {s.hidden} is not divisible by heads {s.heads}; give head_dim")
    return s.hidden // s.heads


def check_shape(s: LlamaShape) -> None:
    """``ValueError`` for an inconsistent shape."""
    kv_heads = s.kv_heads or s.heads
    if s.heads % kv_heads:
        raise ValueError(f"heads {s.heads} is not a multiple of kv_heads {kv_heads}")
    head_dim_of(s)
    if s.n_experts == 0 and (s.top_k or s.moe_ffn or s.n_shared_experts):
        raise ValueError("top_k, moe_ffn and n_shared_experts need n_experts >= 1")
    if s.n_experts and not (1 <= s.top_k <= s.n_experts and s.moe_ffn >= 1):
        raise ValueError(
            f"n_experts {s.n_experts} needs 1 <= top_k <= n_experts (got {s.top_k}) "
            f"and moe_ffn >= 1 (got {s.moe_ffn})"
        )
    if (s.n_shared_experts == 0) != (s.shared_ffn == 0):
        raise ValueError("give both n_shared_experts and shared_ffn, or neither")
    if s.first_dense_layers > s.n_layers:
        raise ValueError(f"first_dense_layers {s.first_dense_layers} > n_layers {s.n_layers}")
    if s.ffn == 0 and any(not s.is_moe_block(i) for i in range(s.n_layers)):
        raise ValueError("ffn must be >= 1: the shape has dense layers")
    mla = (s.q_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim)
    if s.kv_lora_rank == 0 and any(mla):
        raise ValueError("q_lora_rank and the qk_*/v_head_dim fields need kv_lora_rank (MLA)")
    if s.kv_lora_rank and (s.qk_nope_head_dim + s.qk_rope_head_dim < 1 or s.v_head_dim < 1):
        raise ValueError("MLA needs qk_nope_head_dim + qk_rope_head_dim >= 1 and v_head_dim >= 1")


def _attention(s: LlamaShape) -> tuple[int, int]:
    """``(matrix weights, other weights)`` of one block's attention, its input and
    post-attention RMSNorms included in the other weights."""
    h, heads = s.hidden, s.heads
    other = 2 * h  # the block's two RMSNorms
    if s.kv_lora_rank:  # MLA (DeepSeek-V2/V3)
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank:
            q = h * s.q_lora_rank + s.q_lora_rank * heads * qk
            other += s.q_lora_rank  # RMSNorm on the query latent
        else:
            q = h * heads * qk
        kv = h * (s.kv_lora_rank + s.qk_rope_head_dim)
        kv += s.kv_lora_rank * heads * (s.qk_nope_head_dim + s.v_head_dim)
        other += s.kv_lora_rank  # RMSNorm on the KV latent
        return q + kv + heads * s.v_head_dim * h, other
    hd, kv_heads = head_dim_of(s), s.kv_heads or s.heads
    matmul = h * heads * hd * 2 + h * kv_heads * hd * 2  # q, o + k, v
    if s.qk_norm:
        other += 2 * hd
    if s.qkv_bias:
        other += (heads + 2 * kv_heads) * hd
    if s.o_bias:
        other += h
    if s.attention_sinks:
        other += heads
    return matmul, other


def block_count(s: LlamaShape, moe: bool) -> BlockCount:
    """Parameters of one block of ``s``: a mixture-of-experts block when ``moe``, else dense.
    The one place a block's parameter count is computed (the catalogue's expansion and the op
    cost model's shape check both use it)."""
    attn, other = _attention(s)
    h = s.hidden
    if not moe:
        mlp = 3 * h * s.ffn
        return BlockCount(params=attn + mlp + other, active_matmul=attn + mlp, expert_params=0)
    expert = 3 * h * s.moe_ffn + ((2 * s.moe_ffn + h) if s.expert_bias else 0)
    router = h * s.n_experts
    shared = 3 * h * s.shared_ffn
    params = attn + other + router + shared + s.n_experts * expert
    params += s.n_experts if s.router_bias else 0
    active = attn + router + shared + s.top_k * 3 * h * s.moe_ffn
    return BlockCount(params=params, active_matmul=active, expert_params=expert)


def kv_elements_per_token(s: LlamaShape) -> int:
    """Cached elements per token, all blocks: K and V of every KV head, or with MLA the
    compressed latent plus the shared rotary key (``kv_lora_rank + qk_rope_head_dim``)."""
    if s.kv_lora_rank:
        return s.n_layers * (s.kv_lora_rank + s.qk_rope_head_dim)
    return 2 * s.n_layers * (s.kv_heads or s.heads) * head_dim_of(s)
