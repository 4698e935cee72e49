"""CUDA paged decode attention for fp32 / fp16 KV stores, compiled with ``cupy.RawKernel``.

Loaded only through :func:`engine.backend.gpu_kernels` and only on the CuPy backend; this
module never imports cupy itself - the caller passes the module in (``xp``) via the arrays.

Kernel design (R5: attention tiles kept in shared memory)
----------------------------------------------------------
One CUDA block per (sequence, query head); ``THREADS`` threads. The context is walked in tiles
of ``TILE`` tokens. Per tile, the threads cooperatively copy the tile's K rows (through the
block table) into shared memory, each thread scores some tokens against the query (also in
shared memory), the tile's scores are folded into a running max / running sum (online
softmax, as in :mod:`engine.kv.attention`), then the V rows of the same tile are staged in
the same shared buffer and every thread updates the output channels it owns. Shared memory
per block: ``TILE * (MAX_DIM + 1)`` floats for the K/V tile (+1 column of padding against
bank conflicts), ``MAX_DIM`` for the query, ``TILE`` for scores. Working memory is O(TILE).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "HALF_TO_FLOAT",
    "KERNEL_SOURCE",
    "MAX_DIM",
    "THREADS",
    "TILE",
    "kernel_source",
    "paged_decode_attention",
]

TILE = 32
THREADS = 128
MAX_DIM = 256

KERNEL_SOURCE = r"""
#define TILE __TILE__
#define THREADS __THREADS__
#define MAX_DIM __MAX_DIM__
#define PER_THREAD ((MAX_DIM + THREADS - 1) / THREADS)
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_f32(float x) { return x; }
__HALF_TO_FLOAT__

