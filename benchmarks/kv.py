"""KV cache figures: allocator speed, paged-attention bandwidth on CPU, codec errors.

Prints readable tables; the LAST line is one JSON object::

    {"alloc_free_pairs_per_s": ..., "paged_attention_bw_fraction": ...,
     "codec_rel_error": {"fp16": ..., "int8_g32": ..., ...}, ...}

1. Allocator alloc+free pairs/s (from benchmarks/kv_alloc.py; target >= 200k on one core).
2. Paged decode attention effective bandwidth (KV bytes read / time) as a fraction of a plain
   NumPy copy of the same number of bytes timed in the same run (best of N each): batch 8,
   context 4K, 32 query heads over 8 KV heads, head_dim 128, 64-token blocks scattered at
   random. The headline ``paged_attention_bw_fraction`` is fp32 with 512-token chunks (the
   R12 default chunk); other chunk sizes, unchunked, and fp16/int8/int4 rows are printed too.
   BLAS runs on one thread (OPENBLAS_NUM_THREADS=1 unless set), like the copy.
3. Batches of mixed lengths: one masked batch call vs one call per sequence.
4. Codec round-trip relative error ||x'-x||/||x|| per format and group size on N(0,1) data,
   keys grouped per channel (token axis), values per token (channel axis); the JSON value is
   over K and V together.
5. Attention output error vs dense float64 attention as the logits sharpen (query std).

Run: ``python benchmarks/kv.py`` (quick: ``--quick``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core for BLAS, like the plain copy

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.kv.attention import dense_attention, paged_decode_attention
from engine.kv.quant import rel_error, roundtrip_rel_error
from engine.kv.storage import KVLayout, KVStorage

HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 128, 64


def _best(body: Callable[[], object], reps: int) -> float:
    """Best wall time of ``reps`` runs after one warm-up run."""
    return _best_pair(body, None, reps)[0]


def _best_pair(
    a: Callable[[], object], b: Callable[[], object] | None, reps: int
) -> tuple[float, float]:
    """Best wall times of ``a`` and ``b`` run alternately (so load changes hit both alike)."""
    best_a = best_b = float("inf")
    a()
    if b is not None:
        b()
    for _ in range(reps):
        t0 = time.perf_counter()
        a()
        best_a = min(best_a, time.perf_counter() - t0)
        if b is not None:
            t0 = time.perf_counter()
            b()
            best_b = min(best_b, time.perf_counter() - t0)
    return best_a, best_b


def _store(fmt: str, lens: list[int], rng: np.random.Generator) -> tuple[KVStorage, list]:
    """Sequences of N(0,1) K/V in a store, blocks placed by a random permutation."""
    need = [-(-n // BLOCK) for n in lens]
    store = KVStorage(KVLayout(1, BLOCK, KV_HEADS, DIM, fmt, 64), sum(need))
    perm = rng.permutation(store.num_blocks)
    tables, start = [], 0
    for nb in need:
        tables.append(perm[start : start + nb].tolist())
        start += nb
    ids = np.arange(store.num_blocks)
    for i in range(0, store.num_blocks, 64):  # fill in slices to bound the temporaries
        sl = ids[i : i + 64]
        shape = (len(sl), BLOCK, KV_HEADS, DIM)
        store.write_blocks(
            0, sl, rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
        )
    return store, tables


def allocator_rate(pairs: int) -> float | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from kv_alloc import alloc_free_pairs_per_s
    except ImportError as err:
        print(f"allocator: benchmarks/kv_alloc.py not importable ({err}); rate not measured")
        return None
    rate = float(alloc_free_pairs_per_s(pairs))
    print(f"allocator: {rate:,.0f} alloc+free pairs/s (one core, {pairs:,} pairs)\n")
    return rate


def bandwidth(context: int, reps: int, rng: np.random.Generator) -> dict[str, float]:
    batch = 8
    q = rng.standard_normal((batch, HEADS, DIM)).astype(np.float32)
    rows: list[tuple[str, str, float, float, float]] = []
    fractions: dict[str, float] = {}
    plan = [("fp32", c) for c in (128, 256, 512, None)]
    plan += [(f, 512) for f in ("fp16", "int8", "int4")]
    stores: dict[str, tuple[KVStorage, list]] = {}
    for fmt, chunk in plan:
        if fmt not in stores:
            stores.clear()
            stores[fmt] = _store(fmt, [context] * batch, rng)
        store, tables = stores[fmt]
        nbytes = store.nbytes  # every block is read once per call
        src = np.ones(nbytes // 4, dtype=np.float32)
        dst = np.empty_like(src)
        n = 1 if chunk is None else reps  # unchunked is slow on CPU; one timed run
        t_copy, t_attn = _best_pair(
            lambda src=src, dst=dst: np.copyto(dst, src),
            lambda store=store, tables=tables, chunk=chunk: paged_decode_attention(
                q, store, tables, [context] * batch, chunk_tokens=chunk
            ),
            n,
        )
        del src, dst
        frac = t_copy / t_attn
        label = "none" if chunk is None else str(chunk)
        rows.append((fmt, label, nbytes / 1e6, nbytes / t_copy / 1e9, nbytes / t_attn / 1e9))
        fractions[f"{fmt}_chunk{label}"] = frac
    print(f"paged decode attention, batch {batch}, context {context}, {HEADS}/{KV_HEADS} heads,")
    print(f"head_dim {DIM}, block {BLOCK} tokens (KV bytes include scales; best of {reps})")
    print(
        f"{'format':7} {'chunk':>6} {'KV MB':>8} {'copy GB/s':>10} {'attn GB/s':>10} {'fraction':>9}"
    )
    for (fmt, label, mb, copy_bw, attn_bw), frac in zip(rows, fractions.values(), strict=True):
        print(f"{fmt:7} {label:>6} {mb:8.1f} {copy_bw:10.2f} {attn_bw:10.2f} {frac:9.3f}")
    print()
    return fractions


def mixed_lengths(reps: int, rng: np.random.Generator) -> dict[str, float]:
    lens = [96, 300, 512, 1000, 1500, 2048, 3000, 4096]
    store, tables = _store("fp32", lens, rng)
    q = rng.standard_normal((len(lens), HEADS, DIM)).astype(np.float32)

    def batched() -> None:
        paged_decode_attention(q, store, tables, lens, chunk_tokens=512)

    def one_by_one() -> None:
        for b, n in enumerate(lens):
            paged_decode_attention(q[b : b + 1], store, [tables[b]], [n], chunk_tokens=512)

    t_batch, t_loop = _best(batched, reps), _best(one_by_one, reps)
    print(f"mixed lengths {lens} (fp32, chunk 512):")
    print(
        f"  one masked batch call {t_batch * 1e3:8.2f} ms   one call per sequence "
        f"{t_loop * 1e3:8.2f} ms   (per-sequence / batch = {t_loop / t_batch:.2f})\n"
    )
    return {"batch_ms": t_batch * 1e3, "per_sequence_ms": t_loop * 1e3}


def codec_errors(rng: np.random.Generator) -> dict[str, float]:
    x_k = rng.standard_normal((8, 128, 4, 128)).astype(np.float32)
    x_v = rng.standard_normal((8, 128, 4, 128)).astype(np.float32)
    out: dict[str, float] = {}
    print("codec round trip, relative error on N(0,1) [blocks, 128 tokens, heads, 128]:")
    print(f"{'format':9} {'keys':>9} {'values':>9} {'K and V':>9}")
    for fmt, group in [("fp16", 64)] + [(f, g) for f in ("int8", "int4") for g in (32, 64, 128)]:
        ek = roundtrip_rel_error(x_k, fmt, 1, group, np)
        ev = roundtrip_rel_error(x_v, fmt, -1, group, np)
        both = float(
            np.sqrt(
                (ek**2 * np.sum(x_k**2) + ev**2 * np.sum(x_v**2))
                / (np.sum(x_k**2) + np.sum(x_v**2))
            )
        )
        name = fmt if fmt == "fp16" else f"{fmt}_g{group}"
        out[name] = both
        print(f"{name:9} {ek:9.5f} {ev:9.5f} {both:9.5f}")
    print(
        "(R9 claims < 0.5% loss for FP16 + group quantisation: the int8 g64 figure above is "
        "the tensor error;\n the attention-output error follows)\n"
    )
    return out


def attention_errors(context: int, rng: np.random.Generator) -> dict[str, dict[str, float]]:
    lens = [context, context // 2, context // 4, 33]
    stds = (0.5, 1.0, 2.0)
    out: dict[str, dict[str, float]] = {}
    print(f"attention output relative error vs dense float64, lengths {lens}, by query std:")
    print(f"{'format':9} " + " ".join(f"{'q std ' + str(s):>11}" for s in stds))
    for fmt in ("fp32", "fp16", "int8", "int4"):
        sub = np.random.default_rng(7)
        need = [-(-n // BLOCK) for n in lens]
        store = KVStorage(KVLayout(1, BLOCK, 4, DIM, fmt, 64), sum(need))
        tables, ks, vs, start = [], [], [], 0
        for n, nb in zip(lens, need, strict=True):
            tables.append(list(range(start, start + nb)))
            start += nb
            k = sub.standard_normal((n, 4, DIM)).astype(np.float32)
            v = sub.standard_normal((n, 4, DIM)).astype(np.float32)
            store.write_tokens(0, tables[-1], 0, k, v)
            ks.append(k)
            vs.append(v)
        row: dict[str, float] = {}
        for s in stds:
            q = (s * sub.standard_normal((len(lens), 16, DIM))).astype(np.float32)
            got = paged_decode_attention(q, store, tables, lens, chunk_tokens=512)
            row[str(s)] = rel_error(got, dense_attention(q, ks, vs), np)
        name = fmt if fmt in ("fp32", "fp16") else f"{fmt}_g64"
        out[name] = row
        print(f"{name:9} " + " ".join(f"{row[str(s)]:11.5f}" for s in stds))
    print()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="context 1024, fewer repetitions")
    ap.add_argument("--pairs", type=int, default=200_000, help="allocator pairs to time")
    args = ap.parse_args(argv)
    context, reps = (1024, 2) if args.quick else (4096, 3)
    rng = np.random.default_rng(2026)
    summary: dict[str, object] = {
        "alloc_free_pairs_per_s": allocator_rate(50_000 if args.quick else args.pairs)
    }
    fractions = bandwidth(context, reps, rng)
    summary["paged_attention_bw_fraction"] = fractions["fp32_chunk512"]
    summary["paged_attention_bw_fraction_by_case"] = fractions
    summary["paged_attention_context"] = context
    summary["mixed_lengths"] = mixed_lengths(reps, rng)
    summary["codec_rel_error"] = codec_errors(rng)
    summary["attention_rel_error_by_query_std"] = attention_errors(min(context, 2048), rng)
    # The last line: one JSON object with the figures.
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
