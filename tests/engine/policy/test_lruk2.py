"""LRU2Policy (LRU-K's default, K=2, CRP 0, RIP unbounded) against the general LRUKPolicy.

The general class with a RIP longer than any test's clock keeps every history as an unbounded
RIP does, so it is the reference model: every operation must give the same victims, order,
histories and reference numbers.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.policy import make_policy
from engine.policy.lruk import LRUKPolicy
from engine.policy.lruk2 import LRU2Policy

FOREVER = 1e12  # a RIP no test clock reaches

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
@given(steps=ops)
def test_lru2_decides_as_the_general_class(steps: list[tuple[str, int, float]]) -> None:
    fast = LRUKPolicy()
    ref = LRUKPolicy(k=2, crp=0.0, rip=FOREVER)
    assert type(fast) is LRU2Policy and type(ref) is LRUKPolicy
    now = 0.0
    for op, key, dt in steps:
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
            pinned = {key, (key + 3) % 10}
            assert fast.victim(now, pinned) == ref.victim(now, pinned)
            assert fast.evict(now, pinned) == ref.evict(now, pinned)
        elif key in ref:
            fast.remove(key, now, evicted=False)
            ref.remove(key, now, evicted=False)
        assert list(fast) == list(ref)
        assert len(fast) == len(ref)
        for k in range(10):
            assert (k in fast) == (k in ref)
            assert fast.history(k) == ref.history(k)
            assert fast.history_refs(k) == ref.history_refs(k)
            assert fast.last(k) == ref.last(k)
            assert fast.retained(k, now) == ref.retained(k, now)
