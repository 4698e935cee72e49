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

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register

_NEG_INF = float("-inf")


class _Page:
    """History of one page: ``hist[i]`` is the paper's ``HIST(p, i+1)``.

    ``refs[i]`` is the reference number that goes with ``hist[i]`` (the policy numbers every
    insertion and uncorrelated reference 1, 2, 3, ...; they shift along with ``hist``), so
    that equal times still order pages by reference order. ``live`` is ``refs[-1]`` as it was
    when the page's current heap entry was pushed (``-1``: no entry, the page is young).
    """

    __slots__ = ("hist", "last", "live", "refs")

    def __init__(self, hist: list[float], refs: list[int], last: float) -> None:
        self.hist = hist
        self.refs = refs
        self.last = last
        self.live = -1


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
        #   ``_young`` -- HIST(p,K) == -inf -- ordered by reference number of HIST(p,1), or
        #   the heap -- exactly one live entry (hk, rk, key) with ``rk == page.live`` and
        #   (hk, rk) <= the page's current (HIST(p,K), refs[-1]). While a page is resident
        #   these never decrease (correl >= 0), so the entry is a lower bound; ``victim``
        #   refreshes an outdated entry (``rk != refs[-1]``) when it reaches the top. Entries
        #   of pages no longer resident, or of an earlier residency (their ``rk`` is below the
        #   page's ``live``), are stale.
        # Reference numbers are unique, so heap tuples never compare keys.
        self._pages: dict[Key, _Page] = {}
        self._young: OrderedDict[Key, _Page] = OrderedDict()
        self._heap: list[tuple[float, int, Key]] = []
        # History of evicted pages, in eviction order (an OrderedDict for cheap purging from
        # the front when RIP is finite; a plain dict, faster, when it is never purged).
        self._retained: dict[Key, _Page] = OrderedDict() if rip is not None else {}
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

    def history_refs(self, key: Key) -> tuple[int, ...] | None:
        """The reference numbers that go with :meth:`history` (0 where ``HIST`` is -inf)."""
        page = self._pages.get(key) or self._retained.get(key)
        return None if page is None else tuple(page.refs)

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
        rip = self.rip
        if rip is not None:
            self._purge(now)
        page = self._retained.pop(key, None) if self._retained else None
        ref = self._refs = self._refs + 1
        if page is not None and (rip is None or now - page.last <= rip):
            hist = page.hist
            refs = page.refs
            hist.pop()  # HIST(p,i) = HIST(p,i-1) for i = K..2
            hist.insert(0, now)
            refs.pop()
            refs.insert(0, ref)
            page.last = now
            if hist[-1] != _NEG_INF:
                self._pages[key] = page
                self._push(key, page)
                return
            page.live = -1
        else:
            page = _Page([now] + [_NEG_INF] * (self.k - 1), [ref] + [0] * (self.k - 1), now)
            if self.k == 1:
                self._pages[key] = page
                self._push(key, page)
                return
        self._pages[key] = page
        self._young[key] = page

    def hit(self, key: Key, now: float) -> None:
        page = self._pages[key]
        last = page.last
        page.last = now
        crp = self.crp
        if crp and now - last <= crp:
            return  # correlated: only LAST changes, HIST (hence the order) does not
        ref = self._refs = self._refs + 1
        hist = page.hist
        refs = page.refs
        if self._k2:
            # K = 2: HIST(p,2) = HIST(p,1) + (LAST(p) - HIST(p,1)) = LAST(p), taken exactly.
            young = page.live < 0
            hist[1] = last
            hist[0] = now
            refs[1] = refs[0]
            refs[0] = ref
            if young:
                del self._young[key]
                self._push(key, page)
            return  # else: the heap entry is now a lower bound; victim refreshes it lazily
        young = hist[-1] == _NEG_INF
        correl = last - hist[0]
        for i in range(self.k - 1, 0, -1):
            hist[i] = hist[i - 1] + correl
            refs[i] = refs[i - 1]
        hist[0] = now
        refs[0] = ref
        if hist[-1] == _NEG_INF:
            self._young.move_to_end(key)  # HIST(p,1) is now the most recent: keeps the order
        elif young:
            del self._young[key]
            self._push(key, page)

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        crp = self.crp
        young = self._young
        if young:
            if not crp and not pinned:
                return next(iter(young))
            # With crp == 0 every page is eligible: now - LAST > -inf always holds.
            limit = crp if crp else _NEG_INF
            for key, page in young.items():
                if now - page.last > limit and key not in pinned:
                    return key
        heap = self._heap
        pages = self._pages
        skipped: list[tuple[float, int, Key]] = []
        found: Key | None = None
        while heap:
            _, rk, key = heap[0]
            page = pages.get(key)
            if page is None or page.live != rk:
                heappop(heap)  # stale: the page left (or this entry is of an earlier stay)
                continue
            refs = page.refs
            if refs[-1] != rk:  # outdated lower bound: re-rank with the current history
                rk = page.live = refs[-1]
                heapreplace(heap, (page.hist[-1], rk, key))
                continue
            if (not crp or now - page.last > crp) and key not in pinned:
                found = key
                break
            skipped.append(heappop(heap))
        for entry in skipped:
            heappush(heap, entry)
        if found is not None:
            return found
        return self._fallback(pinned)

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        page = self._pages.pop(key)  # its heap entry, if any, is stale from now on
        if page.live < 0:
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

        Fewer-than-K pages first (least recent first), then by ascending
        ``(HIST(p,K), number)``.
        """
        young = list(self._young)
        old = [(p.hist[-1], p.refs[-1], k) for k, p in self._pages.items() if p.live >= 0]
        old.sort(key=lambda e: e[:2])
        return iter(young + [e[2] for e in old])

    # -- internals -----------------------------------------------------------------------
    def _push(self, key: Key, page: _Page) -> None:
        rk = page.live = page.refs[-1]
        heap = self._heap
        heappush(heap, (page.hist[-1], rk, key))
        if len(heap) > self._compact_at:
            self._compact()

    def _compact(self) -> None:
        # Drop stale entries (pages invalidated or evicted without reaching the top).
        pages = self._pages
        heap = []
        for entry in self._heap:
            page = pages.get(entry[2])
            if page is not None and page.live == entry[1]:
                heap.append(entry)
        heapify(heap)
        self._heap = heap
        # Amortised O(1): the next compaction comes after at least len(heap) + 64 removals.
        self._compact_at = 2 * len(heap) + 64

    def _fallback(self, pinned: Container[Key]) -> Key | None:
        best: Key | None = None
        best_rank: tuple[float, int] | None = None
        for key, page in self._pages.items():
            if key in pinned:
                continue
            rank = (page.last, page.refs[0])
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
