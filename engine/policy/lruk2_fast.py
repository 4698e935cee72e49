"""The hot paths of :class:`engine.policy.lruk2.LRU2Policy`: ``insert``, ``hit`` and ``evict``
as closures over one policy's arrays, and the batch replay loop.

Each ``make_*`` factory binds the structures of the policy it is given to locals (no
attribute loads on the hot path) and returns one operation; the policy rebinds them when its
mode changes (see :meth:`engine.policy.lruk2.LRU2Policy._bind`). No closure holds the policy
itself, only a weak reference: a policy is freed as soon as its last user drops it, without
waiting for the cyclic garbage collector. The operations share the reference counter
``refc`` (a one-element list: the last reference number given) and the resident count
``resident``, so any mix of single calls and batches numbers references as the calls one by
one would.

The structures are a policy's :class:`Pages` (``LRU2Policy.pages``): the states, arrays and
heap documented on :class:`engine.policy.lruk2.LRU2Policy`. Ids for keys the arrays do not
hold yet come from the policy's public id methods (``id_for``, ``find``), which may grow the
arrays in place or switch the policy to mapped mode (it then rebinds the operations).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from heapq import heappush
from typing import TYPE_CHECKING, NamedTuple, Protocol
from weakref import ref as weak_ref

from engine.policy.base import Key
from engine.policy.rankheap import SHIFT as _SHIFT
from engine.policy.rankheap import compact as _compact
from engine.policy.rankheap import pop_top as _pop_top

if TYPE_CHECKING:
    from engine.policy.lruk2 import LRU2Policy

NEG_INF = float("-inf")
#: a page's state byte (``Pages.state[id]``): no history (unknown or invalidated), resident young,
#: evicted (history kept), resident old; resident is ``state & 1``
GONE, YOUNG, RET, OLD = 0, 1, 2, 3
#: ``(misses, bytes_hit, bytes_missed, refused, bytes_refused, used)`` of a batch replay
BatchCounts = tuple[int, int, int, int, int, int]


class Pages(NamedTuple):
    """One :class:`engine.policy.lruk2.LRU2Policy`'s per-page structures, shared with its
    bound operations (which update them in place).

    ``state``/``h1t``/``h1r``/``h2t``/``h2r``/``live`` are indexed by page id and always have
    the same length (``LRU2Policy.id_for`` grows them together); ``young`` holds the young
    resident ids by REF(p,1); ``heap`` the entries ``rank << 32 | id`` of old pages (an
    entry is live when its rank equals ``live[id]``); ``resident`` (resident pages),
    ``refc`` (the last reference number given) and ``compact_limit`` (the heap length that
    triggers dropping stale entries) are one-element lists. ``ids`` is ``None`` in dense mode
    (a key is its own id), else key -> id with ``keys`` id -> key. A policy's ``Pages`` are
    replaced (same arrays, new ``ids``/``keys``) only when it switches to mapped mode.
    """

    state: bytearray
    h1t: array[float]
    h1r: array[int]
    h2t: array[float]
    h2r: array[int]
    live: array[int]
    young: OrderedDict[int, None]
    heap: list[int]
    resident: list[int]
    refc: list[int]
    compact_limit: list[int]
    ids: dict[Key, int] | None
    keys: list[Key]


class InsertFn(Protocol):
    """The signature of :meth:`engine.policy.base.EvictionPolicy.insert`."""

    def __call__(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None: ...


class HitFn(Protocol):
    """The signature of :meth:`engine.policy.base.EvictionPolicy.hit`."""

    def __call__(self, key: Key, now: float) -> None: ...


class EvictFn(Protocol):
    """The signature of :meth:`engine.policy.base.EvictionPolicy.evict`."""

    def __call__(self, now: float, pinned: Container[Key] = ()) -> Key | None: ...


def _owner(me: weak_ref[LRU2Policy]) -> LRU2Policy:
    """The policy behind a closure's weak reference (alive while its bound operation runs)."""
    policy = me()
    assert policy is not None  # a bound operation's owner is alive
    return policy


