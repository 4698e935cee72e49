"""Read-only reports on a :class:`engine.kv.allocator.KVBlockAllocator`: the fragmentation
snapshot (R10, R20) and the invariant checker the tests call after every step.

Snapshot keys (one flat dict of numbers, ready for a time series):

* pool: ``pool_blocks``, ``cap_blocks`` (0 = unbounded), ``used_blocks``, ``free_blocks``,
  ``cached_blocks`` (used + free + cached == pool), ``sequences``, ``growth_events``;
* fragmentation: ``slot_waste_tokens`` -- token slots of used blocks that hold no token (the
  partial last blocks; a shared block counts once, filled as far as its fullest holder);
  ``slot_waste_fraction`` -- that over all token slots of used blocks;
  ``pool_free_fraction`` = free / pool blocks; ``pool_reclaimable_fraction`` =
  (free + cached) / pool blocks; ``largest_contiguous_free_run`` -- longest run of consecutive
  free block ids;
* bytes: ``block_bytes``, ``pool_bytes``, ``used_bytes``, ``cached_bytes``;
* counters: ``prefix_hit_rate`` and every :class:`engine.kv.allocator.KVStats` field;
* per offload tier ``<name>_bytes_in``, ``_bytes_out``, ``_bytes_loaded_back``,
  ``_bytes_dropped``, ``_blocks_loaded_back``, ``_resident_bytes``
  (see :mod:`engine.kv.offload`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from engine.kv.pool import UNBOUNDED

if TYPE_CHECKING:
    from engine.kv.allocator import KVBlockAllocator


def fragmentation_snapshot(a: KVBlockAllocator) -> dict[str, float]:
    """The snapshot dict described in the module docstring (O(total table entries))."""
    bt = a.block_tokens
    fill: dict[int, int] = {}
    for seq, table in a._tables.items():
        n = a._ntok[seq]
        for i, b in enumerate(table):
            f = min(bt, n - i * bt)
            if f > fill.get(b, -1):
                fill[b] = f
    used = a.num_used_blocks
    waste = sum(bt - f for f in fill.values())
    pool = a.pool_blocks
    free = a.num_free_blocks
    cached = a.num_cached_blocks
    out: dict[str, float] = {
        "pool_blocks": pool,
        "cap_blocks": 0 if a.cap_blocks == UNBOUNDED else a.cap_blocks,
        "used_blocks": used,
        "free_blocks": free,
        "cached_blocks": cached,
        "sequences": len(a._tables),
        "growth_events": a._pool.growth_events,
        "slot_waste_tokens": waste,
        "slot_waste_fraction": waste / (used * bt) if used else 0.0,
        "pool_free_fraction": free / pool,
        "pool_reclaimable_fraction": (free + cached) / pool,
        "largest_contiguous_free_run": a._pool.largest_free_run(),
        "block_bytes": a.block_bytes,
        "pool_bytes": pool * a.block_bytes,
        "used_bytes": used * a.block_bytes,
        "cached_bytes": cached * a.block_bytes,
        "prefix_hit_rate": a.stats.prefix_hit_rate,
    }
    out.update(asdict(a.stats))
    if a._offload is not None:
        resident = a._offload.resident_bytes()
        for name, counters in a._offload.moved.items():
            for k, v in counters.items():
                out[f"{name}_{k}"] = v
            out[f"{name}_resident_bytes"] = resident[name]
    return out


def _ensure(ok: bool, what: str) -> None:
    if not ok:  # explicit raise: the check must also run under ``python -O``
        raise AssertionError(f"KV allocator invariant broken: {what}")


def check_allocator_invariants(a: KVBlockAllocator) -> None:
    """Raise ``AssertionError`` naming the first broken invariant of ``a`` (O(pool))."""
    ref, bkey, size = a._ref, a._bkey, a.pool_blocks
    _ensure(len(ref) == size == len(bkey) <= a.cap_blocks, "pool size / cap")
    holders = [0] * size
    for seq, table in a._tables.items():
        _ensure(len(table) == -(-a._ntok[seq] // a.block_tokens), f"{seq!r}: table length")
        _ensure(len(set(table)) == len(table), f"{seq!r} holds a block twice")
        for b in table:
            holders[b] += 1
    _ensure(holders == ref, "refcount != number of sequences holding the block")
    free = set(a._free)  # membership only
    _ensure(len(free) == len(a._free), "a block is on the free list twice")
    policy = a._policy
    for b in range(size):
        key = bkey[b]
        if key is not None:
            _ensure(a._kblock.get(key) == b, f"key map broken at block {b}")
        if ref[b] > 0:  # used: never free, never cached
            _ensure(b not in free and (key is None or key not in policy), f"used block {b} idle")
        elif key is None:
            _ensure(b in free, f"unkeyed idle block {b} is not free")
        else:
            _ensure(key in policy and b not in free, f"keyed idle block {b} is not cached")
    _ensure(len(a._kblock) == sum(k is not None for k in bkey), "key map has stale keys")
    used = sum(r > 0 for r in ref)
    _ensure(used == a.num_used_blocks, "used count")
    _ensure(used + len(a._free) + len(policy) == size, "used + free + cached != pool")
