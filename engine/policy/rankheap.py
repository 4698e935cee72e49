"""LRU-2's victim heap: ints ``rank << SHIFT | id`` with lazy deletion.

An old page ``id`` of :class:`engine.policy.lruk2.LRU2Policy` has one *live* entry whose rank
is ``live[id]`` (0 when the page is not old and resident) and at most ``REF(p,2)``
(``h2r[id]``); other entries naming it are stale. Ranks are unique reference numbers, so
entries order by rank alone, and an id below ``2**SHIFT`` fits in the low bits.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from heapq import heapify, heappop, heappush, heapreplace

#: a heap entry is ``rank << SHIFT | id``
SHIFT = 32
MASK = (1 << SHIFT) - 1


def top(
    heap: list[int],
    live: array[int],
    h2r: array[int],
    skip: Callable[[int], bool] | None = None,
) -> int | None:
    """The id of the old page of smallest REF(p,2) for which ``skip(id)`` is false (its
    entry left on top of the heap when ``skip`` is ``None``), or ``None``; drops stale
    entries and refreshes outdated ones it meets on top."""
    skipped: list[int] = []
    found: int | None = None
    while heap:
        e = heap[0]
        i = e & MASK
        rk = e >> SHIFT
        if live[i] != rk:
            heappop(heap)  # stale: the page left (or the entry is of an earlier stay)
            continue
        current = h2r[i]
        if current != rk:  # outdated lower bound: re-rank with the current history
            live[i] = current
            heapreplace(heap, current << SHIFT | i)
            continue
        if skip is None or not skip(i):
            found = i
            break
        skipped.append(heappop(heap))
    for entry in skipped:
        heappush(heap, entry)
    return found


def pop_top(heap: list[int], live: array[int], h2r: array[int]) -> int:
    """Take the old page of smallest REF(p,2) off the heap: its id, with its entry popped and
    ``live[id]`` set to 0. Drops stale entries and refreshes outdated ones it meets on top
    (as :func:`top` does); raises ``IndexError`` when no page is old."""
    while True:
        e = heap[0]
        i = e & MASK
        rk = e >> SHIFT
        if live[i] != rk:
            heappop(heap)  # stale
            continue
        current = h2r[i]
        if current != rk:  # outdated: re-rank
            live[i] = current
            heapreplace(heap, current << SHIFT | i)
            continue
        heappop(heap)
        live[i] = 0
        return i


def compact(heap: list[int], live: array[int], compact_at: list[int]) -> None:
    """Drop stale entries from ``heap`` (in place: the closures hold the list); the next
    compaction comes after >= len(heap) + 64 pushes."""
    kept = [e for e in heap if live[e & MASK] == e >> SHIFT]
    heapify(kept)
    heap[:] = kept
    compact_at[0] = 2 * len(kept) + 64
