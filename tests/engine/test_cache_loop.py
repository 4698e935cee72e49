"""The cache's per-call replay loop (:func:`engine.cache_loop.replay_hit`, which calls
``hit``/``evict``/``insert`` per access) against ``TierCache.access`` one access at a time,
for the policies that have neither an ``access_batch`` nor a ``touch`` of their own.

LRU (``replay_touch`` with fixed sizes, ``replay_hit`` otherwise) and LRU-2 (its
``access_batch``) are checked after every access in
:mod:`tests.engine.policy.test_batch_replay`; the scenarios (keys, sizes fixed per key or
not, clocks, runs replayed in one ``access_many`` call or access by access) come from there.
The state after the whole trace must be the same: counters, used bytes, resident keys in
order and the policy's victim order.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache import TierCache
from engine.policy import make_policy
from tests.engine.policy.test_batch_replay import replay_runs, scenarios, state

#: policies whose replay goes through ``replay_hit`` whatever the sizes
PER_CALL = ("fifo", "arc", "pin", "priority", "color-lru")


def test_the_policies_here_have_no_fast_path_of_their_own() -> None:
    for name in PER_CALL:
        policy = make_policy(name)
        assert not hasattr(policy, "access_batch") and not hasattr(policy, "touch"), name


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(PER_CALL), sc=scenarios())
def test_per_call_loop_decides_as_access(name: str, sc: dict[str, Any]) -> None:
    accesses, capacity, universe = sc["accesses"], sc["capacity"], sc["universe"]
    ref = TierCache(capacity=capacity, policy=make_policy(name))
    for k, s, t in accesses:
        ref.access(k, s, t)
    got = replay_runs(
        name, capacity, accesses, sc["runs"], sc["fixed"], len(accesses), sc["container"]
    )
    assert state(got, universe) == state(ref, universe)
