"""Least-recently-used eviction: the victim is the resident key referenced longest ago."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register


@register("lru")
class LRUPolicy(EvictionPolicy):
    """Classic LRU over an ordered dict (oldest reference first).

    Invariant: ``self._order`` holds every resident key exactly once, ordered by the time of
    its last reference, oldest first.
    """

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()
        #: ``touch(key)`` is ``hit(key, now)`` for any ``now`` (LRU ignores the time): the
        #: replay loop of :meth:`engine.cache.TierCache.access_many` calls it directly.
        self.touch = self._order.move_to_end

    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        self._order[key] = None

    def hit(self, key: Key, now: float) -> None:
        self._order.move_to_end(key)

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for key in self._order:
            if key not in pinned:
                return key
        return None

    def evict(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        """``victim`` + ``remove`` in one step: with nothing pinned, pop the oldest key."""
        if pinned:
            return super().evict(now, pinned)
        return self._order.popitem(last=False)[0] if self._order else None

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        del self._order[key]

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._order)
