"""LRU-K eviction (O'Neil, O'Neil & Weikum, SIGMOD 1993), with CRP and RIP.

Terms of the paper, with ``t`` the ``now`` of the call (seconds, or any clock that never
decreases -- ``pdsim cache replay --clock references`` passes the access's index):

* ``HIST(p, i)`` -- time of the i-th most recent *uncorrelated* reference to page ``p``
  (``i = 1..K``); ``-inf`` where ``p`` has fewer than ``i`` such references (the paper's 0);
* ``LAST(p)`` -- time of the most recent reference, correlated or not;
* backward K-distance ``b(p) = t - HIST(p, K)`` (infinite for fewer than K references);
* CRP -- correlated reference period: a reference within CRP of ``LAST(p)`` is *correlated*
  (it only updates ``LAST``) and a page referenced within CRP of ``t`` may not be evicted;
* RIP -- retained information period: the history of an evicted page is kept while
  ``t - LAST(p) <= RIP`` and restored if the page comes back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register

_NEG_INF = float("-inf")


# A page's history is one flat tuple, replaced (never mutated) on every change:
#   (LAST, LIVE, HIST(p,1), REF(p,1), HIST(p,2), REF(p,2), ..., HIST(p,K), REF(p,K))
# REF(p,i) is the reference number that goes with HIST(p,i) (the policy numbers every
# insertion and uncorrelated reference 1, 2, 3, ...; they shift along with HIST; 0 where
# HIST is -inf), so that equal times still order pages by reference order. LIVE is REF(p,K)
# as it was when the page's current heap entry was pushed (-1: no entry, the page is young).
# Tuples of numbers drop out of the cyclic garbage collector's tracking, so keeping the
# history of every page ever seen (RIP = None) costs no collector time.
_LAST, _LIVE, _H1, _R1, _H2, _R2 = range(6)
Page = tuple[float, ...]


@register("lru-k")
class LRUKPolicy(EvictionPolicy):
    """LRU-K exactly as in the paper; knobs ``k``, ``crp`` and ``rip``.

    Parameters
    ----------
    k:
        history depth K (integer >= 1; default 2). ``k=1, crp=0`` is plain LRU.
    crp:
        correlated reference period in units of ``now`` (>= 0; default 0). ``crp=0`` makes
        every reference uncorrelated and every page eligible, also for several references at
        the same ``now``.
    rip:
        retained information period in units of ``now`` (>= 0), or ``None`` (default) to keep
        the history of evicted pages forever. With ``None`` the history grows with the number
        of distinct keys ever seen.

    Reference at time ``t`` to a resident page (``hit``): if ``t - LAST(p) > crp`` it is
    uncorrelated -- ``correl = LAST(p) - HIST(p,1)``, ``HIST(p,i) = HIST(p,i-1) + correl`` for
    ``i = K..2``, ``HIST(p,1) = LAST(p) = t``; otherwise it is correlated and only
    ``LAST(p) = t``. Miss (``insert``): a page with retained history (evicted within RIP)
    shifts it down (``HIST(p,i) = HIST(p,i-1)``, no correlation adjustment), any other page
    starts with ``HIST(p,2..K) = -inf``; then ``HIST(p,1) = LAST(p) = t``.

    **Reference order.** Every insertion and uncorrelated reference gets the next reference
    number; each ``HIST(p,i)`` carries the number of the reference it came from (shifted with
    it). Ranks compare ``(HIST(p,i), its number)``, so references at equal times are ordered
    as they were made. With ``crp = 0`` this makes the victims exactly those of the paper's
    clock that counts references (where times never tie), whatever ``now`` values are passed.

    Victim at time ``t``: among resident, unpinned pages *eligible* (``t - LAST(p) > crp``;
    every page when ``crp = 0``), the one with the largest backward K-distance, i.e. the
    smallest ``(HIST(p,K), number)``. Pages with fewer than K references come first, least
    recent ``(HIST(p,1), number)`` first (the paper's subsidiary LRU). For K = 2 the shift
    gives ``HIST(p,2) = LAST(p)``, stored exactly.

    **Fallback** when no unpinned resident page is eligible (every one was referenced within
    CRP of ``t``; never with ``crp = 0``): evict the unpinned page with the oldest ``LAST(p)``
    (ties: the older last uncorrelated reference), ignoring CRP, so that the cache can always
    make room. ``None`` only when every resident page is pinned.

    ``remove(..., evicted=False)`` (an invalidation) forgets the page's history; an eviction
    keeps it for RIP. Expired history is purged lazily (checked exactly on re-insertion).

    Cost: ``hit``/``insert`` O(log n); ``victim`` O(log n) amortised plus the pinned or
    in-CRP pages it has to skip; the fallback is O(n).
    """

    def __new__(cls, k: int = 2, crp: float = 0.0, rip: float | None = None) -> LRUKPolicy:
        """``LRUKPolicy(k=2, crp=0, rip=None)`` is an :class:`engine.policy.lruk2.LRU2Policy`
        (the same policy in flat per-key slots); other parameters build this class."""
        if cls is LRUKPolicy and type(k) is int and k == 2 and crp == 0 and rip is None:
            from engine.policy.lruk2 import LRU2Policy

            return object.__new__(LRU2Policy)
        return object.__new__(cls)

    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]:
        # copy and pickle call __new__ with the parameters, so the class chosen is the same
        return (), {"k": self.k, "crp": self.crp, "rip": self.rip}

    def __init__(self, k: int = 2, crp: float = 0.0, rip: float | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if not crp >= 0:
            raise ValueError(f"crp must be a number >= 0 (units of now), got {crp!r}")
        if rip is not None and not rip >= 0:
            raise ValueError(f"rip must be a number >= 0 (units of now) or None, got {rip!r}")
        self.k = k
        self._k2 = k == 2
        self.crp = float(crp)
        self.rip = None if rip is None else float(rip)
        # Invariants: every resident page is in ``_pages`` and in exactly one of
        #   ``_young`` -- HIST(p,K) == -inf -- ordered by REF(p,1), or
        #   the heap -- exactly one live entry of rank ``rk == page[_LIVE]`` with
        #   rank <= the page's current (HIST(p,K), REF(p,K)). While a page is resident these
        #   never decrease (correl >= 0), so the entry is a lower bound; ``victim`` refreshes
        #   an outdated entry (``rk != REF(p,K)``) when it reaches the top. Entries of pages
        #   no longer resident, or of an earlier residency (their ``rk`` is below the page's
        #   LIVE), are stale.
        # Heap entries: with crp > 0 tuples (HIST(p,K), REF(p,K), key); with crp == 0 the
        # plain int REF(p,K), its key in ``_owner`` -- every reference is then uncorrelated,
        # HIST(p,i) are the times of real references, and as ``now`` never decreases,
        # (HIST(p,K), REF(p,K)) orders exactly as REF(p,K) does (ints compare fastest).
        # Reference numbers are unique, so entries never compare keys.
        self._by_ref = not self.crp
        self._pages: dict[Key, Page] = {}
        self._young: OrderedDict[Key, None] = OrderedDict()
        self._heap: list[Any] = []
        self._owner: dict[int, Key] = {}
        # History of evicted pages, in eviction order (an OrderedDict for cheap purging from
        # the front when RIP is finite; a plain dict, faster, when it is never purged; then
        # a page keeps its entry while resident again, outdated, until its next eviction).
        self._retained: dict[Key, Page] = OrderedDict() if rip is not None else {}
        self._refs = 0
        self._blank: Page = (_NEG_INF, 0) * (k - 1)  # HIST(p,2..K) of a new page
        self._compact_at = 64  # heap length that triggers dropping stale entries
        if self._k2 and self._by_ref:
            self.hit = self._hit_k2  # type: ignore[method-assign]
            if rip is None:
                self.insert = self._insert_k2  # type: ignore[method-assign]

    # -- introspection -------------------------------------------------------------------
    def _known(self, key: Key) -> Page | None:
        page = self._pages.get(key)
        return self._retained.get(key) if page is None else page

    def history(self, key: Key) -> tuple[float, ...] | None:
        """``(HIST(p,1), ..., HIST(p,K))`` of a resident or retained page, else ``None``.

        Retained history older than RIP is reported as ``None`` only once purged; use
        :meth:`retained` for the exact rule.
        """
        page = self._known(key)
        return None if page is None else page[_H1::2]

    def history_refs(self, key: Key) -> tuple[int, ...] | None:
        """The reference numbers that go with :meth:`history` (0 where ``HIST`` is -inf)."""
        page = self._known(key)
        return None if page is None else tuple(int(r) for r in page[_R1::2])

    def last(self, key: Key) -> float | None:
        """``LAST(p)`` of a resident or retained page, else ``None``."""
        page = self._known(key)
        return None if page is None else page[_LAST]

    def retained(self, key: Key, now: float) -> bool:
        """Whether non-resident ``key`` has history that an insertion at ``now`` would reuse."""
        page = self._retained.get(key)
        return (
            page is not None
            and key not in self._pages
            and (self.rip is None or now - page[_LAST] <= self.rip)
        )

    # -- protocol ------------------------------------------------------------------------
    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        rip = self.rip
        if rip is not None:
            self._purge(now)
        retained = self._retained
        # RIP = None keeps the entry (overwritten on the next eviction): a cheaper get.
        old = retained.get(key) if rip is None else retained.pop(key, None)
        ref = self._refs = self._refs + 1
        if old is not None and (rip is None or now - old[_LAST] <= rip):
            # HIST(p,i) = HIST(p,i-1) for i = K..2 (with their numbers), then HIST(p,1) = now
            page: Page
            if self._k2:
                rk = old[_R1]
                page = (now, rk, now, ref, old[_H1], rk)
            else:
                tail = old[_H1:-2]
                if tail and tail[-2] == _NEG_INF:  # still fewer than K references
                    self._pages[key] = (now, -1, now, ref, *tail)
                    self._young[key] = None
                    return
                rk = tail[-1] if tail else ref
                page = (now, rk, now, ref, *tail)
        elif self.k == 1:
            rk = ref
            page = (now, rk, now, ref)
        else:
            self._pages[key] = (now, -1, now, ref, *self._blank)
            self._young[key] = None
            return
        self._pages[key] = page
        heap = self._heap
        if self._by_ref:
            heappush(heap, rk)
            self._owner[int(rk)] = key
        else:
            heappush(heap, (page[-2], rk, key))
        if len(heap) > self._compact_at:
            self._compact()

    def hit(self, key: Key, now: float) -> None:
        pages = self._pages
        page = pages[key]
        last = page[_LAST]
        crp = self.crp
        if crp and now - last <= crp:
            # correlated: only LAST changes, HIST (hence the order) does not
            pages[key] = (now, *page[_LIVE:])
            return
        ref = self._refs = self._refs + 1
        live = page[_LIVE]
        if self._k2:
            # K = 2: HIST(p,2) = HIST(p,1) + (LAST(p) - HIST(p,1)) = LAST(p), taken exactly.
            if live >= 0:  # the heap entry is now a lower bound; victim refreshes it lazily
                pages[key] = (now, live, now, ref, last, page[_R1])
                return
            rk = page[_R1]
            pages[key] = page = (now, rk, now, ref, last, rk)
        else:
            correl = last - page[_H1]
            tail: list[float] = []
            for i in range(_H1, len(page) - 2, 2):
                tail += (page[i] + correl, page[i + 1])
            if tail and tail[-2] == _NEG_INF:
                pages[key] = (now, -1, now, ref, *tail)
                self._young.move_to_end(key)  # REF(p,1) is the most recent: keeps the order
                return
            if live >= 0:
                pages[key] = (now, live, now, ref, *tail)
                return
            rk = tail[-1] if tail else ref
            pages[key] = page = (now, rk, now, ref, *tail)
        del self._young[key]  # was young: now it has K references
        if self._by_ref:
            heappush(self._heap, rk)
            self._owner[int(rk)] = key
        else:
            heappush(self._heap, (page[-2], rk, key))

    def _insert_k2(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        """``insert`` for K = 2, crp = 0 and RIP = None (bound as ``insert`` then): the same
        steps, no tests of K, CRP and RIP."""
        old = self._retained.get(key)
        ref = self._refs = self._refs + 1
        if old is None:
            self._pages[key] = (now, -1, now, ref, _NEG_INF, 0)
            self._young[key] = None
            return
        rk = old[_R1]
        self._pages[key] = (now, rk, now, ref, old[_H1], rk)
        heap = self._heap
        heappush(heap, rk)
        self._owner[rk] = key  # type: ignore[index]
        if len(heap) > self._compact_at:
            self._compact()

    def _hit_k2(self, key: Key, now: float) -> None:
        """``hit`` for K = 2 and crp = 0 (bound as ``hit`` then): the same steps, no tests
        of K and CRP."""
        pages = self._pages
        page = pages[key]
        ref = self._refs = self._refs + 1
        live = page[_LIVE]
        if live >= 0:
            pages[key] = (now, live, now, ref, page[_LAST], page[_R1])
            return
        rk = page[_R1]
        pages[key] = (now, rk, now, ref, page[_LAST], rk)
        del self._young[key]  # was young: now it has K references
        heappush(self._heap, rk)
        self._owner[int(rk)] = key

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        crp = self.crp
        young = self._young
        pages = self._pages
        if young:
            if not crp and not pinned:
                return next(iter(young))
            # With crp == 0 every page is eligible: now - LAST > -inf always holds.
            limit = crp if crp else _NEG_INF
            for key in young:
                if now - pages[key][_LAST] > limit and key not in pinned:
                    return key
        heap = self._heap
        if self._by_ref:
            return self._victim_by_ref(heap, pages, pinned)
        skipped: list[tuple[float, float, Key]] = []
        found: Key | None = None
        while heap:
            _, rk, key = heap[0]
            page = pages.get(key)
            if page is None or page[_LIVE] != rk:
                heappop(heap)  # stale: the page left (or this entry is of an earlier stay)
                continue
            if page[-1] != rk:  # outdated lower bound: re-rank with the current history
                rk = page[-1]
                pages[key] = (page[_LAST], rk, *page[_H1:])
                heapreplace(heap, (page[-2], rk, key))
                continue
            if now - page[_LAST] > crp and key not in pinned:
                found = key
                break
            skipped.append(heappop(heap))
        for entry in skipped:
            heappush(heap, entry)
        if found is not None:
            return found
        return self._fallback(pinned)

    def _victim_by_ref(
        self, heap: list[int], pages: dict[Key, Page], pinned: Container[Key]
    ) -> Key | None:
        """``victim`` among old pages when crp == 0 (every page eligible, int ranks)."""
        owner = self._owner
        skipped: list[int] = []
        found: Key | None = None
        while heap:
            rk = heap[0]
            key = owner[rk]
            page = pages.get(key)
            if page is None or page[_LIVE] != rk:
                heappop(heap)  # stale: the page left (or this entry is of an earlier stay)
                del owner[rk]
                continue
            current = int(page[-1])
            if current != rk:  # outdated lower bound: re-rank with the current history
                heapreplace(heap, current)
                del owner[rk]
                owner[current] = key
                pages[key] = (page[_LAST], current, *page[_H1:])
                continue
            if key not in pinned:
                found = key
                break
            skipped.append(heappop(heap))
        for rk in skipped:
            heappush(heap, rk)
        return found

    def evict(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        """``victim`` + ``remove(evicted=True)`` in one step (the same choice)."""
        young = self._young
        if self._by_ref and not pinned:
            pages = self._pages
            if young:
                key = young.popitem(last=False)[0]  # what victim returns first, removed
            else:
                found = self._victim_by_ref(self._heap, pages, ())
                if found is None:
                    return None
                key = found  # an old page: its heap entry is stale from now on
            self._retained[key] = pages.pop(key)
            if len(self._heap) > self._compact_at:
                self._compact()
            return key
        key = self.victim(now, pinned)
        if key is not None:
            self.remove(key, now, True)
        return key

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        page = self._pages.pop(key)  # its heap entry, if any, is stale from now on
        if page[_LIVE] < 0:
            del self._young[key]
        if evicted:
            self._retained[key] = page  # kept for RIP; _purge and insert enforce the period
        elif self.rip is None:
            self._retained.pop(key, None)  # an invalidation forgets the (outdated) entry too
        if len(self._heap) > self._compact_at:
            self._compact()

    def __contains__(self, key: object) -> bool:
        return key in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned and CRP is 0.

        Fewer-than-K pages first (least recent first), then by ascending
        ``(HIST(p,K), REF(p,K))``.
        """
        young = list(self._young)
        old = [(p[-2], p[-1], k) for k, p in self._pages.items() if p[_LIVE] >= 0]
        old.sort(key=lambda e: e[:2])
        return iter(young + [e[2] for e in old])

    # -- internals -----------------------------------------------------------------------
    def _compact(self) -> None:
        # Drop stale entries (pages invalidated or evicted without reaching the top).
        pages = self._pages
        heap = []
        if self._by_ref:
            owner = self._owner
            for rk in self._heap:
                page = pages.get(owner[rk])
                if page is not None and page[_LIVE] == rk:
                    heap.append(rk)
            self._owner = {rk: owner[rk] for rk in heap}
        else:
            for entry in self._heap:
                page = pages.get(entry[2])
                if page is not None and page[_LIVE] == entry[1]:
                    heap.append(entry)
        heapify(heap)
        self._heap = heap
        # Amortised O(1): the next compaction comes after at least len(heap) + 64 removals.
        self._compact_at = 2 * len(heap) + 64

    def _fallback(self, pinned: Container[Key]) -> Key | None:
        best: Key | None = None
        best_rank: tuple[float, float] | None = None
        for key, page in self._pages.items():
            if key in pinned:
                continue
            rank = (page[_LAST], page[_R1])
            if best_rank is None or rank < best_rank:
                best, best_rank = key, rank
        return best

    def _purge(self, now: float) -> None:
        # Entries are in eviction order, not LAST order: stop at the first one still within
        # RIP. Later expired ones stay until they reach the front; insert checks exactly.
        assert self.rip is not None
        retained = self._retained
        assert isinstance(retained, OrderedDict)
        while retained:
            key, page = next(iter(retained.items()))
            if now - page[_LAST] <= self.rip:
                break
            del retained[key]
