"""The engine's models: a small LLaMA-style decoder with a paged KV cache, and a dense no-KV
network (the CNN-like case). Array code takes its module from :mod:`engine.backend`.

Weights arrive **one layer at a time** as a flat float32 vector (the layer's chunks joined);
:func:`unpack` cuts it into named tensors by the layer's layout. The layouts below give exactly
the parameter bytes the simulator's catalogue gives for the same shape (``sim.serving.models``: layers
``embedding``, ``block0..N-1``, ``lm_head`` with the final norm folded in), so the engine and the
simulator chunk the same bytes.

Decoder block (pre-norm): ``x += attn(rmsnorm(x)) @ wo``; ``x += (silu(h @ wg) * (h @ wu)) @ wd``
with ``h = rmsnorm(x)``. There is no positional encoding (the engine exists to move and compute
on real bytes; positions change no cost). Prefill attention is dense causal attention per
prompt; its K/V are written into the paged :class:`engine.kv.storage.KVStorage`. A decode step
appends each sequence's new K/V through its block table and attends with
:func:`engine.kv.attention.paged_decode_attention`.

The layer-at-a-time interface (:meth:`DecoderModel.run_layer`) lets the scheduler fetch a layer
while the previous one computes (R19/R21). One iteration = a prefill part (new prompts,
concatenated) and a decode part (one token per running sequence); each layer runs both parts
with the same weights, so a layer's weights are fetched once per iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.kv.allocator import KVBlockAllocator
from engine.kv.attention import paged_decode_attention
from engine.kv.prefix import num_blocks
from engine.kv.storage import KVLayout, KVStorage

__all__ = [
    "DecoderConfig",
    "DecoderModel",
    "DenseConfig",
    "DenseModel",
    "IterationState",
    "OpCall",
    "run_op",
    "unpack",
]

DTYPE_BYTES = 4  # the engine computes in float32 (NumPy float16 matmuls are slow)
EPS = 1e-6


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of a decoder; ``head_dim = hidden // heads``. Layers: embedding, blocks, lm_head."""

    name: str
    n_blocks: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    block_tokens: int = 16

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise InputError(
                f"hidden {self.hidden}, heads {self.heads}, kv_heads {self.kv_heads} not "
                "allowed; allowed: hidden a multiple of heads, heads a multiple of kv_heads",
                where="model shape",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_layers(self) -> int:
        return self.n_blocks + 2

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all blocks, K and V (float32)."""
        return 2 * self.n_blocks * self.kv_heads * self.head_dim * DTYPE_BYTES

    def layout(self, layer: int) -> list[tuple[str, tuple[int, ...]]]:
        """Named tensor shapes of ``layer``, in the order they lie in the layer's bytes."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        if layer == 0:
            return [("embed", (self.vocab, h))]
        if layer == self.n_layers - 1:
            return [("norm", (h,)), ("head", (h, self.vocab))]
        if not 0 < layer < self.n_layers - 1:
            raise IndexError(f"layer {layer} out of range 0..{self.n_layers - 1}")
        return [
            ("attn_norm", (h,)),
            ("wq", (h, h)),
            ("wk", (h, kv)),
            ("wv", (h, kv)),
            ("wo", (h, h)),
            ("mlp_norm", (h,)),
            ("wg", (h, self.ffn)),
            ("wu", (h, self.ffn)),
            ("wd", (self.ffn, h)),
        ]

    def layer_bytes(self) -> list[int]:
        """Bytes of each layer (input of :func:`engine.chunkstore.write_model`)."""
        return [
            DTYPE_BYTES * sum(math.prod(s) for _, s in self.layout(i)) for i in range(self.n_layers)
        ]


@dataclass(frozen=True)
class DenseConfig:
    """A dense no-KV network: layer ``i`` maps ``widths[i]`` to ``widths[i+1]`` (W then b);
    ReLU between layers. One request = one input vector -> one output vector (CNN-like)."""

    name: str
    widths: tuple[int, ...]

    @property
    def n_layers(self) -> int:
        return len(self.widths) - 1

    def layout(self, layer: int) -> list[tuple[str, tuple[int, ...]]]:
        a, b = self.widths[layer], self.widths[layer + 1]
        return [("w", (a, b)), ("b", (b,))]

    def layer_bytes(self) -> list[int]:
        return [
            DTYPE_BYTES * (a * b + b) for a, b in zip(self.widths, self.widths[1:], strict=False)
        ]


def unpack(
    layout: list[tuple[str, tuple[int, ...]]], flat: Any, xp: ModuleType = np
) -> dict[str, Any]:
    """Cut a layer's flat bytes (uint8) or float32 values into named tensor views (no copy)."""
    arr = flat if flat.dtype == xp.float32 else flat.view(xp.float32)
    need = sum(math.prod(shape) for _, shape in layout)
    if need != arr.size:
        raise ValueError(f"layer holds {arr.size} values but its layout needs {need}")
    out: dict[str, Any] = {}
    pos = 0
    for name, shape in layout:
        n = math.prod(shape)
        out[name] = arr[pos : pos + n].reshape(shape)
        pos += n
    return out


def _rmsnorm(x: Any, w: Any, xp: ModuleType) -> Any:
    ms = xp.mean(x * x, axis=-1, keepdims=True)
    return x / xp.sqrt(ms + xp.float32(EPS)) * w


def _silu(x: Any, xp: ModuleType) -> Any:
    return x / (xp.float32(1.0) + xp.exp(-x))


def _silu_mul(g: Any, u: Any, xp: ModuleType) -> Any:
    return _silu(g, xp) * u


#: how a model runs one op: ``op(name, fn, *args)`` returns ``fn(*args)``. ``name`` is the
#: op's name in :data:`sim.serving.opcost.iteration.OP_NAMES` (``attention_prefill`` includes
#: the KV write, ``attention_decode`` the new token's K/V scatter), or ``residual_add``
OpCall = Callable[..., Any]


def run_op(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """The default :data:`OpCall`: ``fn(*args)``; ``name`` is for hooks that time ops."""
    return fn(*args)


@dataclass
class IterationState:
    """Activations of one iteration. ``prefill``: (seq id, prompt token ids) of new
    sequences, their tokens concatenated in ``x_p``; ``decode``: (seq id, last token) of
    running ones, one row each in ``x_d``. ``pos_d[i]``: KV position of decode row ``i``."""

    prefill: list[tuple[int, np.ndarray]]
    decode: list[tuple[int, int]]
    x_p: Any = None
    x_d: Any = None
    pos_d: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tables_d: list[list[int]] = field(default_factory=list)  # block table of each decode row
    blocks_d: Any = None  # block id and slot where each decode row's new K/V goes
    slots_d: Any = None
    logits_p: Any = None  # [n_prefill, vocab]: logits of each prompt's last token
    logits_d: Any = None  # [n_decode, vocab]


class DecoderModel:
    """A decoder bound to a KV cache of ``kv_tokens`` token slots (whole blocks).

    Sequences: :meth:`begin` allocates a new sequence's prompt blocks and extends running
    ones by one token; :meth:`release` frees a finished sequence. Invariant: a sequence's KV
    holds exactly the tokens whose K/V were written (prompt + decoded tokens fed back).
    The engine instead lets its scheduler's admission object take the blocks in :attr:`kv`
    (:class:`engine.kv.admission.KvAdmission`) and gives :meth:`begin` the decode positions;
    the block tables then cover the written tokens and ``kv``'s token counts may lag.

    Every array op of an iteration runs through :attr:`op` (an :data:`OpCall`, default
    :func:`run_op`), named as the simulator's op model names it, so a probe can time each op
    in place (:mod:`hwbench.insitu_probe`); replacing it changes no result.
    """

    def __init__(self, cfg: DecoderConfig, kv_tokens: int, xp: ModuleType = np) -> None:
        self.cfg = cfg
        self.xp = xp
        bt = cfg.block_tokens
        n_blocks = max(1, num_blocks(kv_tokens, bt))
        self.kv = KVBlockAllocator(
            block_tokens=bt,
            bytes_per_token=cfg.kv_bytes_per_token,
            initial_blocks=n_blocks,
            max_bytes=n_blocks * bt * cfg.kv_bytes_per_token,
        )
        layout = KVLayout(cfg.n_blocks, bt, cfg.kv_heads, cfg.head_dim, "fp32")
        self.store = KVStorage(layout, n_blocks, xp)
        self.op: OpCall = run_op

    def begin(
        self,
        prefill: list[tuple[int, np.ndarray]],
        decode: list[tuple[int, int]],
        positions: Sequence[int] | None = None,
    ) -> IterationState:
        """Reserve KV for this iteration's tokens; see the class docstring. ``positions``:
        each decode row's KV position, when the caller already took this iteration's blocks
        in :attr:`kv` (``begin`` then allocates nothing)."""
        st = IterationState(prefill, decode)
        if positions is None:
            for sid, toks in prefill:
                self.kv.allocate(sid, len(toks))
        pos = np.zeros(len(decode), dtype=np.int64)
        tables: list[list[int]] = []
        for i, (sid, _) in enumerate(decode):
            if positions is None:
                pos[i] = self.kv.num_tokens(sid)
                self.kv.append(sid, 1)
            else:
                pos[i] = positions[i]
            tables.append(self.kv.block_table(sid))
        bt = self.cfg.block_tokens
        st.pos_d = pos
        st.tables_d = tables
        st.blocks_d = self.xp.asarray(
            np.array(
                [t[p // bt] for t, p in zip(tables, pos.tolist(), strict=True)], dtype=np.int64
            )
        )
        st.slots_d = self.xp.asarray(pos % bt)
        return st

    def release(self, sid: int) -> None:
        """Free finished sequence ``sid``'s KV blocks."""
        self.kv.free(sid)

    def run_layer(self, st: IterationState, layer: int, w: dict[str, Any]) -> None:
        """Run ``layer`` (weights ``w``, see :meth:`DecoderConfig.layout`) on both parts."""
        xp, cfg, op = self.xp, self.cfg, self.op
        if layer == 0:
            if st.prefill:
                ids = xp.asarray(np.concatenate([t for _, t in st.prefill]))
                st.x_p = op("embedding", _gather, w["embed"], ids)
            if st.decode:
                ids = xp.asarray(np.array([t for _, t in st.decode]))
                st.x_d = op("embedding", _gather, w["embed"], ids)
            return
        if layer == cfg.n_layers - 1:
            if st.prefill:
                ends = np.cumsum([len(t) for _, t in st.prefill]) - 1
                # logits of each prompt's last token only (what is sampled), as vLLM does
                h = op("final_norm", _rmsnorm, st.x_p[xp.asarray(ends)], w["norm"], xp)
                st.logits_p = op("lm_head", xp.matmul, h, w["head"])
            if st.decode:
                h = op("final_norm", _rmsnorm, st.x_d, w["norm"], xp)
                st.logits_d = op("lm_head", xp.matmul, h, w["head"])
            return
        blk = layer - 1
        if st.prefill:
            st.x_p = self._block(st, blk, w, st.x_p, self._attend_prefill, "attention_prefill")
        if st.decode:
            st.x_d = self._block(st, blk, w, st.x_d, self._attend_decode, "attention_decode")

    # -- blocks ---------------------------------------------------------------------------
    def _block(
        self,
        st: IterationState,
        blk: int,
        w: dict[str, Any],
        x: Any,
        attend: Callable[..., Any],
        attn_name: str,
    ) -> Any:
        """One decoder block on one part's activations ``x``; ``attend(st, blk, q, k, v)``
        is that part's attention (op ``attn_name``)."""
        xp, cfg, op = self.xp, self.cfg, self.op
        H, KV, D = cfg.heads, cfg.kv_heads, cfg.head_dim
        h = op("input_norm", _rmsnorm, x, w["attn_norm"], xp)
        q = op("qkv_gemm", xp.matmul, h, w["wq"]).reshape(-1, H, D)
        k = op("qkv_gemm", xp.matmul, h, w["wk"]).reshape(-1, KV, D)
        v = op("qkv_gemm", xp.matmul, h, w["wv"]).reshape(-1, KV, D)
        att = op(attn_name, attend, st, blk, q, k, v)
        x = op("residual_add", xp.add, x, op("o_gemm", xp.matmul, att, w["wo"]))
        h = op("post_attn_norm", _rmsnorm, x, w["mlp_norm"], xp)
        g = op("gate_up_gemm", xp.matmul, h, w["wg"])
        u = op("gate_up_gemm", xp.matmul, h, w["wu"])
        a = op("activation", _silu_mul, g, u, xp)
        return op("residual_add", xp.add, x, op("down_gemm", xp.matmul, a, w["wd"]))

    def _attend_prefill(self, st: IterationState, blk: int, q: Any, k: Any, v: Any) -> Any:
        """Causal attention of each prompt (its K/V written into the store first);
        ``[tokens, hidden]``."""
        xp, cfg = self.xp, self.cfg
        H, KV, D = cfg.heads, cfg.kv_heads, cfg.head_dim
        out = xp.empty_like(q)
        scale = xp.float32(1.0 / math.sqrt(D))
        g = H // KV
        lo = 0
        for sid, toks in st.prefill:
            n = len(toks)
            ks, vs = k[lo : lo + n], v[lo : lo + n]
            self.store.write_tokens(blk, self.kv.block_table(sid), 0, ks, vs)
            qs = q[lo : lo + n].reshape(n, KV, g, D).transpose(1, 2, 0, 3)  # [KV, g, n, D]
            s = xp.matmul(qs, ks.transpose(1, 2, 0)[:, None]) * scale  # [KV, g, n, n]
            s = s + xp.asarray(np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1))
            s = xp.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = xp.matmul(s, vs.transpose(1, 0, 2)[:, None])  # [KV, g, n, D]
            out[lo : lo + n] = o.transpose(2, 0, 1, 3).reshape(n, H, D)
            lo += n
        return out.reshape(-1, cfg.hidden)

    def _attend_decode(self, st: IterationState, blk: int, q: Any, k: Any, v: Any) -> Any:
        """The new token's K/V scattered into the store, then paged attention over each
        sequence's KV; ``[batch, hidden]``."""
        # fp32 store: one scatter for the whole batch (slot = block of the position, offset);
        # the per-token write() path is for quantised formats, which re-code groups.
        kd, vd = self.store.raw(blk)
        kd[st.blocks_d, st.slots_d] = k
        vd[st.blocks_d, st.slots_d] = v
        att = paged_decode_attention(
            q, self.store, st.tables_d, st.pos_d + 1, layer=blk, xp=self.xp
        )
        return att.reshape(-1, self.cfg.hidden)


def _gather(table: Any, ids: Any) -> Any:
    return table[ids]


class DenseModel:
    """The dense no-KV network of :class:`DenseConfig` (ReLU between layers)."""

    def __init__(self, cfg: DenseConfig, xp: ModuleType = np) -> None:
        self.cfg = cfg
        self.xp = xp

    def run_layer(self, x: Any, layer: int, w: dict[str, Any]) -> Any:
        """Apply ``layer`` to activations ``x`` ``[batch, widths[layer]]``."""
        y = x @ w["w"] + w["b"]
        return y if layer == self.cfg.n_layers - 1 else self.xp.maximum(y, self.xp.float32(0))
