"""LRU-2's victim heap (:mod:`engine.policy.rankheap`): ``pop_top`` against ``top``.

The reference model is ``top`` (no skip) followed by popping its entry and clearing ``live``:
``pop_top`` must take the same page and leave the same heap and ``live`` behind. Heaps are
built as :class:`engine.policy.lruk2.LRU2Policy` builds them: each page's live entry ranks at
most its REF(p,2), other entries naming it are stale.
"""

from __future__ import annotations

from array import array
from heapq import heappop, heappush

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.policy.rankheap import SHIFT, pop_top, top


@st.composite
def heaps(draw: st.DrawFn) -> tuple[list[int], array[int], array[int]]:
    """``(heap, live, h2r)`` over up to 12 page ids, some old, with stale and outdated
    entries; ranks are unique."""
    n = draw(st.integers(1, 12))
    ranks = iter(draw(st.permutations(range(1, 4 * n + 1))))
    live = array("q", bytes(8 * n))
    h2r = array("q", bytes(8 * n))
    heap: list[int] = []
    for i in range(n):
        for _ in range(draw(st.integers(0, 2))):  # stale entries of earlier stays
            heappush(heap, next(ranks) << SHIFT | i)
        if draw(st.booleans()):  # old: one live entry, REF(p,2) at or above its rank
            rank = next(ranks)
            live[i] = rank
            h2r[i] = rank if draw(st.booleans()) else next(ranks) + 4 * n
            heappush(heap, rank << SHIFT | i)
    return heap, live, h2r


@settings(max_examples=300, deadline=None)
@given(case=heaps())
def test_pop_top_takes_what_top_finds(case: tuple[list[int], array[int], array[int]]) -> None:
    heap, live, h2r = case
    ref_heap, ref_live, ref_h2r = list(heap), array("q", live), array("q", h2r)
    found = top(ref_heap, ref_live, ref_h2r)
    if found is None:
        with pytest.raises(IndexError):
            pop_top(heap, live, h2r)
        return
    heappop(ref_heap)
    ref_live[found] = 0
    assert pop_top(heap, live, h2r) == found
    assert (heap, live, h2r) == (ref_heap, ref_live, ref_h2r)
