"""The replay loop of :meth:`engine.cache.TierCache.access_many` (its tight path).

Kept apart from :mod:`engine.cache` so the cache module stays small; it reads and updates the
cache's private state as a method of the cache would (``self`` is the cache).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING

from engine.policy.base import EvictionPolicy, Key

if TYPE_CHECKING:
    from engine.cache import TierCache
    from engine.policy.lruk2 import BatchCounts


def access_plain(
    self: TierCache,
    keys: Sequence[Key],
    sizes: Sequence[int],
    times: Sequence[float],
    fixed: bool,
) -> int:
    """The tight loop of :meth:`engine.cache.TierCache.access_many` over cache ``self``
    (preconditions checked there); returns the number of hits.

    A policy with an ``access_batch`` method (the batch protocol of
    :class:`engine.policy.lruk2.LRU2Policy`) runs the whole loop itself, with the same
    steps; otherwise :func:`replay_touch` or :func:`replay_hit` call the policy per access.
    Every loop returns :data:`BatchCounts`, which :func:`book` settles into the cache's
    counters. With ``fixed`` sizes the loops do not count hit bytes: they are the bytes
    accessed less the bytes missed.
    """
    policy, pinned = self._policy, self._pinned  # empty; the policy sees the usual argument
    resident, used, capacity = self._sizes, self.used, self.capacity
    count0 = len(resident)
    # A policy whose hit ignores ``now`` may offer ``touch(key)``, the same step.
    touch = getattr(policy, "touch", None)
    batch = getattr(policy, "access_batch", None)
    if batch is not None:
        counts = batch(keys, sizes, times, resident, used, capacity, not fixed)
    elif fixed and touch is not None:
        counts = replay_touch(policy, touch, pinned, keys, sizes, times, resident, used, capacity)
    else:
        counts = replay_hit(policy, pinned, keys, sizes, times, resident, used, capacity, not fixed)
    if fixed:
        counts = (counts[0], sum(sizes) - counts[2], *counts[2:])
    return book(self, counts, len(keys), used, count0)


def replay_touch(
    policy: EvictionPolicy,
    touch: Callable[[Key], object],
    pinned: Container[Key],
    keys: Sequence[Key],
    sizes: Sequence[int],
    times: Sequence[float],
    resident: dict[Key, int],
    used: int,
    capacity: int,
) -> BatchCounts:
    """The batch protocol by calls: ``touch(key)`` on a hit (``bytes_hit`` not counted: 0),
    ``policy.evict(t, pinned)`` until a fitting miss fits, then ``policy.insert``."""
    insert, evict = policy.insert, policy.evict
    misses = bytes_missed = refused = bytes_refused = 0
    for k, s, t in zip(keys, sizes, times, strict=True):
        if k in resident:
            touch(k)
            continue
        misses += 1
        bytes_missed += s
        if s > capacity:
            refused += 1
            bytes_refused += s
            continue
        used += s
        while used > capacity:
            used -= resident.pop(evict(t, pinned))
        resident[k] = s
        insert(k, s, t)
    return misses, 0, bytes_missed, refused, bytes_refused, used


def replay_hit(
    policy: EvictionPolicy,
    pinned: Container[Key],
    keys: Sequence[Key],
    sizes: Sequence[int],
    times: Sequence[float],
    resident: dict[Key, int],
    used: int,
    capacity: int,
    count_hit_bytes: bool,
) -> BatchCounts:
    """The batch protocol by calls: ``policy.hit`` on a hit (its resident size added to
    ``bytes_hit`` when ``count_hit_bytes``), ``policy.evict(t, pinned)`` until a fitting miss
    fits, then ``policy.insert``."""
    hit, insert, evict = policy.hit, policy.insert, policy.evict
    misses = bytes_hit = bytes_missed = refused = bytes_refused = 0
    for k, s, t in zip(keys, sizes, times, strict=True):
        if k in resident:
            hit(k, t)
            if count_hit_bytes:
                bytes_hit += resident[k]
            continue
        misses += 1
        bytes_missed += s
        if s > capacity:
            refused += 1
            bytes_refused += s
            continue
        used += s
        while used > capacity:
            used -= resident.pop(evict(t, pinned))
        resident[k] = s
        insert(k, s, t)
    return misses, bytes_hit, bytes_missed, refused, bytes_refused, used


def book(self: TierCache, counts: BatchCounts, accesses: int, used0: int, count0: int) -> int:
    """Settle a loop's ``counts`` over ``accesses`` into cache ``self``'s statistics, ``used``
    and uncoloured bytes (``used0`` bytes and ``count0`` objects were resident before it);
    returns the hits. Evictions and admissions follow from the resident set: every miss that
    fits was admitted (nothing is pinned)."""
    misses, bytes_hit, bytes_missed, refused, bytes_refused, used = counts
    hits = accesses - misses
    st = self.stats
    st.hits += hits
    st.misses += misses
    st.bytes_hit += bytes_hit
    st.bytes_missed += bytes_missed
    st.refused += refused
    bytes_in = bytes_missed - bytes_refused
    st.bytes_in += bytes_in
    st.evictions += misses - refused - (len(self._sizes) - count0)
    st.bytes_out += bytes_in - (used - used0)
    self.used = used
    self.color_used[None] = self.color_used.get(None, 0) + used - used0
    return hits
