"""LRU-2 with CRP 0 and unbounded RIP: :class:`engine.policy.lruk.LRUKPolicy`'s default, kept
lean.

``LRUKPolicy(k=2, crp=0, rip=None)`` (what ``make_policy("lru-k")`` builds) returns an
instance of :class:`LRU2Policy`: the same rules, terms and victims as the general class (see
its docstring). With CRP 0 every reference is uncorrelated, so ``HIST(p,1) = LAST(p)``, and
with RIP unbounded the history of every key seen stays (until invalidated). A key's history
is one 4-tuple ``(HIST(p,1), REF(p,1), HIST(p,2), REF(p,2))`` (``-inf``/``0`` for one
reference) in a list slot indexed by the key's integer *id* (see :class:`LRU2Policy`); a hit
replaces it with one tuple build and one list store, touching nothing else unless the page
gets its second reference. ``hit``, ``insert``, ``evict`` and ``access_batch`` are closures
over the structures (no attribute loads on the hot path).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any
from weakref import ref as weak_ref

import numpy as np

from engine.policy.base import Key
from engine.policy.lruk import LRUKPolicy

_NEG_INF = float("-inf")
Hist = tuple[float, int, float, int]
#: ``(misses, bytes_hit, bytes_missed, refused, bytes_refused, used)`` of ``access_batch``
BatchCounts = tuple[int, int, int, int, int, int]
#: a heap entry is ``rank << _SHIFT | id``: it orders by rank (unique), its low bits name the page
_SHIFT = 32
_MASK = (1 << _SHIFT) - 1
#: dense ids may run this far past ``2 * slots + batch length`` before the map is kept instead
_SLACK = 1 << 16
#: memoryview formats of integer items (a trace batch's keys)
_INT_FORMATS = frozenset("bBhHiIlLqQnN")


class LRU2Policy(LRUKPolicy):
    """LRU-K with ``k = 2``, ``crp = 0``, ``rip = None``; built by ``LRUKPolicy(...)``.

    **Ids.** Every key the policy knows has an int id that indexes the per-page lists
    ``_res`` (history of a resident page, else ``None``), ``_ret`` (history of an evicted
    page not invalidated since, else ``None``) and ``_live`` (rank of an old page's live heap
    entry, else 0); no id has both a ``_res`` and a ``_ret`` entry. While ``_ids`` is
    ``None`` (*dense* mode, the start) every key seen is a plain ``int`` in
    ``[0, len(_res))`` and is its own id: trace keys (dense ints numbered by the readers)
    need no lookup. The first key that is not (another type, a negative int, or an int far
    beyond the slots) switches the policy for good to *mapped* mode: ``_ids`` maps key ->
    id and ``_keys`` id -> key. Either way the decisions are the same.

    **Order.** A resident page is either *young* (``REF(p,2) == 0``; id in ``_young``,
    ordered by REF(p,1)) or *old* (``_live[id]`` is the rank of its one live heap entry,
    ``rank <= REF(p,2)``: hits raise REF(p,2) without touching the heap, and the victim
    search refreshes an outdated entry when it reaches the top). A heap entry is the int
    ``rank << 32 | id``; an entry whose rank is not ``_live[id]`` is stale (the page left or
    the entry is of an earlier stay). Reference numbers are unique, so entries order by
    rank, and ordering by REF(p,2) is ordering by ``(HIST(p,2), REF(p,2))`` as ``now`` never
    decreases.

    Cost: ``hit`` and ``insert`` O(1) (plus a heap push when a page becomes old);
    ``victim``/``evict`` amortised O(log n) plus the pinned pages skipped. Memory: one slot
    per key ever seen in each list (dense mode: up to the largest key, at most about twice
    the keys seen plus a batch).

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
    calls one by one; if it raises, the accesses before the failing one are done. Keys
    that are all non-negative ints (a list, or a memoryview or array of an integer type, as
    trace replay passes) keep dense mode; any other batch is mapped to ids first.
    """

    def __init__(self, k: int = 2, crp: float = 0.0, rip: float | None = None) -> None:
        super().__init__(k, crp, rip)
        if k != 2 or crp or rip is not None:
            raise ValueError("LRU2Policy is LRU-K with k=2, crp=0, rip=None only")
        self._res: list[Hist | None] = []  # by id: resident pages' histories
        self._ret: list[Hist | None] = []  # by id: evicted pages' histories (RIP unbounded)
        self._live: list[int] = []  # by id: rank of an old page's live heap entry, else 0
        self._ids: dict[Key, int] | None = None  # None: dense mode (a key is its own id)
        self._keys: list[Key] = []  # by id, mapped mode only
        self._young: OrderedDict[int, None] = OrderedDict()  # type: ignore[assignment]
        self._heap: list[int] = []
        self._count: list[int] = [0]  # resident pages (a list: the closures share it)
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

    # -- ids -----------------------------------------------------------------------------
    def _find(self, key: Key) -> int | None:
        """The id of ``key`` if it has one (no new id is made)."""
        if self._ids is None:
            if type(key) is int:
                return key if 0 <= key < len(self._res) else None
            self._to_mapped()
        assert self._ids is not None
        return self._ids.get(key)

    def _grow(self, n: int) -> None:
        """Make ids ``0..n-1`` valid slots (dense mode)."""
        extra = n - len(self._res)
        if extra > 0:
            self._res.extend([None] * extra)
            self._ret.extend([None] * extra)
            self._live.extend([0] * extra)

    def _dense_fits(self, hi: int, n: int) -> bool:
        """Whether dense mode may grow to hold id ``hi`` (memory stays proportionate)."""
        return hi < 2 * len(self._res) + n + _SLACK and hi < _MASK

    def _to_mapped(self) -> None:
        """Leave dense mode: every known id keeps its key (= the id) in ``_ids``."""
        if self._ids is not None:
            return
        self._refs = self._last_ref()
        res, ret = self._res, self._ret
        self._ids = {i: i for i in range(len(res)) if res[i] is not None or ret[i] is not None}
        self._keys = list(range(len(res)))
        self._bind()

    def _dense_keys(self, keys: Iterable[Key]) -> Iterable[int] | None:
        """``keys`` as ids for dense mode (growing the slots), or ``None`` when they do not
        all qualify (then the policy must switch to mapped mode)."""
        seq: Any = keys
        if isinstance(seq, np.ndarray | memoryview):
            arr = np.asarray(seq)
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                return None
            if isinstance(seq, np.ndarray) or seq.format not in _INT_FORMATS:
                seq = np.ascontiguousarray(arr, dtype=np.int64).data  # yields Python ints
            if not len(arr):
                return seq  # type: ignore[no-any-return]
            lo, hi = int(arr.min()), int(arr.max())
        else:
            if not isinstance(seq, Sequence):
                seq = list(seq)
            if not seq:
                return seq  # type: ignore[no-any-return]
            if set(map(type, seq)) != {int}:
                return None
            lo, hi = min(seq), max(seq)
        if lo < 0 or not self._dense_fits(hi, len(seq)):
            return None
        self._grow(hi + 1)
        return seq  # type: ignore[no-any-return]

    def _mapped_keys(self, keys: Iterable[Key]) -> list[int]:
        """The ids of ``keys`` (mapped mode), giving new keys new ids."""
        ids, kl, res, ret, live = self._ids, self._keys, self._res, self._ret, self._live
        assert ids is not None
        out = []
        get = ids.get
        for k in keys:
            i = get(k)
            if i is None:
                i = ids[k] = len(res)
                kl.append(k)
                res.append(None)
                ret.append(None)
                live.append(0)
            out.append(i)
        return out

    def _bind(self) -> None:
        """Bind ``hit``, ``insert``, ``evict`` and ``access_batch`` as closures over the
        structures (for the current mode); they share one reference counter (``ref``, the
        last number given)."""
        res, ret, live, young, heap, count = (
            self._res,
            self._ret,
            self._live,
            self._young,
            self._heap,
            self._count,
        )
        ids, kl = self._ids, self._keys
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
            if ids is not None:
                i = ids.get(key)
                if i is None:
                    i = ids[key] = len(res)
                    kl.append(key)
                    res.append(None)
                    ret.append(None)
                    live.append(0)
            elif type(key) is int and 0 <= key < len(res):
                i = key
            else:  # a new slot, or the map from now on (the rebound closures carry on)
                policy = me()
                assert policy is not None  # a bound method's owner is alive
                if type(key) is int and key >= 0 and policy._dense_fits(key, 1):
                    policy._grow(key + 1)
                    i = key
                else:
                    policy._to_mapped()
                    return policy.insert(key, size, now, color, cost)
            ref += 1
            count[0] += 1
            old = ret[i]
            if old is None:
                res[i] = (now, ref, _NEG_INF, 0)
                young[i] = None
                return
            ret[i] = None
            rk = old[1]
            res[i] = (now, ref, old[0], rk)
            live[i] = rk
            heappush(heap, rk << _SHIFT | i)
            if len(heap) > compact_at[0]:
                _compact(heap, live, compact_at)

        def hit(key: Key, now: float) -> None:
            """HIST(p,2) = HIST(p,1), HIST(p,1) = now (their numbers likewise)."""
            nonlocal ref
            if ids is not None:
                i = ids.get(key)
                old = None if i is None else res[i]
            elif type(key) is int:
                i = key
                old = res[i] if 0 <= i < len(res) else None
            else:  # another type may equal a key: look it up in the map from now on
                policy = me()
                assert policy is not None
                policy._to_mapped()
                return policy.hit(key, now)
            if old is None:
                raise KeyError(key)
            ref += 1
            res[i] = (now, ref, old[0], old[1])  # type: ignore[index]
            if not old[3]:  # its second reference: the page becomes old
                del young[i]  # type: ignore[arg-type]
                rk = live[i] = old[1]  # type: ignore[index]
                heappush(heap, rk << _SHIFT | i)  # type: ignore[operator]

        def evict(now: float, pinned: Container[Key] = ()) -> Key | None:
            """``victim`` + ``remove(evicted=True)`` in one step (the same choice)."""
            if pinned:
                policy = me()
                assert policy is not None
                key = policy.victim(now, pinned)
                if key is not None:
                    policy.remove(key, now, True)
                return key
            if young:
                v = pop_young(False)[0]  # the least recent young page
            else:
                found = _top(heap, live, res)
                if found is None:
                    return None
                v = found
                heappop(heap)  # the victim's entry is on top: it goes with the page
                live[v] = 0
            ret[v] = res[v]
            res[v] = None
            count[0] -= 1
            return v if ids is None else kl[v]

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
            policy = me()
            assert policy is not None
            seq = policy._dense_keys(keys) if ids is None else None
            if seq is None:
                if ids is None:  # these keys need the map: carry on with rebound closures
                    policy._to_mapped()
                    return policy.access_batch(  # type: ignore[no-any-return]
                        keys, sizes, times, resident, used, capacity, count_hit_bytes
                    )
                seq = policy._mapped_keys(keys)
            key_of: Sequence[Key] = range(len(res)) if ids is None else kl
            r = ref
            before = len(resident)
            # locals: cheaper to load than the closure's cells
            res_, ret_, live_, young_, heap_ = res, ret, live, young, heap
            pop_resident = resident.pop
            misses = bytes_hit = bytes_missed = refused = bytes_refused = 0
            try:
                for i, s, t in zip(seq, sizes, times, strict=True):
                    h = res_[i]
                    if h is not None:  # hit (``res_`` has an entry exactly for resident ids)
                        r += 1
                        res_[i] = (t, r, h[0], h[1])
                        if count_hit_bytes:
                            bytes_hit += resident[key_of[i]]
                        if h[3]:
                            continue
                        del young_[i]  # its second reference: the page becomes old
                        rk = live_[i] = h[1]
                        heappush(heap_, rk << _SHIFT | i)
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
                            while True:  # ``_top`` inlined
                                e = heap_[0]
                                v = e & _MASK
                                rk = e >> _SHIFT
                                if live_[v] != rk:  # stale
                                    heappop(heap_)
                                    continue
                                current = res_[v][3]  # type: ignore[index]
                                if current != rk:  # outdated: re-rank
                                    live_[v] = current
                                    heapreplace(heap_, current << _SHIFT | v)
                                    continue
                                break
                            heappop(heap_)
                            live_[v] = 0
                        ret_[v] = res_[v]
                        res_[v] = None
                        used -= pop_resident(key_of[v])
                    resident[key_of[i]] = s
                    r += 1  # as ``insert``
                    prev = ret_[i]
                    if prev is None:
                        res_[i] = (t, r, _NEG_INF, 0)
                        young_[i] = None
                        continue
                    ret_[i] = None
                    rk = prev[1]
                    res_[i] = (t, r, prev[0], rk)
                    live_[i] = rk
                    heappush(heap_, rk << _SHIFT | i)
                    if len(heap_) > compact_at[0]:
                        _compact(heap_, live_, compact_at)
            finally:
                ref = r
                count[0] += len(resident) - before
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
        i = self._find(key)
        if i is None:
            return None
        h = self._res[i]
        return self._ret[i] if h is None else h

    def _key(self, i: int) -> Key:
        return i if self._ids is None else self._keys[i]

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
        i = self._find(key)
        return i is not None and self._ret[i] is not None

    # -- protocol ------------------------------------------------------------------------
    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for i in self._young:
            key = self._key(i)
            if not pinned or key not in pinned:
                return key
        skip = None if not pinned else (lambda i: self._key(i) in pinned)
        found = _top(self._heap, self._live, self._res, skip)
        return None if found is None else self._key(found)

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        i = self._find(key)
        h = None if i is None else self._res[i]
        if i is None or h is None:
            raise KeyError(key)
        if self._live[i]:
            self._live[i] = 0  # its heap entry is stale now
        else:
            del self._young[i]
        self._res[i] = None
        if evicted:  # kept; an invalidation forgets it
            self._ret[i] = h
        self._count[0] -= 1
        if len(self._heap) > self._compact_limit[0]:
            _compact(self._heap, self._live, self._compact_limit)

    def __contains__(self, key: object) -> bool:
        i = self._find(key)  # type: ignore[arg-type]
        return i is not None and self._res[i] is not None

    def __len__(self) -> int:
        return self._count[0]

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned: young pages least recent
        first, then by ascending ``(HIST(p,2), REF(p,2))``."""
        res, live = self._res, self._live
        old = [e & _MASK for e in self._heap if live[e & _MASK] == e >> _SHIFT]
        old.sort(key=lambda i: (res[i][2], res[i][3]))  # type: ignore[index]
        return iter([self._key(i) for i in [*self._young, *old]])

    def _compact(self) -> None:
        _compact(self._heap, self._live, self._compact_limit)


