"""LRU-K eviction (O'Neil, O'Neil & Weikum, SIGMOD 1993), with CRP and RIP.

Terms of the paper, with ``t`` the ``now`` of the call (seconds):

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

import heapq
from collections import OrderedDict
from collections.abc import Container, Iterator

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register

_NEG_INF = float("-inf")


class _Page:
    """History of one page. ``hist[i]`` is the paper's ``HIST(p, i+1)``."""

    __slots__ = ("hist", "last", "ref", "seq")

    def __init__(self, hist: list[float], last: float, ref: int, seq: int) -> None:
        self.hist = hist
        self.last = last
        self.ref = ref  # number of the last uncorrelated reference (global, increasing)
        self.seq = seq  # number of the insertion that began the current residency


@register("lru-k")
class LRUKPolicy(EvictionPolicy):
    """LRU-K exactly as in the paper; knobs ``k``, ``crp`` and ``rip``.

    Parameters
    ----------
    k:
        history depth K (integer >= 1; default 2). ``k=1, crp=0`` is plain LRU.
    crp:
        correlated reference period in seconds (>= 0; default 0). ``crp=0`` makes every
        reference uncorrelated and every page eligible, also for several references at the
        same ``now`` (the paper counts time in references, where ``t - LAST(p) > 0`` always
        holds).
    rip:
        retained information period in seconds (>= 0), or ``None`` (default) to keep the
        history of evicted pages forever. With ``None`` the history grows with the number of
        distinct keys ever seen.

    Reference at time ``t`` to a resident page (``hit``): if ``t - LAST(p) > crp`` it is
    uncorrelated -- ``correl = LAST(p) - HIST(p,1)``, ``HIST(p,i) = HIST(p,i-1) + correl`` for
    ``i = K..2``, ``HIST(p,1) = LAST(p) = t``; otherwise it is correlated and only
    ``LAST(p) = t``. Miss (``insert``): a page with retained history (evicted within RIP)
    shifts it down (``HIST(p,i) = HIST(p,i-1)``, no correlation adjustment), any other page
    starts with ``HIST(p,2..K) = -inf``; then ``HIST(p,1) = LAST(p) = t``.

    Victim at time ``t``: among resident, unpinned pages *eligible* (``t - LAST(p) > crp``;
    every page when ``crp = 0``), the one with the largest backward K-distance, i.e. the
    smallest ``HIST(p,K)``. Pages with fewer than K references come first, least recent
    ``HIST(p,1)`` first; ties among equal ``HIST(p,K)`` break by older ``HIST(p,1)``, then
    by the order of the pages' last uncorrelated references (so equal times still break as
    LRU would). For K = 2 the shift gives ``HIST(p,2) = LAST(p)``, stored exactly.

    **Fallback** when no unpinned resident page is eligible (every one was referenced within
    CRP of ``t``; never with ``crp = 0``): evict the unpinned page with the oldest ``LAST(p)``
    (ties: earlier insertion), ignoring CRP, so that the cache can always make room. ``None``
    only when every resident page is pinned.

    ``remove(..., evicted=False)`` (an invalidation) forgets the page's history; an eviction
    keeps it for RIP. Expired history is purged lazily (checked exactly on re-insertion).

    Cost: ``hit``/``insert`` O(log n); ``victim`` O(log n) amortised plus the pinned or
    in-CRP pages it has to skip; the fallback is O(n).
    """

    def __init__(self, k: int = 2, crp: float = 0.0, rip: float | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if not crp >= 0:
            raise ValueError(f"crp must be a number of seconds >= 0, got {crp!r}")
        if rip is not None and not rip >= 0:
            raise ValueError(f"rip must be a number of seconds >= 0 or None, got {rip!r}")
        self.k = k
        self._k2 = k == 2
        self.crp = float(crp)
        self.rip = None if rip is None else float(rip)
        # Invariants: every resident page is in ``_pages`` and in exactly one of
        #   ``_young`` -- HIST(p,K) == -inf -- ordered by (HIST(p,1), ref) ascending, or
        #   ``_heap`` -- exactly one live entry (hk, h1, ref, seq, key) with
        #   ``seq == page.seq`` and (hk, h1, ref) <= the page's current
        #   (HIST(p,K), HIST(p,1), ref). While a page is resident these never decrease
        #   (correl >= 0), so the entry is a lower bound; ``victim`` refreshes an outdated
        #   entry (``ref != page.ref``) when it reaches the top. Entries of pages no longer
        #   resident (or resident again under a new seq) are stale.
        # ``ref`` values are unique, so heap tuples never compare keys.
        self._pages: dict[Key, _Page] = {}
        self._young: OrderedDict[Key, _Page] = OrderedDict()
        self._heap: list[tuple[float, float, int, int, Key]] = []
        # History of evicted pages, in eviction order (an OrderedDict for cheap purging from
        # the front when RIP is finite; a plain dict, faster, when it is never purged).
        self._retained: dict[Key, _Page] = OrderedDict() if rip is not None else {}
        self._seq = 0
        self._refs = 0
        self._compact_at = 64  # heap length that triggers dropping stale entries

    # -- introspection -------------------------------------------------------------------
    def history(self, key: Key) -> tuple[float, ...] | None:
        """``(HIST(p,1), ..., HIST(p,K))`` of a resident or retained page, else ``None``.

        Retained history older than RIP is reported as ``None`` only once purged; use
        :meth:`retained` for the exact rule.
        """
        page = self._pages.get(key) or self._retained.get(key)
        return None if page is None else tuple(page.hist)

    def last(self, key: Key) -> float | None:
        """``LAST(p)`` of a resident or retained page, else ``None``."""
        page = self._pages.get(key) or self._retained.get(key)
        return None if page is None else page.last

    def retained(self, key: Key, now: float) -> bool:
        """Whether non-resident ``key`` has history that an insertion at ``now`` would reuse."""
        page = self._retained.get(key)
        return page is not None and (self.rip is None or now - page.last <= self.rip)

    # -- protocol ------------------------------------------------------------------------
    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        if self.rip is not None:
            self._purge(now)
        page = self._retained.pop(key, None)
        self._seq += 1
        self._refs += 1
        if page is not None and (self.rip is None or now - page.last <= self.rip):
            hist = page.hist
            hist.pop()  # HIST(p,i) = HIST(p,i-1) for i = K..2
            hist.insert(0, now)
            page.last = now
            page.ref = self._refs
            page.seq = self._seq
        else:
            hist = [now] + [_NEG_INF] * (self.k - 1)
            page = _Page(hist, now, self._refs, self._seq)
        self._pages[key] = page
        if hist[-1] == _NEG_INF:
            self._young[key] = page
        else:
            self._push(key, page)

    def hit(self, key: Key, now: float) -> None:
        page = self._pages[key]
        last = page.last
        page.last = now
        if self.crp and now - last <= self.crp:
            return  # correlated: only LAST changes, HIST (hence the order) does not
        self._refs = page.ref = self._refs + 1
        hist = page.hist
        was_young = hist[-1] == _NEG_INF
        if self._k2:
            # K = 2: HIST(p,2) = HIST(p,1) + (LAST(p) - HIST(p,1)) = LAST(p), taken exactly.
            hist[1] = last
            hist[0] = now
        else:
            correl = last - hist[0]
            for i in range(self.k - 1, 0, -1):
                hist[i] = hist[i - 1] + correl
            hist[0] = now
        if hist[-1] == _NEG_INF:
            self._young.move_to_end(key)  # HIST(p,1) is now the largest: keeps the order
        elif was_young:
            del self._young[key]
            self._push(key, page)
        # else: the page's heap entry is now a lower bound; victim refreshes it lazily.

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        crp = self.crp
        # With crp == 0 every page is eligible: now - LAST > -inf always holds.
        limit = crp if crp else _NEG_INF
        if self._young:
            for key, page in self._young.items():
                if now - page.last > limit and key not in pinned:
                    return key
        heap = self._heap
        pages = self._pages
        heappop = heapq.heappop
        skipped: list[tuple[float, float, int, int, Key]] = []
        found: Key | None = None
        while heap:
            _, _, ref, seq, key = heap[0]
            entry_page = pages.get(key)
            if entry_page is None or entry_page.seq != seq:
                heappop(heap)  # stale: the page left (or came back under a new seq)
                continue
            page = entry_page
            if ref != page.ref:  # outdated lower bound: re-rank with the current history
                hist = page.hist
                heapq.heapreplace(heap, (hist[-1], hist[0], page.ref, seq, key))
                continue
            if now - page.last > limit and key not in pinned:
                found = key
                break
            skipped.append(heappop(heap))
        for entry in skipped:
            heapq.heappush(heap, entry)
        if found is not None:
            return found
        return self._fallback(pinned)

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        page = self._pages.pop(key)  # its heap entry, if any, is stale from now on
        self._young.pop(key, None)
        if evicted:
            self._retained[key] = page  # kept for RIP; _purge and insert enforce the period
        if len(self._heap) > self._compact_at:
            self._compact()

    def __contains__(self, key: object) -> bool:
        return key in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned and CRP is 0.

        Fewer-than-K pages first (least recent first), then by ascending ``HIST(p,K)``.
        """
        young = list(self._young)
        old = [
            (p.hist[-1], p.hist[0], p.ref, k)
            for k, p in self._pages.items()
            if k not in self._young
        ]
        old.sort(key=lambda e: e[:3])
        return iter(young + [e[3] for e in old])

    # -- internals -----------------------------------------------------------------------
    def _push(self, key: Key, page: _Page) -> None:
        heapq.heappush(self._heap, (page.hist[-1], page.hist[0], page.ref, page.seq, key))
        if len(self._heap) > self._compact_at:
            self._compact()

    def _compact(self) -> None:
        # Drop stale entries (pages invalidated or evicted without reaching the top).
        pages = self._pages
        heap = []
        for entry in self._heap:
            page = pages.get(entry[4])
            if page is not None and page.seq == entry[3]:
                heap.append(entry)
        heapq.heapify(heap)
        self._heap = heap
        # Amortised O(1): the next compaction comes after at least len(heap) + 64 removals.
        self._compact_at = 2 * len(heap) + 64

    def _fallback(self, pinned: Container[Key]) -> Key | None:
        best: Key | None = None
        best_rank: tuple[float, int] | None = None
        for key, page in self._pages.items():
            if key in pinned:
                continue
            rank = (page.last, page.seq)
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
            if now - page.last <= self.rip:
                break
            del retained[key]
