"""LRU-2 with CRP 0 and unbounded RIP: :class:`engine.policy.lruk.LRUKPolicy`'s default, kept
lean.

``LRUKPolicy(k=2, crp=0, rip=None)`` (what ``make_policy("lru-k")`` builds) returns an
instance of :class:`LRU2Policy`: the same rules, terms and victims as the general class (see
its docstring). With CRP 0 every reference is uncorrelated, so ``HIST(p,1) = LAST(p)``, and
with RIP unbounded the history of every key seen stays (until invalidated). A key's history
is one 4-tuple ``(HIST(p,1), REF(p,1), HIST(p,2), REF(p,2))`` (``-inf``/``0`` for one
reference); a hit replaces it with one tuple build and one dict store, touching nothing else
unless the page gets its second reference. ``hit``, ``insert``, ``evict`` and
``access_batch`` are closures over the structures (no attribute loads on the hot path).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any
from weakref import ref as weak_ref

from engine.policy.base import Key
from engine.policy.lruk import LRUKPolicy

_NEG_INF = float("-inf")
Hist = tuple[float, int, float, int]
#: ``(misses, bytes_hit, bytes_missed, refused, bytes_refused, used)`` of ``access_batch``
BatchCounts = tuple[int, int, int, int, int, int]


class LRU2Policy(LRUKPolicy):
    """LRU-K with ``k = 2``, ``crp = 0``, ``rip = None``; built by ``LRUKPolicy(...)``.

    Invariants: ``_hist`` holds the history of every resident key (so it is the resident
    set, small and hot), ``_evicted`` that of every evicted key not invalidated since, and
    no key is in both. A resident page is either *young* (``REF(p,2) == 0``; key in
    ``_young``, ordered by REF(p,1)) or *old* (key in ``_live`` with the rank of its one live
    heap entry, an int whose key is ``_owner[rank]``, ``rank <= REF(p,2)``: hits raise
    REF(p,2) without touching the heap, and the victim search refreshes an outdated entry
    when it reaches the top). Heap entries whose rank differs from ``_live[key]`` (or whose
    key is not there) are stale. Reference numbers are unique, so ints identify entries, and
    ordering by REF(p,2) is ordering by ``(HIST(p,2), REF(p,2))`` as ``now`` never decreases.

    Cost: ``hit`` and ``insert`` O(1) (plus a heap push when a page becomes old);
    ``victim``/``evict`` amortised O(log n) plus the pinned pages skipped.

    **Batch protocol** (what :meth:`engine.cache.TierCache.access_many` calls when nothing
    is pinned or coloured): ``access_batch(keys, sizes, times, resident, used, capacity,
    count_hit_bytes)`` runs, for each access in order, exactly the steps the cache's replay
    loop would: a key in ``resident`` (the owning cache's ``key -> size`` dict, the same
    set as the policy's) is a hit (``hit(key, t)``); otherwise a miss, refused when its size
    exceeds ``capacity``, else ``evict(t, ())`` until ``used + size <= capacity`` (each
    victim popped from ``resident``) and ``insert(key, size, t)`` (added to ``resident``).
    It updates ``resident`` in place and returns :data:`BatchCounts`, ``used`` being the
    bytes resident afterwards; ``bytes_hit`` sums the resident sizes of hits when
    ``count_hit_bytes`` (else 0). Same victims, histories and reference numbers as the
    calls one by one; if it raises, the accesses before the failing one are done.
    """

    def __init__(self, k: int = 2, crp: float = 0.0, rip: float | None = None) -> None:
        super().__init__(k, crp, rip)
        if k != 2 or crp or rip is not None:
            raise ValueError("LRU2Policy is LRU-K with k=2, crp=0, rip=None only")
        self._hist: dict[Key, Hist] = {}  # resident pages
        self._evicted: dict[Key, Hist] = {}  # evicted pages (RIP unbounded)
        self._young: OrderedDict[Key, None] = OrderedDict()
        self._live: dict[Key, int] = {}
        self._heap: list[int] = []
        self._owner: dict[int, Key] = {}  # rank of a heap entry -> its key
        # heap length that triggers dropping stale entries (a list: the closures share it)
        self._compact_limit: list[int] = [64]
        self._bind()  # replaces the base class's own fast paths

    # -- copies: the closures are rebuilt over the copy's structures ---------------------
    _BOUND = ("insert", "hit", "evict", "access_batch", "_last_ref")

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in self._BOUND}
        state["_refs"] = self._last_ref()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind()

    def _bind(self) -> None:
        """Bind ``hit``, ``insert``, ``evict`` and ``access_batch`` as closures over the
        structures; they share one reference counter (``ref``, the last number given)."""
        hist, retained, young, live, heap, owner = (
            self._hist,
            self._evicted,
            self._young,
            self._live,
            self._heap,
            self._owner,
        )
        compact_at = self._compact_limit
        ref = self._refs
        pop_young = young.popitem
        # No closure holds ``self`` (only a weak reference): a policy is freed as soon as its
        # last user drops it, without waiting for the cyclic garbage collector.
        me = weak_ref(self)

        def insert(
            key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
        ) -> None:
            """A new page starts young; a retained one shifts its history and is old."""
            nonlocal ref
            ref += 1
            old = retained.pop(key, None)
            if old is None:
                hist[key] = (now, ref, _NEG_INF, 0)
                young[key] = None
                return
            rk = old[1]
            hist[key] = (now, ref, old[0], rk)
            live[key] = rk
            heappush(heap, rk)
            owner[rk] = key
            if len(heap) > compact_at[0]:
                _compact(heap, live, owner, compact_at)

        def hit(key: Key, now: float) -> None:
            """HIST(p,2) = HIST(p,1), HIST(p,1) = now (their numbers likewise)."""
            nonlocal ref
            ref += 1
            old = hist[key]
            hist[key] = (now, ref, old[0], old[1])
            if not old[3]:  # its second reference: the page becomes old
                del young[key]
                rk = live[key] = old[1]
                heappush(heap, rk)
                owner[rk] = key

        def evict(now: float, pinned: Container[Key] = ()) -> Key | None:
            """``victim`` + ``remove(evicted=True)`` in one step (the same choice)."""
            if pinned:
                policy = me()
                assert policy is not None  # a bound method's owner is alive
                key = policy.victim(now, pinned)
                if key is not None:
                    policy.remove(key, now, True)
                return key
            if young:
                key = pop_young(False)[0]  # the least recent young page
            else:
                key = _top(heap, live, hist, owner, ())
                if key is None:
                    return None
                heappop(heap)  # the victim's entry is on top: it goes with the page
                del owner[live.pop(key)]
            retained[key] = hist.pop(key)
            return key

        def access_batch(
            keys: Iterable[Key],
            sizes: Iterable[int],
            times: Iterable[float],
            resident: dict[Key, int],
            used: int,
            capacity: int,
            count_hit_bytes: bool,
        ) -> BatchCounts:
            """Steps of ``hit``/``evict``/``insert`` for a run of accesses; see
            :class:`LRU2Policy` (the batch protocol) for arguments and results."""
            nonlocal ref
            r = ref
            # locals: cheaper to load than the closure's cells
            hist_, retained_, young_, live_, heap_, owner_ = (
                hist,
                retained,
                young,
                live,
                heap,
                owner,
            )
            pop_hist, pop_retained, pop_resident = hist_.pop, retained_.pop, resident.pop
            misses = bytes_hit = bytes_missed = refused = bytes_refused = 0
            try:
                for k, s, t in zip(keys, sizes, times, strict=True):
                    if k in hist_:  # hit (``hist_`` holds exactly the resident keys)
                        r += 1
                        old = hist_[k]
                        hist_[k] = (t, r, old[0], old[1])
                        if count_hit_bytes:
                            bytes_hit += resident[k]
                        if old[3]:
                            continue
                        del young_[k]  # its second reference: the page becomes old
                        rk = live_[k] = old[1]
                        heappush(heap_, rk)
                        owner_[rk] = k
                        continue
                    misses += 1
                    bytes_missed += s
                    if s > capacity:
                        refused += 1
                        bytes_refused += s
                        continue
                    used += s
                    while used > capacity:  # evict as ``evict(t, ())`` does
                        if young_:
                            v = pop_young(False)[0]
                        else:
                            while True:  # ``_top(())`` inlined
                                rk = heap_[0]
                                v = owner_[rk]
                                if live_.get(v) != rk:
                                    heappop(heap_)
                                    del owner_[rk]
                                    continue
                                current = hist_[v][3]
                                if current != rk:
                                    live_[v] = current
                                    heapreplace(heap_, current)
                                    del owner_[rk]
                                    owner_[current] = v
                                    continue
                                break
                            heappop(heap_)
                            del owner_[rk]
                            del live_[v]
                        retained_[v] = pop_hist(v)
                        used -= pop_resident(v)
                    resident[k] = s
                    r += 1  # as ``insert``
                    prev = pop_retained(k, None)
                    if prev is None:
                        hist_[k] = (t, r, _NEG_INF, 0)
                        young_[k] = None
                        continue
                    rk = prev[1]
                    hist_[k] = (t, r, prev[0], rk)
                    live_[k] = rk
                    heappush(heap_, rk)
                    owner_[rk] = k
                    if len(heap_) > compact_at[0]:
                        _compact(heap_, live_, owner_, compact_at)
            finally:
                ref = r
            return misses, bytes_hit, bytes_missed, refused, bytes_refused, used

        def refs() -> int:
            return ref

        self.insert = insert  # type: ignore[method-assign]
        self.hit = hit  # type: ignore[method-assign]
        self.evict = evict  # type: ignore[method-assign]
        self.access_batch = access_batch
        self._last_ref = refs

    # -- introspection -------------------------------------------------------------------
    def _known(self, key: Key) -> Hist | None:
        h = self._hist.get(key)
        return self._evicted.get(key) if h is None else h

    def history(self, key: Key) -> tuple[float, ...] | None:
        h = self._known(key)
        return None if h is None else (h[0], h[2])

    def history_refs(self, key: Key) -> tuple[int, ...] | None:
        h = self._known(key)
        return None if h is None else (h[1], h[3])

    def last(self, key: Key) -> float | None:
        h = self._known(key)
        return None if h is None else h[0]

    def retained(self, key: Key, now: float) -> bool:
        return key in self._evicted

    # -- protocol ------------------------------------------------------------------------
    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for key in self._young:
            if not pinned or key not in pinned:
                return key
        return _top(self._heap, self._live, self._hist, self._owner, pinned)

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        if key in self._young:
            del self._young[key]
        else:
            del self._live[key]  # KeyError when not resident; its heap entry is stale now
        h = self._hist.pop(key)
        if evicted:  # kept; an invalidation forgets it
            self._evicted[key] = h
        if len(self._heap) > self._compact_limit[0]:
            _compact(self._heap, self._live, self._owner, self._compact_limit)

    def __contains__(self, key: object) -> bool:
        return key in self._hist

    def __len__(self) -> int:
        return len(self._hist)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned: young pages least recent
        first, then by ascending ``(HIST(p,2), REF(p,2))``."""
        hist = self._hist
        old = sorted(self._live, key=lambda k: (hist[k][2], hist[k][3]))
        return iter([*self._young, *old])

    def _compact(self) -> None:
        _compact(self._heap, self._live, self._owner, self._compact_limit)


def _top(
    heap: list[int],
    live: dict[Key, int],
    hist: dict[Key, Hist],
    owner: dict[int, Key],
    pinned: Container[Key],
) -> Key | None:
    """The old unpinned page of smallest REF(p,2) (its entry left on top of the heap when
    nothing is pinned), or ``None``; drops stale entries and refreshes outdated ones it
    meets on top."""
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


def _compact(
    heap: list[int], live: dict[Key, int], owner: dict[int, Key], compact_at: list[int]
) -> None:
    """Drop stale entries from ``heap`` (in place: the closures hold the list) and their
    ``owner`` slots; the next compaction comes after >= len(heap) + 64 pushes."""
    kept = []
    for rk in heap:
        if live.get(owner[rk]) == rk:
            kept.append(rk)
        else:
            del owner[rk]
    heapify(kept)
    heap[:] = kept
    compact_at[0] = 2 * len(kept) + 64
