"""Paged decode attention over :class:`~engine.kv.storage.KVStorage`, chunk by chunk.

One query token per sequence (decode step). K and V are read through each sequence's block
table one chunk of ``chunk_tokens`` tokens at a time (a whole number of blocks), dequantised
on the fly, and folded into an **online softmax** (running max ``m``, running sum ``l`` and a
running weighted sum ``acc``)::

    m' = max(m, max_t s_t);  a = exp(m - m');  p_t = exp(s_t - m')
    l' = a * l + sum_t p_t;  acc' = a * acc + sum_t p_t v_t;   out = acc / l   (at the end)

so working memory is O(chunk) rather than O(context). Sequences of different lengths share
each chunk step: only sequences that still have tokens in the chunk take part (an index
subset, split into groups whose gathered K fits ``step_bytes`` so it is still in cache when
BLAS reads it), and slots past a sequence's length inside its last chunk are masked.

Grouped-query attention: ``q`` has ``heads`` heads and the store ``kv_heads``; ``kv_heads``
must divide ``heads`` and query head ``h`` reads KV head ``h // (heads // kv_heads)``.

Relative error, used by tests: ``||out - ref|| / ||ref||`` with the Frobenius norm over the
whole ``[batch, heads, head_dim]`` output, ``ref`` from :func:`dense_attention` in float64.

On the CuPy backend, fp32 / fp16 stores go through a shared-memory tiled CUDA kernel
(:mod:`engine.kv.gpu_kernels`, loaded only via :mod:`engine.backend`); int formats use the
array path below, which is backend-generic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from engine import backend
from engine.errors import InputError
from engine.kv.storage import KVStorage

STEP_BYTES = 2 * 1024 * 1024  # about one core's L2 here; see benchmarks/kv.py

__all__ = ["dense_attention", "pad_block_tables", "paged_decode_attention"]


def dense_attention(q: Any, K: Any, V: Any, scale: float | None = None) -> np.ndarray:
    """Reference attention in float64 on the host, one query token per sequence.

    ``q``: ``[batch, heads, head_dim]``; ``K``, ``V``: a ``[batch, T, kv_heads, head_dim]``
    array or a sequence of ``batch`` arrays ``[T_b, kv_heads, head_dim]`` (lengths may differ).
    ``scale`` defaults to ``1 / sqrt(head_dim)``. Returns ``[batch, heads, head_dim]`` float64;
    a sequence with no tokens gives zeros.
    """
    qh = backend.to_numpy(q).astype(np.float64)
    batch, heads, dim = qh.shape
    s = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    out = np.zeros((batch, heads, dim), dtype=np.float64)
    for b in range(batch):
        kb = backend.to_numpy(K[b]).astype(np.float64)
        vb = backend.to_numpy(V[b]).astype(np.float64)
        if kb.shape[0] == 0:
            continue
        group = heads // kb.shape[1]
        kx = np.repeat(kb, group, axis=1)  # [T, heads, dim]
        vx = np.repeat(vb, group, axis=1)
        logits = np.einsum("hd,thd->ht", qh[b], kx) * s
        logits -= logits.max(axis=1, keepdims=True)
        w = np.exp(logits)
        w /= w.sum(axis=1, keepdims=True)
        out[b] = np.einsum("ht,thd->hd", w, vx)
    return out


def pad_block_tables(
    block_tables: Sequence[Sequence[int]] | Any, width: int, used: Sequence[int] | Any
) -> np.ndarray:
    """Block tables as one host ``[batch, width]`` int64 array. Row ``b`` keeps its first
    ``used[b]`` entries; every other cell (short rows, and padding such as -1 that a caller
    put after a sequence's last block) becomes block 0, which is never attended (positions
    past a sequence's length are masked)."""
    if hasattr(block_tables, "ndim") and block_tables.ndim == 2:
        rows: list[Sequence[int]] = list(backend.to_numpy(block_tables).astype(np.int64))
    else:
        rows = [list(r) for r in block_tables]
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        n = min(int(used[i]), len(r), width)
        out[i, :n] = np.asarray(r[:n], dtype=np.int64)
    return out


def _check_ids(table: np.ndarray, num_blocks: int) -> None:
    if table.size and (int(table.min()) < 0 or int(table.max()) >= num_blocks):
        bad = int(table.min()) if int(table.min()) < 0 else int(table.max())
        raise IndexError(f"block table holds block id {bad}; store has 0..{num_blocks - 1}")


def _check_inputs(
    q: Any, storage: KVStorage, block_tables: Any, ctx: np.ndarray, chunk_tokens: int | None
) -> None:
    lay = storage.layout
    if q.ndim != 3 or q.shape[2] != lay.head_dim:
        raise ValueError(f"q must be [batch, heads, {lay.head_dim}], got {tuple(q.shape)}")
    if q.shape[1] % lay.kv_heads:
        raise InputError(
            f"heads {q.shape[1]} is not a multiple of kv_heads {lay.kv_heads}; "
            "allowed: heads = k * kv_heads",
            where="attention.heads",
        )
    if len(block_tables) != q.shape[0] or ctx.shape != (q.shape[0],):
        raise ValueError(
            f"batch {q.shape[0]} needs {q.shape[0]} block tables and context lengths, got "
            f"{len(block_tables)} and {ctx.shape}"
        )
    if ctx.size and int(ctx.min()) < 0:
        raise ValueError("context lengths must be >= 0")
    for b in range(q.shape[0]):
        need = -(-int(ctx[b]) // lay.block_tokens)
        if len(block_tables[b]) < need:
            raise ValueError(f"sequence {b}: {int(ctx[b])} tokens need {need} blocks in its table")
    if chunk_tokens is not None and (chunk_tokens <= 0 or chunk_tokens % lay.block_tokens != 0):
        raise InputError(
            f"chunk_tokens {chunk_tokens!r} not allowed; allowed: None or a positive multiple "
            f"of block_tokens ({lay.block_tokens})",
            where="attention.chunk_tokens",
        )


def paged_decode_attention(
    q: Any,
    storage: KVStorage,
    block_tables: Sequence[Sequence[int]] | Any,
    context_lens: Sequence[int] | Any,
    chunk_tokens: int | None = None,
    scale: float | None = None,
    xp: ModuleType | None = None,
    *,
    layer: int = 0,
    use_kernel: bool = True,
    step_bytes: int = STEP_BYTES,
) -> Any:
    """Decode attention for a batch: ``q`` ``[batch, heads, head_dim]`` against the K/V of
    ``layer`` in ``storage`` reached through ``block_tables`` (per sequence, block ids in token
    order) for ``context_lens[b]`` tokens each. Returns float32 ``[batch, heads, head_dim]``
    (zeros for a sequence of length 0).

    ``chunk_tokens``: tokens read per step (a multiple of ``block_tokens``); None reads each
    sequence's whole context in one step (working memory then grows with the context).
    ``step_bytes`` bounds the float32 K (or V) gathered per step: sequences sharing a chunk
    step are processed in groups that fit (at least one sequence of one chunk per step).
    ``xp`` defaults to ``storage.xp``. On CuPy with an fp32/fp16 store and ``use_kernel`` the
    CUDA kernel runs instead (its tiles play the role of chunks).
    """
    xp = storage.xp if xp is None else xp
    lay = storage.layout
    ctx = backend.to_numpy(context_lens).astype(np.int64).reshape(-1)
    _check_inputs(q, storage, block_tables, ctx, chunk_tokens)
    batch, heads, dim = q.shape
    s = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    bt, kvh = lay.block_tokens, lay.kv_heads
    max_len = int(ctx.max()) if batch else 0
    max_blocks = max(1, -(-max_len // bt))

    used = -(-ctx // bt)  # blocks each sequence attends
    if backend.is_gpu(xp) and use_kernel and lay.fmt in ("fp32", "fp16"):
        kernels = backend.gpu_kernels(xp)
        k_data, v_data = storage.raw(layer)
        host_table = pad_block_tables(block_tables, max_blocks, used)
        _check_ids(host_table, storage.num_blocks)  # the kernel does no bounds checks
        table = xp.asarray(host_table, dtype=xp.int32)
        return kernels.paged_decode_attention(
            xp, xp.asarray(q, dtype=xp.float32), k_data, v_data, table, xp.asarray(ctx, xp.int32), s
        )

    chunk = max_blocks * bt if chunk_tokens is None else int(chunk_tokens)
    bpc = chunk // bt  # blocks per chunk
    n_chunks = max(1, -(-max_len // chunk))
    host_table = pad_block_tables(block_tables, n_chunks * bpc, used)
    _check_ids(host_table, storage.num_blocks)
    table = xp.asarray(host_table)
    group = heads // kvh
    # qt[b, k, :, g] is query head k * group + g, pre-multiplied by the softmax scale; kept
    # as [dim, group] so scores are K @ qt (K row-major: one BLAS call, no transposed K).
    qg = (xp.asarray(q, dtype=xp.float32) * xp.float32(s)).reshape(batch, kvh, group, dim)
    qt = xp.ascontiguousarray(qg.transpose(0, 1, 3, 2))
    m = xp.full((batch, kvh, group), -xp.inf, dtype=xp.float32)
    lsum = xp.zeros((batch, kvh, group), dtype=xp.float32)
    acc = xp.zeros((batch, kvh, group, dim), dtype=xp.float32)
    ctx_dev = xp.asarray(ctx)
    offsets = xp.arange(chunk, dtype=xp.int64)
    # Sequences per step: as many as keep one step's float32 K (then V) within step_bytes, so
    # the gathered chunk is still in cache when BLAS reads it (at least one sequence).
    per_step = max(1, min(batch, int(step_bytes) // (chunk * kvh * dim * 4)))
    # One buffer, reused for K then V of every step: working memory is O(per_step x chunk).
    buf = xp.empty((per_step, bpc, bt, kvh, dim), dtype=xp.float32)

    for c in range(n_chunks):
        lo = c * chunk
        live = np.flatnonzero(ctx > lo)  # sequences with tokens in this chunk
        for g0 in range(0, live.size, per_step):
            sub = live[g0 : g0 + per_step]
            n_act = int(sub.size)
            contiguous = int(sub[-1]) - int(sub[0]) + 1 == n_act
            act = slice(int(sub[0]), int(sub[-1]) + 1) if contiguous else xp.asarray(sub)
            ids = table[act, c * bpc : (c + 1) * bpc]
            k = storage.read_keys(layer, ids, out=buf[:n_act]).reshape(n_act, chunk, kvh, dim)
            scores = xp.matmul(k.transpose(0, 2, 1, 3), qt[act])  # [A, kvh, chunk, group]
            if bool((ctx[sub] < lo + chunk).any()):
                valid = (lo + offsets)[None, :] < ctx_dev[act][:, None]  # [A, chunk]
                scores = xp.where(valid[:, None, :, None], scores, xp.float32(-xp.inf))
            m_old = m[act]
            m_new = xp.maximum(m_old, scores.max(axis=2))  # finite: each has a token here
            alpha = xp.exp(m_old - m_new)
            p = xp.exp(scores - m_new[:, :, None, :])
            l_new = alpha * lsum[act] + p.sum(axis=2)
            v = storage.read_values(layer, ids, out=buf[:n_act]).reshape(n_act, chunk, kvh, dim)
            pv = xp.matmul(p.transpose(0, 1, 3, 2), v.transpose(0, 2, 1, 3))  # [A,kvh,group,dim]
            acc[act] = alpha[..., None] * acc[act] + pv
            m[act] = m_new
            lsum[act] = l_new

    safe = xp.where(lsum > 0, lsum, xp.float32(1))
    out = acc / safe[..., None]
    return out.reshape(batch, heads, dim).astype(xp.float32, copy=False)