def make_insert(p: LRU2Policy) -> InsertFn:
    """``insert(key, size, now, color=None, cost=0.0)`` over ``p``'s structures: a new page
    starts young; a retained one shifts its history and is old."""
    pg = p.pages
    state, h1t, h1r, h2t, h2r = pg.state, pg.h1t, pg.h1r, pg.h2t, pg.h2r
    live, young, heap, compact_at = pg.live, pg.young, pg.heap, pg.compact_limit
    refc, count, ids = pg.refc, pg.resident, pg.ids
    me = weak_ref(p)

    def insert(
        key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        if ids is not None:
            i = ids.get(key)
            if i is None:
                i = _owner(me).id_for(key)
        elif type(key) is int and 0 <= key < len(state):
            i = key
        else:  # a new slot, or the map from now on (the arrays stay the same objects)
            i = _owner(me).id_for(key)
        r = refc[0] = refc[0] + 1
        count[0] += 1
        if state[i] == RET:  # shift the retained history: the page is old
            q = h1r[i]
            h2r[i] = q
            h1r[i] = r
            h2t[i] = h1t[i]
            h1t[i] = now
            live[i] = q
            heappush(heap, q << _SHIFT | i)
            state[i] = OLD
            if len(heap) > compact_at[0]:
                _compact(heap, live, compact_at)
        else:
            h1t[i] = now
            h1r[i] = r
            h2t[i] = NEG_INF
            h2r[i] = 0
            young[i] = None
            state[i] = YOUNG

    return insert


def make_hit(p: LRU2Policy) -> HitFn:
    """``hit(key, now)`` over ``p``'s structures: HIST(p,2) = HIST(p,1), HIST(p,1) = now
    (their numbers likewise); a young page's second reference makes it old."""
    pg = p.pages
    state, h1t, h1r, h2t, h2r = pg.state, pg.h1t, pg.h1r, pg.h2t, pg.h2r
    live, young, heap, refc, ids = pg.live, pg.young, pg.heap, pg.refc, pg.ids
    me = weak_ref(p)

    def hit(key: Key, now: float) -> None:
        if ids is not None:
            i = ids.get(key)
            if i is None or not state[i] & 1:
                raise KeyError(key)
        elif type(key) is int:
            i = key
            if not 0 <= i < len(state) or not state[i] & 1:
                raise KeyError(key)
        else:  # another type may equal a key: the policy looks it up in the map from now on
            found = _owner(me).find(key)
            if found is None or not state[found] & 1:
                raise KeyError(key)
            i = found
        r = refc[0] = refc[0] + 1
        q = h1r[i]
        if state[i] == YOUNG:  # its second reference: the page becomes old
            del young[i]
            live[i] = q
            heappush(heap, q << _SHIFT | i)
            state[i] = OLD
        h2r[i] = q
        h1r[i] = r
        h2t[i] = h1t[i]
        h1t[i] = now

    return hit


def make_evict(p: LRU2Policy) -> EvictFn:
    """``evict(now, pinned=())`` over ``p``'s structures: ``victim`` + ``remove(evicted=True)``
    in one step (the same choice)."""
    pg = p.pages
    state, h2r, live, young, heap = pg.state, pg.h2r, pg.live, pg.young, pg.heap
    count, ids, kl = pg.resident, pg.ids, pg.keys
    pop_young = young.popitem
    me = weak_ref(p)

    def evict(now: float, pinned: Container[Key] = ()) -> Key | None:
        if pinned:
            policy = _owner(me)
            key = policy.victim(now, pinned)
            if key is not None:
                policy.remove(key, now, True)
            return key
        if young:
            v = pop_young(False)[0]  # the least recent young page
        elif count[0]:  # resident and not young: an old page is on the heap
            v = _pop_top(heap, live, h2r)
        else:
            return None
        state[v] = RET
        count[0] -= 1
        return v if ids is None else kl[v]

    return evict


def replay_batch(
    p: LRU2Policy,
    seq: Iterable[int],
    key_of: Sequence[Key],
    sizes: Iterable[int],
    times: Iterable[float],
    resident: dict[Key, int],
    used: int,
    capacity: int,
    count_hit_bytes: bool,
) -> BatchCounts:
    """The batch protocol's loop (see :class:`engine.policy.lruk2.LRU2Policy`) over the page
    ids ``seq`` (every one a valid slot); ``key_of[id]`` is the key ``resident`` holds.

    Per access exactly the steps of ``hit``, ``evict(t, ())`` and ``insert``, inlined; the
    reference counter and resident count are brought up to date even if it raises."""
    pg = p.pages
    st, h1t, h1r, h2t, h2r = pg.state, pg.h1t, pg.h1r, pg.h2t, pg.h2r
    live, young, heap, compact_at = pg.live, pg.young, pg.heap, pg.compact_limit
    push, pop_young, pop_resident = heappush, young.popitem, resident.pop
    pop_top, neg_inf, refc, count = _pop_top, NEG_INF, pg.refc, pg.resident
    r, before = refc[0], len(resident)
    misses = bytes_hit = bytes_missed = refused = bytes_refused = 0
    try:
        for i, s, t in zip(seq, sizes, times, strict=True):
            if st[i] == 3:  # hit of an old page (literals load fastest: OLD)
                r += 1
                h2r[i] = h1r[i]
                h1r[i] = r
                h2t[i] = h1t[i]
                h1t[i] = t
                if count_hit_bytes:
                    bytes_hit += resident[key_of[i]]
                continue
            x = st[i]
            if x == 1:  # YOUNG: its second reference, the page becomes old (below)
                del young[i]
                if count_hit_bytes:
                    bytes_hit += resident[key_of[i]]
            else:  # a miss
                misses += 1
                bytes_missed += s
                if s > capacity:
                    refused += 1
                    bytes_refused += s
                    continue
                used += s
                while used > capacity:  # evict as ``evict(t, ())`` does
                    v = pop_young(False)[0] if young else pop_top(heap, live, h2r)
                    st[v] = 2  # RET
                    used -= pop_resident(key_of[v])
                resident[key_of[i]] = s
                if not x:  # GONE: a new page starts young
                    r += 1
                    h1t[i] = t
                    h1r[i] = r
                    h2t[i] = neg_inf
                    h2r[i] = 0
                    young[i] = None
                    st[i] = 1  # YOUNG
                    continue
            # a young page's second reference, or a retained page admitted: it becomes old
            r += 1
            q = h1r[i]
            h2r[i] = q
            h1r[i] = r
            h2t[i] = h1t[i]
            h1t[i] = t
            live[i] = q
            push(heap, q << 32 | i)  # 32 is _SHIFT
            st[i] = 3  # OLD
            if x == 2 and len(heap) > compact_at[0]:  # as ``insert`` of a retained page
                _compact(heap, live, compact_at)
    finally:
        refc[0] = r
        count[0] += len(resident) - before
    return misses, bytes_hit, bytes_missed, refused, bytes_refused, used
