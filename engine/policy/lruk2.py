"""LRU-2 with CRP 0 and unbounded RIP: :class:`engine.policy.lruk.LRUKPolicy`'s default, kept
lean.

``LRUKPolicy(k=2, crp=0, rip=None)`` (what ``make_policy("lru-k")`` builds) returns an
instance of :class:`LRU2Policy`: the same rules, terms and victims as the general class (see
its docstring). With CRP 0 every reference is uncorrelated, so ``HIST(p,1) = LAST(p)``, and
with RIP unbounded the history of every key seen stays (until invalidated). A key's history
is one 4-tuple ``(HIST(p,1), REF(p,1), HIST(p,2), REF(p,2))`` (``-inf``/``0`` for one
reference); a hit replaces it with one tuple build and one dict store, touching nothing else
unless the page gets its second reference. ``hit``, ``insert`` and ``evict`` are closures
over the structures (no attribute loads on the hot path).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator
from heapq import heapify, heappop, heappush, heapreplace
from itertools import count

from engine.policy.base import Key
from engine.policy.lruk import LRUKPolicy

_NEG_INF = float("-inf")
Hist = tuple[float, int, float, int]


class LRU2Policy(LRUKPolicy):
    """LRU-K with ``k = 2``, ``crp = 0``, ``rip = None``; built by ``LRUKPolicy(...)``.

    Invariants: ``_hist`` holds the history of every resident or retained key. A resident
    page is either *young* (``REF(p,2) == 0``; key in ``_young``, ordered by REF(p,1)) or
    *old* (key in ``_live`` with the rank of its one live heap entry, an int whose key is
    ``_owner[rank]``,
    ``rank <= REF(p,2)``: hits raise REF(p,2) without touching the heap, and the victim
    search refreshes an outdated entry when it reaches the top). Heap entries whose rank
    differs from ``_live[key]`` (or whose key is not there) are stale. Reference numbers are
    unique, so ints identify entries, and ordering by REF(p,2) is ordering by
    ``(HIST(p,2), REF(p,2))`` as ``now`` never decreases.

    Cost: ``hit`` and ``insert`` O(1) (plus a heap push when a page becomes old);
    ``victim``/``evict`` amortised O(log n) plus the pinned pages skipped.
    """

    def __init__(self, k: int = 2, crp: float = 0.0, rip: float | None = None) -> None:
        super().__init__(k, crp, rip)
        if k != 2 or crp or rip is not None:
            raise ValueError("LRU2Policy is LRU-K with k=2, crp=0, rip=None only")
        self._hist: dict[Key, Hist] = {}
        self._young: OrderedDict[Key, None] = OrderedDict()
        self._live: dict[Key, int] = {}
        self._heap: list[int] = []
        self._owner: dict[int, Key] = {}  # rank of a heap entry -> its key
        self._compact_at = 64
        self._bind()  # replaces the base class's own fast paths

    def _bind(self) -> None:
        """Bind ``hit``, ``insert`` and ``evict`` as closures over the structures; they
        share one reference counter."""
        hist, young, live, heap, owner = (
            self._hist,
            self._young,
            self._live,
            self._heap,
            self._owner,
        )
        next_ref = count(1).__next__
        pop_young = young.popitem
        top = self._top
        general_evict = super().evict

        def insert(
            key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
        ) -> None:
            """A new page starts young; a retained one shifts its history and is old."""
            old = hist.get(key)
            if old is None:
                hist[key] = (now, next_ref(), _NEG_INF, 0)
                young[key] = None
                return
            rk = old[1]
            hist[key] = (now, next_ref(), old[0], rk)
            live[key] = rk
            heappush(heap, rk)
            owner[rk] = key
            if len(heap) > self._compact_at:
                self._compact()

        def hit(key: Key, now: float) -> None:
            """HIST(p,2) = HIST(p,1), HIST(p,1) = now (their numbers likewise)."""
            old = hist[key]
            hist[key] = (now, next_ref(), old[0], old[1])
            if not old[3]:  # its second reference: the page becomes old
                del young[key]
                rk = live[key] = old[1]
                heappush(heap, rk)
                owner[rk] = key

        def evict(now: float, pinned: Container[Key] = ()) -> Key | None:
            """``victim`` + ``remove(evicted=True)`` in one step (the same choice)."""
            if pinned:
                return general_evict(now, pinned)
            if young:
                return pop_young(False)[0]  # the least recent young page
            key = top(())
            if key is not None:
                heappop(heap)  # the victim's entry is on top: it goes with the page
                del owner[live.pop(key)]
            return key

        self.insert = insert  # type: ignore[method-assign]
        self.hit = hit  # type: ignore[method-assign]
        self.evict = evict  # type: ignore[method-assign]

    # -- introspection -------------------------------------------------------------------
    def history(self, key: Key) -> tuple[float, ...] | None:
        h = self._hist.get(key)
        return None if h is None else (h[0], h[2])

    def history_refs(self, key: Key) -> tuple[int, ...] | None:
        h = self._hist.get(key)
        return None if h is None else (h[1], h[3])

    def last(self, key: Key) -> float | None:
        h = self._hist.get(key)
        return None if h is None else h[0]

    def retained(self, key: Key, now: float) -> bool:
        return key in self._hist and key not in self

    # -- protocol ------------------------------------------------------------------------
    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for key in self._young:
            if not pinned or key not in pinned:
                return key
        return self._top(pinned)

    def _top(self, pinned: Container[Key]) -> Key | None:
        """The old unpinned page of smallest REF(p,2) (its entry left on top of the heap when
        nothing is pinned), or ``None``."""
        heap, live, hist, owner = self._heap, self._live, self._hist, self._owner
        skipped: list[int] = []
        found: Key | None = None
        while heap:
            rk = heap[0]
            key = owner[rk]
            if live.get(key) != rk:
                heappop(heap)  # stale: the page left (or the entry is of an earlier stay)
                del owner[rk]
                continue
            current = hist[key][3]
            if current != rk:  # outdated lower bound: re-rank with the current history
                live[key] = current
                heapreplace(heap, current)
                del owner[rk]
                owner[current] = key
                continue
            if not pinned or key not in pinned:
                found = key
                break
            skipped.append(heappop(heap))
        for entry in skipped:
            heappush(heap, entry)
        return found

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        if key in self._young:
            del self._young[key]
        else:
            del self._live[key]  # KeyError when not resident; its heap entry is stale now
        if not evicted:  # an invalidation forgets the history
            del self._hist[key]
        if len(self._heap) > self._compact_at:
            self._compact()

    def __contains__(self, key: object) -> bool:
        return key in self._live or key in self._young

    def __len__(self) -> int:
        return len(self._live) + len(self._young)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned: young pages least recent
        first, then by ascending ``(HIST(p,2), REF(p,2))``."""
        hist = self._hist
        old = sorted(self._live, key=lambda k: (hist[k][2], hist[k][3]))
        return iter([*self._young, *old])

    # -- internals -----------------------------------------------------------------------
    def _compact(self) -> None:
        # Drop stale entries; the next compaction comes after >= len(heap) + 64 pushes.
        live, owner = self._live, self._owner
        heap = []
        for rk in self._heap:
            if live.get(owner[rk]) == rk:
                heap.append(rk)
            else:
                del owner[rk]
        heapify(heap)
        self._heap[:] = heap  # in place: the closures of _bind hold this list
        self._compact_at = 2 * len(heap) + 64