def _top(
    heap: list[int],
    live: list[int],
    res: list[Hist | None],
    skip: Any = None,
) -> int | None:
    """The id of the old page of smallest REF(p,2) for which ``skip(id)`` is false (its
    entry left on top of the heap when ``skip`` is ``None``), or ``None``; drops stale
    entries and refreshes outdated ones it meets on top."""
    skipped: list[int] = []
    found: int | None = None
    while heap:
        e = heap[0]
        i = e & _MASK
        rk = e >> _SHIFT
        if live[i] != rk:
            heappop(heap)  # stale: the page left (or the entry is of an earlier stay)
            continue
        current = res[i][3]  # type: ignore[index]
        if current != rk:  # outdated lower bound: re-rank with the current history
            live[i] = current
            heapreplace(heap, current << _SHIFT | i)
            continue
        if skip is None or not skip(i):
            found = i
            break
        skipped.append(heappop(heap))
    for entry in skipped:
        heappush(heap, entry)
    return found


def _compact(heap: list[int], live: list[int], compact_at: list[int]) -> None:
    """Drop stale entries from ``heap`` (in place: the closures hold the list); the next
    compaction comes after >= len(heap) + 64 pushes."""
    kept = [e for e in heap if live[e & _MASK] == e >> _SHIFT]
    heapify(kept)
    heap[:] = kept
    compact_at[0] = 2 * len(kept) + 64
