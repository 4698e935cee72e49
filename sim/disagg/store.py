"""The KV store tier behind HBM (Mooncake-style): prompt KV blocks in host memory, SSD and a
remote tier, each an :class:`engine.cache.TierCache` with the scenario's eviction policy.

A block is one trace ``hash_ids`` entry: ``block_tokens`` tokens of one model's KV, ``size =
block_tokens * kv_bytes_per_token`` bytes, keyed ``model << 40 | hash_id``. New blocks enter
the top tier; a tier's victim moves one tier down (the last tier drops it). A lookup walks a
request's blocks in order and stops at the first block no tier holds (a prefix: KV after a
missing block was computed from it and cannot be reused). Every block of a looked-up prompt
counts as one access of the store; a block of the found prefix counts as a hit of the tier
that held it (so a tier's hit rate is the share of prompt blocks it served).

Invariants: a key lives in at most one tier; ``sum(hits.values()) <= accesses``.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.cache import EvictCallback, TierCache

TIER_NAMES: tuple[str, ...] = ("host", "ssd", "remote")


class KvStore:
    """See the module docstring. ``capacities`` and ``bandwidths`` are per tier, in
    :data:`TIER_NAMES` order; a tier of capacity 0 is absent."""

    def __init__(
        self,
        capacities: Sequence[int],
        bandwidths: Sequence[float],
        block_tokens: int,
        policy: str = "lru",
    ) -> None:
        self.block_tokens = block_tokens
        self.names: list[str] = []
        self.tiers: list[TierCache] = []
        self.bandwidth: list[float] = []
        for name, cap, bw in zip(TIER_NAMES, capacities, bandwidths, strict=True):
            if cap > 0:
                self.names.append(name)
                self.bandwidth.append(float(bw))
                self.tiers.append(TierCache(capacity=int(cap), policy=policy, name=name))
        for upper, lower in zip(self.tiers, self.tiers[1:], strict=False):
            upper.on_evict = self._demoter(lower)
        self._now = 0.0
        #: blocks looked up, and hits per tier name
        self.accesses = 0
        self.hits: dict[str, int] = dict.fromkeys(TIER_NAMES, 0)

    def _demoter(self, lower: TierCache) -> EvictCallback:
        def demote(key: object, size: int, color: str | None) -> None:
            if size <= lower.capacity:
                lower.admit(key, size, self._now)

        return demote

    @staticmethod
    def key(model: int, hash_id: int) -> int:
        """The store key of one block of ``model``."""
        return (model << 40) | hash_id

    def lookup(self, model: int, blocks: Sequence[int], now: float) -> list[int]:
        """Blocks of ``blocks`` found as a prefix, per tier (a list in ``names`` order). Every
        block counts as an access."""
        found = [0] * len(self.tiers)
        self.accesses += len(blocks)
        for h in blocks:
            k = self.key(model, h)
            for i, tier in enumerate(self.tiers):
                if k in tier:
                    tier.lookup(k, now)
                    found[i] += 1
                    self.hits[self.names[i]] += 1
                    break
            else:
                return found
        return found

    def admit(self, model: int, blocks: Sequence[int], block_bytes: int, now: float) -> None:
        """Keep ``blocks`` (each ``block_bytes``) in the top tier; a block held lower moves up."""
        if not self.tiers:
            return
        self._now = now
        top = self.tiers[0]
        if block_bytes > top.capacity:
            return
        for h in blocks:
            k = self.key(model, h)
            if k in top:
                top.lookup(k, now)
                continue
            for tier in self.tiers[1:]:
                if k in tier:
                    tier.remove(k, now)
                    break
            top.admit(k, block_bytes, now)

    def load_seconds(self, found: Sequence[int], block_bytes: int) -> float:
        """Seconds to read the ``found`` blocks (per tier) into a replica, tier by tier."""
        return sum(n * block_bytes / bw for n, bw in zip(found, self.bandwidth, strict=True))

    def hit_rates(self) -> dict[str, float | None]:
        """Hits / accesses per tier, and ``total``; ``None`` with no access."""
        a = self.accesses
        out: dict[str, float | None] = {n: (self.hits[n] / a if a else None) for n in TIER_NAMES}
        out["total"] = sum(self.hits.values()) / a if a else None
        return out
