"""The matrix shapes of a LLaMA-style decoder, recovered from a :class:`sim.serving.models.ModelSpec`.

A catalogue decoder (``sim.serving.models``) lists an ``embedding`` layer (no FLOPs), identical
attention blocks and an ``lm_head``; the block's weight bytes fix the MLP width::

    block params = hidden * (heads + 2 * kv_heads) * head_dim   (q, k, v)
                 + heads * head_dim * hidden                    (o)
                 + 3 * hidden * ffn                             (gate, up, down)
                 + 2 * hidden                                   (two RMSNorm weights)

and the embedding's bytes fix the vocabulary (``vocab * hidden``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InputError
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
        h, hd, db = model.hidden, model.head_dim, model.dtype_bytes
        attn = h * (model.heads + 2 * model.kv_heads) * hd + model.heads * hd * h
        mlp_params = blocks[0].param_bytes // db - attn - 2 * h
        if mlp_params <= 0 or mlp_params % (3 * h):
            raise bad(f"block weights leave {mlp_params} MLP parameters, not 3 * hidden * ffn")
        embed = model.layers[0]
        if embed.attention or embed.flops_per_token or embed.param_bytes % (h * db):
            raise bad("first layer is not an embedding table of vocab x hidden")
        return cls(
            n_layers=len(blocks),
            hidden=h,
            heads=model.heads,
            kv_heads=model.kv_heads,
            head_dim=hd,
            ffn=mlp_params // (3 * h),
            vocab=embed.param_bytes // (h * db),
            dtype_bytes=db,
        )
