"""First-in first-out eviction: the victim is the resident key admitted longest ago."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register


@register("fifo")
class FIFOPolicy(EvictionPolicy):
    """FIFO: evict in admission order; hits do not reorder; no knobs.

    Pinned keys are skipped and keep their place in the queue. A key that is removed and
    admitted again joins the back of the queue.

    Invariant: ``self._queue`` holds every resident key exactly once, in admission order.
    """

    def __init__(self) -> None:
        self._queue: OrderedDict[Key, None] = OrderedDict()

    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        self._queue[key] = None

    def hit(self, key: Key, now: float) -> None:
        if key not in self._queue:
            raise KeyError(f"fifo: hit on non-resident key {key!r}")

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for key in self._queue:
            if key not in pinned:
                return key
        return None

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        del self._queue[key]

    def __contains__(self, key: object) -> bool:
        return key in self._queue

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys, oldest admission first."""
        return iter(self._queue)
