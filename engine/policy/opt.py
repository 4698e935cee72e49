"""Belady's MIN / OPT (offline): evict the key whose next use lies farthest in the future."""

from __future__ import annotations

import heapq
from collections.abc import Container, Hashable, Iterator, Sequence

from engine.errors import InputError
from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register


@register("opt")
class BeladyPolicy(EvictionPolicy):
    """Offline reference policy: the classic furthest-next-use rule (Belady 1966).

    ``future`` is the whole reference string the cache will see, one key per access, in
    order. Each ``insert`` or ``hit`` is the next reference of that string; a key that does
    not match raises :class:`engine.errors.InputError` naming the position, the expected and
    the received key (with ``strict=False`` the policy instead skips ahead to the next
    occurrence of the received key, treating the skipped references as accesses the cache
    refused, e.g. objects larger than the cache). :meth:`skip` announces refused references
    explicitly. Referencing past the end of ``future`` is an ``InputError`` too.

    Victim: the resident unpinned key whose next reference is farthest away; keys never
    referenced again count as infinitely far, and ties among them go to the key referenced
    longest ago. ``now`` is ignored (positions in ``future`` are the clock).

    Optimal (fewest misses) for unit-size objects under demand caching. For objects of
    different sizes it is only the furthest-next-use heuristic, not the byte- or
    object-optimal offline policy (that problem is NP-hard).

    Cost: ``O(len(future))`` memory and one backward pass at construction; ``hit``/``insert``
    O(log n); ``victim`` O(log n) amortised plus the pinned keys it skips.
    """

    def __init__(self, future: Sequence[Hashable], strict: bool = True) -> None:
        self._future: list[Hashable] = list(future)
        n = len(self._future)
        self._never = n  # "next use" of a key never referenced again
        # next_use[i]: index of the next reference to future[i] after i, or n (never).
        nxt = [n] * n
        seen: dict[Hashable, int] = {}
        for i in range(n - 1, -1, -1):
            key = self._future[i]
            nxt[i] = seen.get(key, n)
            seen[key] = i
        self._next = nxt
        self._first = seen  # first reference of every key (used when strict=False)
        self.strict = strict
        self._pos = 0  # index in future of the next reference
        # Invariants: ``_resident[key]`` is the position of the latest reference to resident
        # ``key``; each resident key has exactly one live heap entry (-next_use, pos, key)
        # with ``pos == _resident[key]`` and ``next_use == next_use[pos]``; other entries are
        # stale. Positions are unique, so heap tuples never compare keys.
        self._resident: dict[Key, int] = {}
        self._heap: list[tuple[int, int, Key]] = []
        self._compact_at = 64  # heap length that triggers dropping stale entries

    @property
    def position(self) -> int:
        """Number of references consumed so far."""
        return self._pos

    def skip(self, count: int = 1) -> None:
        """Consume ``count`` references the cache never passed on (refused accesses)."""
        if count < 0 or self._pos + count > len(self._future):
            raise InputError(
                f"opt: cannot skip {count} reference(s) at position {self._pos} of "
                f"{len(self._future)}"
            )
        self._pos += count

    def _reference(self, key: Key) -> int:
        """Consume the reference to ``key``; return its position in ``future``."""
        pos = self._pos
        future = self._future
        if pos >= len(future) or future[pos] != key:
            if self.strict or pos >= len(future):
                expected = repr(future[pos]) if pos < len(future) else "end of the string"
                raise InputError(
                    f"opt: reference {pos} is {key!r} but the future given to the policy "
                    f"has {expected} there (every access must be replayed in order)"
                )
            pos = self._next_occurrence(key, pos)
        self._pos = pos + 1
        return pos

    def _next_occurrence(self, key: Key, pos: int) -> int:
        j = self._first.get(key, self._never)
        nxt = self._next
        while j < pos:
            j = nxt[j]
        if j >= self._never:
            raise InputError(f"opt: key {key!r} is not referenced at or after position {pos}")
        return j

    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        pos = self._reference(key)
        self._resident[key] = pos
        self._push(key, pos)

    def hit(self, key: Key, now: float) -> None:
        if key not in self._resident:
            raise KeyError(f"opt: hit on non-resident key {key!r}")
        pos = self._pos
        if pos < self._never and self._future[pos] == key:  # fast path of _reference
            self._pos = pos + 1
        else:
            pos = self._reference(key)
        self._resident[key] = pos  # the previous heap entry of key is stale from now on
        self._push(key, pos)

    def _push(self, key: Key, pos: int) -> None:
        heap = self._heap
        heapq.heappush(heap, (-self._next[pos], pos, key))
        if len(heap) > self._compact_at:
            resident = self._resident
            heap = [e for e in heap if resident.get(e[2]) == e[1]]
            heapq.heapify(heap)
            self._heap = heap
            # Amortised O(1): at least 3 live sizes of pushes until the next compaction.
            self._compact_at = 4 * len(heap) + 64

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        heap = self._heap
        resident = self._resident
        skipped: list[tuple[int, int, Key]] = []
        found: Key | None = None
        while heap:
            entry = heap[0]
            key = entry[2]
            if resident.get(key) != entry[1]:
                heapq.heappop(heap)  # stale
                continue
            if key not in pinned:
                found = key
                break
            skipped.append(heapq.heappop(heap))
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        del self._resident[key]

    def __contains__(self, key: object) -> bool:
        return key in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys, farthest next use first (the eviction order)."""
        nxt, resident = self._next, self._resident
        return iter(sorted(resident, key=lambda k: (-nxt[resident[k]], resident[k])))
