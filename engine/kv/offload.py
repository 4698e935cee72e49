"""Offload of evicted KV blocks to lower tiers (pinned host memory, then SSD), keyed by content.

Each lower tier is an :class:`engine.cache.TierCache` keyed by block key (see
:mod:`engine.kv.prefix`) with objects of one block's size. The chain is *exclusive*: a key is
resident in at most one tier at a time.

* :meth:`OffloadChain.offer` puts a block evicted from the device pool into tier 0; a tier's
  own evictions cascade down (``on_evict`` of tier ``i`` admits into tier ``i+1``); evictions
  from the last tier are dropped (the content must be recomputed).
* :meth:`OffloadChain.take` removes a key from the tier holding it, for a *load-back* into the
  device pool (the allocator counts it as a prefix hit that costs a transfer instead of
  recomputation).

Byte counters per tier (``moved``): ``bytes_in`` written into the tier, ``bytes_out`` read out
of it (demoted to the next tier, dropped, or loaded back), ``bytes_loaded_back`` the part of
``bytes_out`` that went back up to the device, ``bytes_dropped`` the part lost from the last
tier. Invariant: per tier ``bytes_in - bytes_out == bytes resident`` (``TierCache.used``).

The chain takes over the tiers' ``on_evict`` callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.cache import TierCache
from engine.errors import InputError, ObjectTooLargeError
from engine.kv.prefix import BlockKey

_COUNTERS = ("bytes_in", "bytes_out", "bytes_loaded_back", "bytes_dropped", "blocks_loaded_back")


def make_offload_tiers(
    host_bytes: int | None = None, ssd_bytes: int | None = None, policy: str = "lru"
) -> list[TierCache]:
    """Host then SSD tiers (whichever sizes are given), evicting only to make room."""
    tiers = []
    for name, cap in (("host", host_bytes), ("ssd", ssd_bytes)):
        if cap is not None:
            if cap <= 0:
                raise InputError(f"{name} offload capacity must be > 0 bytes, got {cap}")
            tiers.append(TierCache(cap, policy, high_watermark=1.0, low_watermark=1.0, name=name))
    return tiers


class OffloadChain:
    """Exclusive chain of lower tiers for evicted KV blocks; see the module docstring."""

    def __init__(self, tiers: Sequence[TierCache]) -> None:
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise InputError(f"offload tier names must be distinct, got {names}")
        self.tiers: list[TierCache] = list(tiers)
        self._now = 0.0  # time of the offer in progress, for cascaded admissions
        self.moved: dict[str, dict[str, int]] = {n: dict.fromkeys(_COUNTERS, 0) for n in names}
        for i, tier in enumerate(self.tiers):
            tier.on_evict = self._cascade_from(i)

    def _cascade_from(self, i: int) -> Callable[[BlockKey, int, str | None], None]:
        def on_evict(key: BlockKey, size: int, color: str | None) -> None:
            self.moved[self.tiers[i].name]["bytes_out"] += size
            if i + 1 < len(self.tiers):
                self._admit(i + 1, key, size, self._now)
            else:
                self.moved[self.tiers[i].name]["bytes_dropped"] += size

        return on_evict

    def _admit(self, i: int, key: BlockKey, size: int, now: float) -> int | None:
        tier = self.tiers[i]
        try:
            ok = tier.admit(key, size, now)
        except ObjectTooLargeError:
            ok = False
        if ok:
            self.moved[tier.name]["bytes_in"] += size
            return i
        if i + 1 < len(self.tiers):  # does not fit here: try the next tier down
            return self._admit(i + 1, key, size, now)
        return None

    def offer(self, key: BlockKey, size: int, now: float) -> int | None:
        """Store an evicted block's ``key`` in the first tier that takes it; its index or None."""
        if not self.tiers:
            return None
        self.discard(key, now)
        self._now = now
        return self._admit(0, key, size, now)

    def locate(self, key: BlockKey) -> int | None:
        """Index of the tier holding ``key``, or None."""
        for i, tier in enumerate(self.tiers):
            if key in tier:
                return i
        return None

    def take(self, key: BlockKey, now: float) -> int | None:
        """Remove ``key`` for a load-back; return the tier index it came from, or None."""
        i = self.locate(key)
        if i is None:
            return None
        tier = self.tiers[i]
        size = tier.size_of(key)
        tier.remove(key, now)
        m = self.moved[tier.name]
        m["bytes_out"] += size
        m["bytes_loaded_back"] += size
        m["blocks_loaded_back"] += 1
        return i

    def discard(self, key: BlockKey, now: float) -> None:
        """Drop a stale copy of ``key`` (its content now lives in the device pool)."""
        i = self.locate(key)
        if i is not None:
            tier = self.tiers[i]
            self.moved[tier.name]["bytes_out"] += tier.size_of(key)
            self.moved[tier.name]["bytes_dropped"] += tier.size_of(key)
            tier.remove(key, now)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes currently held per tier."""
        return {t.name: t.used for t in self.tiers}
