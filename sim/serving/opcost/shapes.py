"""The matrix shapes of a LLaMA-style decoder, read from a :class:`sim.serving.models.ModelSpec`.

A catalogue decoder (``sim.serving.models``) lists an ``embedding`` layer (no FLOPs), identical
attention blocks and an ``lm_head``. A model expanded from a shape carries it
(``ModelSpec.shape``): the dimensions are read from it, and its block bytes are checked
against :func:`sim.serving.decoderblock.block_count` (the one count of a block's weights, q/k norms
and biases included). A model given as explicit layers has no shape: its block's weight bytes
fix the MLP width,

    block params = block_count(the same dimensions with ffn 0).params   (attention, norms)
                 + 3 * hidden * ffn                                      (gate, up, down)

and the embedding's bytes fix the vocabulary (``vocab * hidden``). Mixture-of-experts and MLA
decoders are refused: the op cost model does not price them yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InputError
from sim.serving.decoderblock import LlamaShape, block_count
from sim.serving.models import ModelSpec


@dataclass(frozen=True)
class DecoderShape:
    """Dimensions of a dense decoder (whole model, before tensor parallelism)."""

    n_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    dtype_bytes: int

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
        if not blocks or len({ly.param_bytes for ly in blocks}) != 1:
            raise bad("attention blocks missing or not identical")
        if model.n_experts or model.mla:
            raise bad("mixture-of-experts and MLA pricing is not available yet (docs/models.md)")
        h, hd, db = model.hidden, model.head_dim, model.dtype_bytes
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
