"""LRU-2 with CRP 0 and unbounded RIP: :class:`engine.policy.lruk.LRUKPolicy`'s default, in
flat per-key slots.

``LRUKPolicy(k=2, crp=0, rip=None)`` (what ``make_policy("lru-k")`` builds) returns an
instance of :class:`LRU2Policy`: the same rules, terms and victims as the general class (see
its docstring), stored so that a hit allocates no container and an eviction is amortised
O(log n). Every key ever seen (until invalidated) owns a slot ``s``; parallel lists hold
``HIST(p,1)`` (= ``LAST(p)`` as every reference is uncorrelated), ``REF(p,1)``, ``HIST(p,2)``,
``REF(p,2)`` and the state ``LIVE`` of the key at ``s``. Lists of numbers hold no objects the
cyclic garbage collector tracks, so a replay of millions of keys costs it nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator
from heapq import heapify, heappop, heappush, heapreplace

from engine.policy.base import Key
from engine.policy.lruk import LRUKPolicy

_NEG_INF = float("-inf")
# Heap entries are ints ``REF(p,2) << _SHIFT | slot``: reference numbers are unique, so they
# order by REF(p,2) (with crp = 0 the order of HIST(p,2) and REF(p,2) agree).
_SHIFT = 40
_MASK = (1 << _SHIFT) - 1
# LIVE of a slot: _GONE (not resident), _YOUNG (resident, one reference: in ``_young``) or
# the REF(p,2) of the page's one live heap entry (a lower bound of its current REF(p,2)).
_GONE = -2
_YOUNG = -1


class LRU2Policy(LRUKPolicy):
    """LRU-K with ``k = 2``, ``crp = 0``, ``rip = None``; built by ``LRUKPolicy(...)``.

    Invariants: a resident page's slot has ``LIVE == _YOUNG`` and its key in ``_young``
    (ordered by REF(p,1)), or ``LIVE >= 0`` with exactly one heap entry of that rank,
    ``<= REF(p,2)``. Heap entries whose rank differs from their slot's LIVE are stale.
    ``victim`` refreshes an outdated entry when it reaches the top.

    Cost: ``hit`` and ``insert`` O(1) (a push when a page gets its second reference);
    ``victim``/``evict`` amortised O(log n) plus the pinned pages skipped.
    """

    def __init__(self, k: int = 2, crp: float = 0.0, rip: float | None = None) -> None:
        super().__init__(k, crp, rip)
        if k != 2 or crp or rip is not None:
            raise ValueError("LRU2Policy is LRU-K with k=2, crp=0, rip=None only")
        self._slot: dict[Key, int] = {}
        self._keys: list[Key | None] = []
        self._t1: list[float] = []  # HIST(p,1) = LAST(p)
        self._r1: list[int] = []  # REF(p,1)
        self._t2: list[float] = []  # HIST(p,2), -inf for one reference
        self._r2: list[int] = []  # REF(p,2), 0 for one reference
        self._live: list[int] = []
        self._free: list[int] = []  # slots of invalidated keys, reused first
        self._young: OrderedDict[Key, None] = OrderedDict()
        self._heap: list[int] = []
        self._n = 0
        self._compact_at = 64
        self._bind()  # replaces the base class's own fast paths

    # -- introspection -------------------------------------------------------------------
    def history(self, key: Key) -> tuple[float, ...] | None:
        s = self._slot.get(key)
        return None if s is None else (self._t1[s], self._t2[s])

    def history_refs(self, key: Key) -> tuple[int, ...] | None:
        s = self._slot.get(key)
        return None if s is None else (self._r1[s], self._r2[s])

    def last(self, key: Key) -> float | None:
        s = self._slot.get(key)
        return None if s is None else self._t1[s]

    def retained(self, key: Key, now: float) -> bool:
        s = self._slot.get(key)
        return s is not None and self._live[s] == _GONE

    # -- protocol ------------------------------------------------------------------------
    def _bind(self) -> None:
        """Bind ``hit`` and ``insert`` as closures over the slot lists (cell loads instead of
        attribute loads on the hot path). They share one reference counter."""
        slot, keys, free, young, heap = self._slot, self._keys, self._free, self._young, self._heap
        t1, r1, t2, r2, live = self._t1, self._r1, self._t2, self._r2, self._live
        refs = 0

        def insert(
            key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
        ) -> None:
            """A new page starts young; a retained one shifts its history and joins the heap."""
            nonlocal refs
            refs += 1
            self._n += 1
            s = slot.get(key)
            if s is None:
                if free:
                    s = free.pop()
                    keys[s] = key
                    t1[s] = now
                    r1[s] = refs
                    t2[s] = _NEG_INF
                    r2[s] = 0
                    live[s] = _YOUNG
                else:
                    s = len(keys)
                    keys.append(key)
                    t1.append(now)
                    r1.append(refs)
                    t2.append(_NEG_INF)
                    r2.append(0)
                    live.append(_YOUNG)
                slot[key] = s
                young[key] = None
                return
            t2[s] = t1[s]
            t1[s] = now
            rk = r2[s] = r1[s]
            r1[s] = refs
            live[s] = rk
            heappush(heap, rk << _SHIFT | s)
            if len(heap) > self._compact_at:
                self._compact()

        def hit(key: Key, now: float) -> None:
            """HIST(p,2) = HIST(p,1), HIST(p,1) = now (their numbers likewise)."""
            nonlocal refs
            s = slot[key]
            refs += 1
            t2[s] = t1[s]
            t1[s] = now
            rk = r2[s] = r1[s]
            r1[s] = refs
            if live[s] == _YOUNG:  # its second reference: joins the heap
                del young[key]
                live[s] = rk
                heappush(heap, rk << _SHIFT | s)

        self.insert = insert  # type: ignore[method-assign]
        self.hit = hit  # type: ignore[method-assign]

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for key in self._young:
            if not pinned or key not in pinned:
                return key
        s = self._top(pinned)
        return None if s is None else self._keys[s]

    def _top(self, pinned: Container[Key]) -> int | None:
        """Slot of the old unpinned page of smallest REF(p,2) (left on the heap's top when
        nothing is pinned), or ``None``."""
        heap, live, r2, keys = self._heap, self._live, self._r2, self._keys
        skipped: list[int] = []
        found: int | None = None
        while heap:
            entry = heap[0]
            s = entry & _MASK
            rk = entry >> _SHIFT
            if live[s] != rk:
                heappop(heap)  # stale: the page left (or the entry is of an earlier stay)
                continue
            current = r2[s]
            if current != rk:  # outdated lower bound: re-rank with the current history
                live[s] = current
                heapreplace(heap, current << _SHIFT | s)
                continue
            if not pinned or keys[s] not in pinned:
                found = s
                break
            skipped.append(heappop(heap))
        for entry in skipped:
            heappush(heap, entry)
        return found

    def evict(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        """``victim`` + ``remove(evicted=True)`` in one step (the same choice)."""
        if pinned:
            return super().evict(now, pinned)
        young = self._young
        if young:
            key = young.popitem(last=False)[0]
            s = self._slot[key]
        else:
            found = self._top(())
            if found is None:
                return None
            s = found
            heappop(self._heap)  # its entry is on top: drop it with the page
            key = self._keys[s]  # type: ignore[assignment]
        self._live[s] = _GONE
        self._n -= 1
        return key

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        s = self._slot[key]
        live = self._live
        if live[s] == _GONE:
            raise KeyError(key)
        if live[s] == _YOUNG:
            del self._young[key]
        live[s] = _GONE  # a heap entry, if any, is stale from now on
        self._n -= 1
        if not evicted:  # an invalidation forgets the history: the slot is reused
            del self._slot[key]
            self._keys[s] = None
            self._free.append(s)
        if len(self._heap) > self._compact_at:
            self._compact()

    def __contains__(self, key: object) -> bool:
        s = self._slot.get(key)  # type: ignore[call-overload]
        return s is not None and self._live[s] != _GONE

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned: young pages least recent
        first, then by ascending ``(HIST(p,2), REF(p,2))``."""
        live, t2, r2 = self._live, self._t2, self._r2
        old = [
            (t2[s], r2[s], key) for key, s in self._slot.items() if live[s] not in (_GONE, _YOUNG)
        ]
        old.sort(key=lambda e: e[:2])
        return iter([*self._young, *(e[2] for e in old)])

    # -- internals -----------------------------------------------------------------------
    def _compact(self) -> None:
        # Drop stale entries; the next compaction comes after >= len(heap) + 64 pushes.
        live = self._live
        heap = [e for e in self._heap if live[e & _MASK] == e >> _SHIFT]
        heapify(heap)
        self._heap[:] = heap  # in place: the closures of _bind hold this list
        self._compact_at = 2 * len(heap) + 64
