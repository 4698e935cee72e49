"""LRU2Policy (LRU-K's default, K=2, CRP 0, RIP unbounded) against the general LRUKPolicy.

The general class with a RIP longer than any test's clock keeps every history as an unbounded
RIP does, so it is the reference model: every operation must give the same victims, order,
histories and reference numbers. Keys come from universes that keep LRU2Policy's dense int
ids, need its key map from the start, or switch to the map part-way.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache import TierCache
from engine.policy import make_policy
from engine.policy.lruk import LRUKPolicy
from engine.policy.lruk2 import LRU2Policy

FOREVER = 1e12  # a RIP no test clock reaches

#: index ``j`` of an operation names key ``universe[j]``
UNIVERSES: dict[str, list[Any]] = {
    "dense": list(range(10)),
    "strings": [f"k{j}" for j in range(10)],
    "far-apart": [2**40 * (j + 1) for j in range(10)],
    "dense+tuple": [*range(9), ("t", 9)],
    "dense+negative": [*range(9), -5],
}

ops = st.lists(
    st.tuples(
        st.sampled_from(["access", "access", "access", "evict", "evict_pinned", "invalidate"]),
        st.integers(0, 9),
        st.sampled_from([0.0, 0.0, 1.0, 2.5]),
    ),
    max_size=120,
)


def test_default_lru_k_is_lru2_and_copies_keep_their_class() -> None:
    fast = make_policy("lru-k")
    assert type(fast) is LRU2Policy
    assert type(make_policy("lru-k", k=2, crp=0.5)) is LRUKPolicy
    assert type(make_policy("lru-k", k=3)) is LRUKPolicy
    assert type(make_policy("lru-k", rip=10.0)) is LRUKPolicy
    general = make_policy("lru-k", k=3, crp=1.0)
    assert type(copy.deepcopy(general)) is LRUKPolicy
    assert type(copy.deepcopy(fast)) is LRU2Policy


@settings(max_examples=150, deadline=None)
@given(steps=ops, universe=st.sampled_from(sorted(UNIVERSES)))
def test_lru2_decides_as_the_general_class(
    steps: list[tuple[str, int, float]], universe: str
) -> None:
    keys = UNIVERSES[universe]
    fast = LRUKPolicy()
    ref = LRUKPolicy(k=2, crp=0.0, rip=FOREVER)
    assert type(fast) is LRU2Policy and type(ref) is LRUKPolicy
    now = 0.0
    seen: list[Any] = []  # keys used so far (looking up others would switch to the map early)
    for op, j, dt in steps:
        key = keys[j]
        if key not in seen:
            seen.append(key)
        now += dt
        if op == "access":
            if key in ref:
                fast.hit(key, now)
                ref.hit(key, now)
            else:
                fast.insert(key, 1, now)
                ref.insert(key, 1, now)
        elif op == "evict":
            assert fast.evict(now) == ref.evict(now)
        elif op == "evict_pinned":
            pinned = {key, seen[(j + 3) % len(seen)]}
            assert fast.victim(now, pinned) == ref.victim(now, pinned)
            assert fast.evict(now, pinned) == ref.evict(now, pinned)
        elif key in ref:
            fast.remove(key, now, evicted=False)
            ref.remove(key, now, evicted=False)
        assert list(fast) == list(ref)
        assert len(fast) == len(ref)
        for k in seen:
            assert (k in fast) == (k in ref)
            assert fast.history(k) == ref.history(k)
            assert fast.history_refs(k) == ref.history_refs(k)
            assert fast.last(k) == ref.last(k)
            assert fast.retained(k, now) == ref.retained(k, now)


def test_trace_keys_index_the_state_directly_and_far_keys_do_not_grow_it() -> None:
    """Dense int keys (as trace replay passes them) keep the key-as-id mode; an int far
    beyond the keys seen switches to the key map instead of allocating up to it."""
    cache = TierCache(capacity=3, policy=make_policy("lru-k"))
    keys = np.array([0, 1, 2, 0, 1, 3, 4, 0, 5], dtype=np.int64)
    cache.access_many(keys.data, [1] * len(keys), [float(t) for t in range(len(keys))])
    policy = cache.policy
    assert isinstance(policy, LRU2Policy)
    assert policy._ids is None and len(policy._state) == 6
    cache.access(2**40, 1, 10.0)
    assert policy._ids is not None and len(policy._state) <= 7
    assert 2**40 in policy and policy.history(2**40) == (10.0, float("-inf"))
    assert policy.history(0) == (7.0, 3.0)
