"""Operations per second of the paged KV block allocator (engine.kv.KVBlockAllocator).

A *pair* is one ``allocate`` of a short sequence (alternately 1 and 2 blocks of 64 tokens) and
its ``free``, on a pool that is already large enough (no growth inside the timed loop), which is
what a serving loop does per request. The loop is single-threaded (one core); rates divide by
the process CPU time so other jobs on the machine do not distort them (wall rates are printed
too). Further rows: the same pairs with token ids (chained blake2b prefix keys, all misses), the
same prompt again and again (every block a prefix hit on cached blocks), and decode appends.

Prints a table; the LAST line is one JSON object::

    {"alloc_free_pairs_per_s": ..., "keyed_pairs_per_s": ..., "prefix_hit_pairs_per_s": ...,
     "append_tokens_per_s": ...}

``alloc_free_pairs_per_s(n_pairs)`` is also imported by ``benchmarks/kv.py``.
Run: ``python benchmarks/kv_alloc.py`` (``--pairs 50000`` for a quick run). Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from engine.kv import KVBlockAllocator

BLOCK = 64


def _rate(n_ops: int, body: Callable[[], None], repeats: int = 3) -> tuple[float, float]:
    """Median ops/s by CPU time and by wall time over ``repeats`` runs of ``body``."""
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        body()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    cpu.sort()
    wall.sort()
    mid = repeats // 2
    return n_ops / max(cpu[mid], 1e-9), n_ops / max(wall[mid], 1e-9)


def _pairs_body(n_pairs: int) -> Callable[[], None]:
    a = KVBlockAllocator(block_tokens=BLOCK, bytes_per_token=2, initial_blocks=1024)
    lengths = [40, 100] * (n_pairs // 2) + [40] * (n_pairs % 2)  # 1 and 2 blocks

    def body() -> None:
        alloc, free = a.allocate, a.free
        for i, n in enumerate(lengths):
            alloc(i, n)
            free(i)

    return body


def alloc_free_pairs_per_s(n_pairs: int = 200_000) -> float:
    """Allocate+free pairs per second of one core (median of 3 runs, CPU time)."""
    return _rate(n_pairs, _pairs_body(n_pairs))[0]


def _keyed_body(n_pairs: int, repeat_prompt: bool) -> Callable[[], None]:
    a = KVBlockAllocator(block_tokens=BLOCK, bytes_per_token=2, initial_blocks=1024)
    base = list(range(100))

    def body() -> None:
        alloc, free = a.allocate, a.free
        for i in range(n_pairs):
            alloc(i, base if repeat_prompt else [i, *base[1:]])
            free(i)

    return body


def _append_body(n_tokens: int) -> Callable[[], None]:
    a = KVBlockAllocator(block_tokens=BLOCK, bytes_per_token=2, initial_blocks=4096)
    seqs = 64

    def body() -> None:
        for s in range(seqs):
            a.allocate(s, 100)
        append = a.append
        for _ in range(n_tokens // seqs):
            for s in range(seqs):
                append(s, 1)
        for s in range(seqs):
            a.free(s)

    return body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200_000, help="allocate+free pairs per run")
    args = ap.parse_args(argv)
    n = args.pairs
    rows = [
        ("alloc+free pairs (1-2 blocks)", "pairs/s", *_rate(n, _pairs_body(n))),
        ("keyed pairs (token ids, misses)", "pairs/s", *_rate(n // 4, _keyed_body(n // 4, False))),
        ("prefix-hit pairs (same prompt)", "pairs/s", *_rate(n // 4, _keyed_body(n // 4, True))),
        ("decode appends (64 sequences)", "tokens/s", *_rate(n, _append_body(n))),
    ]
    print(f"{'operation':34} {'unit':9} {'per CPU-s':>12} {'per wall-s':>12}")
    for name, unit, cpu, wall in rows:
        print(f"{name:34} {unit:9} {cpu:12,.0f} {wall:12,.0f}")
    print(
        json.dumps(
            {
                "alloc_free_pairs_per_s": round(rows[0][2]),
                "keyed_pairs_per_s": round(rows[1][2]),
                "prefix_hit_pairs_per_s": round(rows[2][2]),
                "append_tokens_per_s": round(rows[3][2]),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
