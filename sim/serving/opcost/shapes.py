"""The matrix shapes of a LLaMA-style decoder, read from a :class:`sim.serving.models.ModelSpec`.

A catalogue decoder (``sim.serving.models``) lists an ``embedding`` layer (no FLOPs), identical
attention blocks and an ``lm_head``. A model expanded from a shape carries it
(``ModelSpec.shape``): the dimensions are read from it, and its block bytes are checked
against :func:`sim.serving.decoderblock.block_count` (the one count of a block's weights, q/k norms
and biases included). A model given as explicit layers has no shape: its block's weight bytes
fix the MLP width,

    block params = block_count(the same dimensions with ffn 0).params   (attention, norms)
                 + 3 * hidden * ffn                                      (gate, up, down)

and the embedding's bytes fix the vocabulary (``vocab * hidden``). A mixture-of-experts or
MLA decoder needs its shape (its blocks differ: dense first layers, experts); each block's
bytes are checked against :func:`block_count` of its kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import InputError
from sim.serving.decoderblock import LlamaShape, block_count
from sim.serving.models import LayerSpec, ModelSpec


@dataclass(frozen=True)
class DecoderShape:
    """Dimensions of a decoder (whole model, before tensor or expert parallelism). The
    fields after ``dtype_bytes`` are 0 for a dense GQA decoder."""

    n_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    dtype_bytes: int
    n_moe_layers: int = 0
    """Blocks with routed experts (the other ``n_layers - n_moe_layers`` have a dense MLP)."""
    n_experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    """Inner dimension of the shared experts together (0: none)."""
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    """MLA latent rank (0: GQA attention)."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def n_dense_layers(self) -> int:
        """Blocks with a dense MLP."""
        return self.n_layers - self.n_moe_layers

    @property
    def mla(self) -> bool:
        """Attention is multi-head latent attention."""
        return self.kv_lora_rank > 0

    @classmethod
    def from_model(cls, model: ModelSpec) -> DecoderShape:
        """The shape of a catalogue decoder; :class:`InputError` naming the model when it is
        not a LLaMA-style decoder (embedding, identical attention blocks, lm_head)."""

        def bad(why: str) -> InputError:
            return InputError(
                f"model {model.name!r}: {why}; the op cost model needs a "
                "LLaMA-style decoder (embedding, attention blocks, lm_head)"
            )

        if model.kind != "decoder":
            raise bad(f"kind is {model.kind!r}")
        if min(model.hidden, model.heads, model.kv_heads, model.head_dim) <= 0:
            raise bad("hidden, heads, kv_heads and head_dim must all be set")
        blocks = [ly for ly in model.layers if ly.attention]
        h, hd, db = model.hidden, model.head_dim, model.dtype_bytes
        if blocks and (model.n_experts or model.mla):
            return cls._with_experts(model, blocks, bad)
        if not blocks or len({ly.param_bytes for ly in blocks}) != 1:
            raise bad("attention blocks missing or not identical")
        embed = model.layers[0]
        if embed.attention or embed.flops_per_token or embed.param_bytes % (h * db):
            raise bad("first layer is not an embedding table of vocab x hidden")
        s = model.shape
        if s is None:  # explicit layers: the MLP width from the block's bytes
            s = LlamaShape(
                family="llama",
                n_layers=len(blocks),
                hidden=h,
                heads=model.heads,
                kv_heads=model.kv_heads,
                head_dim=hd,
                vocab=embed.param_bytes // (h * db),
            )
            mlp_params = blocks[0].param_bytes // db - block_count(s, moe=False).params
            if mlp_params <= 0 or mlp_params % (3 * h):
                raise bad(f"block weights leave {mlp_params} MLP parameters, not 3 * hidden * ffn")
            s = s.model_copy(update={"ffn": mlp_params // (3 * h)})
        elif blocks[0].param_bytes != block_count(s, moe=False).params * db:
            raise bad("block weights differ from what its shape gives")
        return cls(
            n_layers=len(blocks),
            hidden=h,
            heads=model.heads,
            kv_heads=model.kv_heads,
            head_dim=hd,
            ffn=s.ffn,
            vocab=s.vocab,
            dtype_bytes=db,
        )

    @classmethod
    def _with_experts(
        cls, model: ModelSpec, blocks: list[LayerSpec], bad: Callable[[str], InputError]
    ) -> DecoderShape:
        """The shape of a mixture-of-experts or MLA decoder: from ``model.shape``, each
        block's bytes checked against the count of its kind."""
        s = model.shape
        if s is None:
            raise bad("a mixture-of-experts or MLA model needs its shape, not explicit layers")
        db = model.dtype_bytes
        for i, ly in enumerate(blocks):
            if ly.param_bytes != block_count(s, s.is_moe_block(i)).params * db:
                raise bad(f"block {i}'s weights differ from what its shape gives")
        return cls(
            n_layers=len(blocks),
            hidden=s.hidden,
            heads=s.heads,
            kv_heads=model.kv_heads,
            head_dim=model.head_dim,
            ffn=s.ffn,
            vocab=s.vocab,
            dtype_bytes=db,
            n_moe_layers=sum(1 for i in range(len(blocks)) if s.is_moe_block(i)),
            n_experts=s.n_experts,
            top_k=s.top_k,
            moe_ffn=s.moe_ffn,
            shared_ffn=s.shared_ffn,
            q_lora_rank=s.q_lora_rank,
            kv_lora_rank=s.kv_lora_rank,
            qk_nope_head_dim=s.qk_nope_head_dim,
            qk_rope_head_dim=s.qk_rope_head_dim,
            v_head_dim=s.v_head_dim,
        )
