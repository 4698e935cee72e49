"""The replay loop of :meth:`engine.cache.TierCache.access_many` (its tight path).

Kept apart from :mod:`engine.cache` so the cache module stays small; it reads and updates the
cache's private state as a method of the cache would (``self`` is the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.policy.base import Key

if TYPE_CHECKING:
    from engine.cache import TierCache


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
    steps; otherwise the loop here calls the policy per access. Per access it does only what
    ``access`` would do in this state: a hit calls ``policy.hit`` (or ``policy.touch(key)``
    when the policy offers it, the same step for a policy that ignores ``now``); a miss of an
    object that fits calls ``policy.evict`` until it fits, then ``policy.insert``. Hits are
    the accesses that were not misses; evictions and admissions follow from the resident set
    at the end (every miss that fits is admitted: nothing is pinned). The loops differ only
    in the hit call and in how hit bytes are counted.
    """
    policy = self._policy
    hit, insert, evict = policy.hit, policy.insert, policy.evict
    resident = self._sizes
    pinned = self._pinned  # empty; passed so the policy sees the usual argument
    capacity = self.capacity
    used = used0 = self.used
    count0 = len(resident)
    misses = bytes_hit = bytes_missed = refused = bytes_refused = 0
    # A policy whose hit ignores ``now`` may offer ``touch(key)``, the same step.
    touch = getattr(policy, "touch", None)
    batch = getattr(policy, "access_batch", None)
    if batch is not None:
        misses, bytes_hit, bytes_missed, refused, bytes_refused, used = batch(
            keys, sizes, times, resident, used, capacity, not fixed
        )
        if fixed:
            bytes_hit = sum(sizes) - bytes_missed
    elif fixed and touch is not None:
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
        bytes_hit = sum(sizes) - bytes_missed
    elif fixed:
        for k, s, t in zip(keys, sizes, times, strict=True):
            if k in resident:
                hit(k, t)
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
        bytes_hit = sum(sizes) - bytes_missed
    else:
        for k, s, t in zip(keys, sizes, times, strict=True):
            if k in resident:
                hit(k, t)
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
    hits = len(keys) - misses
    st = self.stats
    st.hits += hits
    st.misses += misses
    st.bytes_hit += bytes_hit
    st.bytes_missed += bytes_missed
    st.refused += refused
    bytes_in = bytes_missed - bytes_refused
    st.bytes_in += bytes_in
    st.evictions += misses - refused - (len(resident) - count0)
    st.bytes_out += bytes_in - (used - used0)
    self.used = used
    self.color_used[None] = self.color_used.get(None, 0) + used - used0
    return hits