template <typename KV_T>
__device__ void paged_attn(const float* __restrict__ q,          // [B, H, D]
                           const KV_T* __restrict__ k,           // [NB, BT, KVH, D]
                           const KV_T* __restrict__ v,           // [NB, BT, KVH, D]
                           const int* __restrict__ tables,       // [B, max_blocks]
                           const int* __restrict__ context_lens, // [B]
                           float* __restrict__ out,              // [B, H, D]
                           int heads, int kv_heads, int dim, int block_tokens,
                           int max_blocks, float scale)
{
    __shared__ float q_s[MAX_DIM];
    __shared__ float tile_s[TILE][MAX_DIM + 1];
    __shared__ float p_s[TILE];

    const int b = blockIdx.x;
    const int h = blockIdx.y;
    const int kvh = h / (heads / kv_heads);
    const int tid = threadIdx.x;
    const int len = context_lens[b];
    const int* table = tables + (long long)b * max_blocks;

    for (int d = tid; d < dim; d += THREADS) {
        q_s[d] = q[((long long)b * heads + h) * dim + d] * scale;
    }
    float acc[PER_THREAD];
    for (int i = 0; i < PER_THREAD; ++i) acc[i] = 0.0f;
    float m = NEG_INF;  // running max of scores seen so far
    float l = 0.0f;       // running sum of exp(score - m)
    __syncthreads();

    for (int t0 = 0; t0 < len; t0 += TILE) {
        const int n = min(TILE, len - t0);
        // 1. stage K rows of this tile in shared memory (coalesced along head_dim).
        for (int idx = tid; idx < n * dim; idx += THREADS) {
            const int t = idx / dim, d = idx - t * dim;
            const int pos = t0 + t;
            const long long blk = table[pos / block_tokens];
            const long long row = (blk * block_tokens + pos % block_tokens) * kv_heads + kvh;
            tile_s[t][d] = to_f32(k[row * dim + d]);
        }
        __syncthreads();
        // 2. scores of the tile's tokens.
        for (int t = tid; t < TILE; t += THREADS) {
            float s = NEG_INF;
            if (t < n) {
                s = 0.0f;
                for (int d = 0; d < dim; ++d) s += q_s[d] * tile_s[t][d];
            }
            p_s[t] = s;
        }
        __syncthreads();
        // 3. online softmax update (every thread computes the same scalars).
        float tile_max = NEG_INF;
        for (int t = 0; t < n; ++t) tile_max = fmaxf(tile_max, p_s[t]);
        const float m_new = fmaxf(m, tile_max);  // finite: n >= 1
        const float alpha = expf(m - m_new);
        float tile_sum = 0.0f;
        for (int t = 0; t < n; ++t) tile_sum += expf(p_s[t] - m_new);
        l = l * alpha + tile_sum;
        m = m_new;
        __syncthreads();  // everyone has read the scores and the K tile
        // 4. stage V rows in the same buffer and turn scores into weights.
        for (int idx = tid; idx < n * dim; idx += THREADS) {
            const int t = idx / dim, d = idx - t * dim;
            const int pos = t0 + t;
            const long long blk = table[pos / block_tokens];
            const long long row = (blk * block_tokens + pos % block_tokens) * kv_heads + kvh;
            tile_s[t][d] = to_f32(v[row * dim + d]);
        }
        for (int t = tid; t < n; t += THREADS) p_s[t] = expf(p_s[t] - m_new);
        __syncthreads();
        // 5. each thread owns channels d = tid, tid + THREADS, ...
        for (int i = 0; i < PER_THREAD; ++i) {
            const int d = tid + i * THREADS;
            if (d < dim) {
                float a = acc[i] * alpha;
                for (int t = 0; t < n; ++t) a += p_s[t] * tile_s[t][d];
                acc[i] = a;
            }
        }
        __syncthreads();  // the tile buffer is reused by the next iteration
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // empty context -> zeros
    for (int i = 0; i < PER_THREAD; ++i) {
        const int d = tid + i * THREADS;
        if (d < dim) out[((long long)b * heads + h) * dim + d] = acc[i] * inv;
    }
}

extern "C" __global__ void paged_attn_f32(const float* q, const float* k, const float* v,
                                          const int* tables, const int* context_lens,
                                          float* out, int heads, int kv_heads, int dim,
                                          int block_tokens, int max_blocks, float scale)
{
    paged_attn<float>(q, k, v, tables, context_lens, out, heads, kv_heads, dim,
                      block_tokens, max_blocks, scale);
}

extern "C" __global__ void paged_attn_f16(const float* q, const unsigned short* k,
                                          const unsigned short* v,
                                          const int* tables, const int* context_lens,
                                          float* out, int heads, int kv_heads, int dim,
                                          int block_tokens, int max_blocks, float scale)
{
    paged_attn<unsigned short>(q, k, v, tables, context_lens, out, heads, kv_heads, dim,
                       block_tokens, max_blocks, scale);
}
"""


HALF_TO_FLOAT = r"""
// fp16 arrives as raw 16-bit words; one PTX conversion, so no header is needed under NVRTC.
__device__ __forceinline__ float to_f32(unsigned short bits)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}
"""


def kernel_source(half_to_float: str = HALF_TO_FLOAT) -> str:
    """The CUDA source with the tile constants substituted. ``half_to_float`` defines
    ``float to_f32(unsigned short)``; the CPU emulation test swaps in a portable one."""
    return (
        KERNEL_SOURCE.replace("__HALF_TO_FLOAT__", half_to_float)
        .replace("__TILE__", str(TILE))
        .replace("__THREADS__", str(THREADS))
        .replace("__MAX_DIM__", str(MAX_DIM))
    )


_CACHE: dict[tuple[str, str], Any] = {}


def _kernel(xp: ModuleType, kv_dtype: str) -> Any:
    """The compiled RawKernel for ``kv_dtype`` ("float32" or "float16"), cached per process."""
    name = {"float32": "paged_attn_f32", "float16": "paged_attn_f16"}[kv_dtype]
    key = (xp.__name__, name)
    if key not in _CACHE:
        _CACHE[key] = xp.RawKernel(kernel_source(), name)
    return _CACHE[key]


def paged_decode_attention(
    xp: ModuleType,
    q: Any,
    k_data: Any,
    v_data: Any,
    tables: Any,
    context_lens: Any,
    scale: float,
) -> Any:
    """Run the kernel on backend ``xp`` (cupy). ``q``: float32 ``[B, H, D]``;
    ``k_data``/``v_data``: the store's ``[num_blocks, block_tokens, kv_heads, D]`` fp32 or
    fp16 arrays; ``tables``: int32 ``[B, max_blocks]`` (entries past a sequence's last block
    are never read); ``context_lens``: int32 ``[B]``. Returns float32 ``[B, H, D]``."""
    batch, heads, dim = (int(x) for x in q.shape)
    _num_blocks, block_tokens, kv_heads, kdim = (int(x) for x in k_data.shape)
    if kdim != dim or dim > MAX_DIM:
        raise ValueError(f"head_dim {dim} unsupported by the kernel (store {kdim}, max {MAX_DIM})")
    if heads % kv_heads:
        raise ValueError(f"heads {heads} not a multiple of kv_heads {kv_heads}")
    out = xp.zeros((batch, heads, dim), dtype=xp.float32)
    if batch == 0:
        return out
    kernel = _kernel(xp, str(k_data.dtype))
    kernel(
        (batch, heads),
        (THREADS,),
        (
            xp.ascontiguousarray(q, dtype=xp.float32),
            xp.ascontiguousarray(k_data),
            xp.ascontiguousarray(v_data),
            xp.ascontiguousarray(tables, dtype=xp.int32),
            xp.ascontiguousarray(context_lens, dtype=xp.int32),
            out,
            np.int32(heads),
            np.int32(kv_heads),
            np.int32(dim),
            np.int32(block_tokens),
            np.int32(tables.shape[1]),
            np.float32(scale),
        ),
    )
    return out
