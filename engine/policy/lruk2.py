"""LRU-2 with CRP 0 and unbounded RIP: :class:`engine.policy.lruk.LRUKPolicy`'s default, kept
lean.

``LRUKPolicy(k=2, crp=0, rip=None)`` (what ``make_policy("lru-k")`` builds) returns an
instance of :class:`LRU2Policy`: the same rules, terms and victims as the general class (see
its docstring). With CRP 0 every reference is uncorrelated, so ``HIST(p,1) = LAST(p)``, and
with RIP unbounded the history of every key seen stays (until invalidated). A key's history
is four machine numbers ``HIST(p,1), REF(p,1), HIST(p,2), REF(p,2)`` (``-inf``/``0`` for
one reference) in flat arrays indexed by the key's integer *id* (see :class:`LRU2Policy`):
compact, so the histories of many keys stay in the CPU caches, and an eviction or a return
only flips the page's state byte. A hit shifts the four numbers, touching nothing else unless
the page gets its second reference. ``hit``, ``insert`` and ``evict`` are closures over the
structures (no attribute loads on the hot path), built by :mod:`engine.policy.lruk2_fast`,
which also holds the loop of ``access_batch``.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

from engine.policy.base import Key
from engine.policy.intkeys import int_key_range
from engine.policy.lruk import LRUKPolicy
from engine.policy.lruk2_fast import GONE as _GONE
from engine.policy.lruk2_fast import OLD as _OLD
from engine.policy.lruk2_fast import RET as _RET
from engine.policy.lruk2_fast import (
    BatchCounts,
    Pages,
    make_evict,
    make_hit,
    make_insert,
    replay_batch,
)
from engine.policy.rankheap import MASK as _MASK
from engine.policy.rankheap import SHIFT as _SHIFT
from engine.policy.rankheap import compact as _compact
from engine.policy.rankheap import top as _top

__all__ = ["BatchCounts", "LRU2Policy"]

#: dense ids may run this far past ``2 * slots + batch length`` before the map is kept instead
_SLACK = 1 << 16


class LRU2Policy(LRUKPolicy):
    """LRU-K with ``k = 2``, ``crp = 0``, ``rip = None``; built by ``LRUKPolicy(...)``.

    **Ids.** Every key the policy knows has an int id that indexes the per-page arrays:
    ``_state`` (``YOUNG``/``OLD`` resident, ``RET`` evicted with its history kept, ``GONE``
    no history: the constants of :mod:`engine.policy.lruk2_fast`),
    ``_h1t``/``_h1r``/``_h2t``/``_h2r`` (HIST(p,1), REF(p,1), HIST(p,2), REF(p,2);
    meaningful only where the state is not ``GONE``) and ``_live``
    (rank of an old resident page's live heap entry, else 0). While ``_ids`` is
    ``None`` (*dense* mode, the start) every key seen is a plain ``int`` in
    ``[0, len(_state))`` and is its own id: trace keys (dense ints numbered by the readers)
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
    per key ever seen in each array, 41 bytes a key (dense mode: up to the largest key, at
    most about twice the keys seen plus a batch). HIST values are stored as floats.

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
        self._state = bytearray()  # by id: GONE, YOUNG, RET or OLD
        self._h1t = array("d")  # by id: HIST(p,1)
        self._h1r = array("q")  # by id: REF(p,1)
        self._h2t = array("d")  # by id: HIST(p,2)
        self._h2r = array("q")  # by id: REF(p,2)
        self._live = array("q")  # by id: rank of an old page's live heap entry, else 0
        self._ids: dict[Key, int] | None = None  # None: dense mode (a key is its own id)
        self._keys: list[Key] = []  # by id, mapped mode only
        self._young: OrderedDict[int, None] = OrderedDict()  # type: ignore[assignment]
        self._heap: list[int] = []
        self._count: list[int] = [0]  # resident pages (a list: the closures share it)
        self._refc: list[int] = [0]  # the last reference number given (shared likewise)
        # heap length that triggers dropping stale entries (a list: the closures share it)
        self._compact_limit: list[int] = [64]
        self._bind()  # replaces the base class's own fast paths

    # -- copies: the closures are rebuilt over the copy's structures ---------------------
    _BOUND = ("insert", "hit", "evict", "_structs")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._BOUND}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind()

    @property
    def pages(self) -> Pages:
        """The per-page structures the bound operations work on (see :class:`Pages`); the
        same arrays for the policy's life, new ``ids``/``keys`` after a switch to mapped
        mode (the operations are rebound then)."""
        return self._structs

    # -- ids -----------------------------------------------------------------------------
    def find(self, key: Key) -> int | None:
        """The id of ``key`` if it has one (no new id is made); a key that is not an int
        switches the policy to mapped mode first (another type may equal a key)."""
        if self._ids is None:
            if type(key) is int:
                return key if 0 <= key < len(self._state) else None
            self._to_mapped()
        assert self._ids is not None
        return self._ids.get(key)

    def _grow(self, n: int) -> None:
        """Make ids ``0..n-1`` valid slots (``_GONE`` where new)."""
        extra = n - len(self._state)
        if extra > 0:
            self._state.extend(bytes(extra))
            zeros = bytes(8 * extra)  # 0 and 0.0
            for arr in (self._h1t, self._h1r, self._h2t, self._h2r, self._live):
                arr.frombytes(zeros)

    def _dense_fits(self, hi: int, n: int) -> bool:
        """Whether dense mode may grow to hold id ``hi`` (memory stays proportionate)."""
        return hi < 2 * len(self._state) + n + _SLACK and hi < _MASK

    def _to_mapped(self) -> None:
        """Leave dense mode: every known id keeps its key (= the id) in ``_ids``."""
        if self._ids is not None:
            return
        self._ids = {i: i for i, st in enumerate(self._state) if st != _GONE}
        self._keys = list(range(len(self._state)))
        self._bind()

    def _dense_keys(self, keys: Iterable[Key]) -> Sequence[int] | None:
        """``keys`` as ids for dense mode (growing the slots), or ``None`` when they do not
        all qualify (then the policy must switch to mapped mode)."""
        found = int_key_range(keys)
        if found is None:
            return None
        seq, lo, hi = found
        if lo < 0 or not self._dense_fits(hi, len(seq)):
            return None
        self._grow(hi + 1)
        return seq

    def id_for(self, key: Key) -> int:
        """The id of ``key``, giving it a new one (``GONE`` slots) if it has none: in dense
        mode a non-negative int the slots may grow to is its own id; any other key switches
        the policy to mapped mode for good (the operations are rebound; the arrays stay the
        same objects, so the ids a caller holds stay valid)."""
        if self._ids is None:
            if type(key) is int and key >= 0 and self._dense_fits(key, 1):
                self._grow(key + 1)
                return key
            self._to_mapped()
        assert self._ids is not None
        found = self._ids.get(key)
        return found if found is not None else self._mapped_keys((key,))[0]

    def _mapped_keys(self, keys: Iterable[Key]) -> list[int]:
        """The ids of ``keys`` (mapped mode), giving new keys new ids."""
        ids, kl = self._ids, self._keys
        assert ids is not None
        out = []
        get = ids.get
        n = len(self._state)
        for k in keys:
            i = get(k)
            if i is None:
                i = ids[k] = n
                n += 1
                kl.append(k)
            out.append(i)
        self._grow(n)
        return out

    def _bind(self) -> None:
        """Bind ``insert``, ``hit`` and ``evict`` as closures over the structures, for the
        current mode (see :mod:`engine.policy.lruk2_fast`)."""
        self._structs = Pages(
            self._state,
            self._h1t,
            self._h1r,
            self._h2t,
            self._h2r,
            self._live,
            self._young,
            self._heap,
            self._count,
            self._refc,
            self._compact_limit,
            self._ids,
            self._keys,
        )
        self.insert = make_insert(self)  # type: ignore[method-assign]
        self.hit = make_hit(self)  # type: ignore[method-assign]
        self.evict = make_evict(self)  # type: ignore[method-assign]

    def access_batch(
        self,
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
        seq = self._dense_keys(keys) if self._ids is None else None
        if seq is None:  # these keys need the map (from now on, if in dense mode)
            self._to_mapped()
            seq = self._mapped_keys(keys)
        key_of: Sequence[Key] = range(len(self._state)) if self._ids is None else self._keys
        return replay_batch(
            self, seq, key_of, sizes, times, resident, used, capacity, count_hit_bytes
        )

    # -- introspection -------------------------------------------------------------------
    def _known_id(self, key: Key) -> int | None:
        """The id of ``key`` when it has history (resident or retained), else ``None``."""
        i = self.find(key)
        return None if i is None or self._state[i] == _GONE else i

    def _key(self, i: int) -> Key:
        return i if self._ids is None else self._keys[i]

    def history(self, key: Key) -> tuple[float, ...] | None:
        i = self._known_id(key)
        return None if i is None else (self._h1t[i], self._h2t[i])

    def history_refs(self, key: Key) -> tuple[int, ...] | None:
        i = self._known_id(key)
        return None if i is None else (self._h1r[i], self._h2r[i])

    def last(self, key: Key) -> float | None:
        i = self._known_id(key)
        return None if i is None else self._h1t[i]

    def retained(self, key: Key, now: float) -> bool:
        i = self.find(key)
        return i is not None and self._state[i] == _RET

    # -- protocol ------------------------------------------------------------------------
    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for i in self._young:
            key = self._key(i)
            if not pinned or key not in pinned:
                return key
        skip = None if not pinned else (lambda i: self._key(i) in pinned)
        found = _top(self._heap, self._live, self._h2r, skip)
        return None if found is None else self._key(found)

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        i = self.find(key)
        if i is None or not self._state[i] & 1:
            raise KeyError(key)
        if self._state[i] == _OLD:
            self._live[i] = 0  # its heap entry is stale now
        else:
            del self._young[i]
        # kept when evicted; an invalidation forgets it
        self._state[i] = _RET if evicted else _GONE
        self._count[0] -= 1
        if len(self._heap) > self._compact_limit[0]:
            _compact(self._heap, self._live, self._compact_limit)

    def __contains__(self, key: object) -> bool:
        i = self.find(key)
        return i is not None and self._state[i] & 1 == 1

    def __len__(self) -> int:
        return self._count[0]

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in victim order when nothing is pinned: young pages least recent
        first, then by ascending ``(HIST(p,2), REF(p,2))``."""
        h2t, h2r, live = self._h2t, self._h2r, self._live
        old = [e & _MASK for e in self._heap if live[e & _MASK] == e >> _SHIFT]
        old.sort(key=lambda i: (h2t[i], h2r[i]))
        return iter([self._key(i) for i in [*self._young, *old]])

    def _compact(self) -> None:
        _compact(self._heap, self._live, self._compact_limit)
