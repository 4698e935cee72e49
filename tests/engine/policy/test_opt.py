"""`opt` (Belady): never worse than the online policies, optimal on tiny traces."""

from __future__ import annotations

import bisect
from functools import cache

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from engine.cache import TierCache
from engine.errors import InputError
from engine.policy import make_policy
from engine.policy.opt import BeladyPolicy

INF = float("inf")
ONLINE = ["lru", "fifo", "lru-k", "arc"]


def misses(policy: str, trace: list[int], capacity: int) -> int:
    params = {"future": trace} if policy == "opt" else {}
    cache = TierCache(
        capacity=capacity,
        policy=make_policy(policy, **params),
        high_watermark=1.0,
        low_watermark=1.0,
    )
    for t, key in enumerate(trace):
        cache.access(key, 1, float(t))
    return cache.stats.misses


def optimal_misses(trace: list[int], capacity: int) -> int:
    """Fewest misses over every demand-eviction choice (exhaustive search, memoised)."""

    @cache
    def best(i: int, resident: frozenset[int]) -> int:
        if i == len(trace):
            return 0
        key = trace[i]
        if key in resident:
            return best(i + 1, resident)
        if len(resident) < capacity:
            return 1 + best(i + 1, resident | {key})
        return 1 + min(best(i + 1, (resident - {v}) | {key}) for v in sorted(resident))

    return best(0, frozenset())


@given(
    trace=st.lists(st.integers(min_value=0, max_value=4), max_size=10),
    capacity=st.integers(min_value=2, max_value=3),
)
def test_equals_exhaustive_optimum_on_tiny_traces(trace: list[int], capacity: int) -> None:
    assert misses("opt", trace, capacity) == optimal_misses(trace, capacity)


@given(
    trace=st.lists(st.integers(min_value=0, max_value=15), max_size=150),
    capacity=st.integers(min_value=1, max_value=8),
)
def test_never_more_misses_than_online_policies(trace: list[int], capacity: int) -> None:
    best = misses("opt", trace, capacity)
    for name in ONLINE:
        assert best <= misses(name, trace, capacity), name


def test_victim_is_farthest_next_use_and_never_used_again_first() -> None:
    trace = ["a", "b", "c", "a", "d", "b", "a"]
    pol = BeladyPolicy(trace)
    pol.attach(3)
    for t, key in enumerate(trace[:3]):
        pol.insert(key, 1, float(t))
    # next uses: a at 3, b at 5, c never -> c first
    assert pol.victim(3.0) == "c"
    assert pol.victim(3.0, pinned={"c"}) == "b"
    pol.hit("a", 3.0)  # next use of a is now 6
    assert list(pol) == ["c", "a", "b"]
    pol.remove("c", 4.0, evicted=True)
    pol.insert("d", 1, 4.0)  # d never used again; a at 6, b at 5
    assert pol.victim(5.0) == "d"
    assert pol.victim(5.0, pinned={"d"}) == "a"
    assert pol.victim(5.0, pinned={"a", "b", "d"}) is None


def test_ties_among_never_used_again_go_to_the_oldest_reference() -> None:
    pol = BeladyPolicy(["x", "y", "z"])
    pol.attach(3)
    for t, key in enumerate(["x", "y", "z"]):
        pol.insert(key, 1, float(t))
    assert list(pol) == ["x", "y", "z"]
    assert pol.victim(3.0) == "x"


def test_mismatched_reference_is_an_input_error() -> None:
    pol = BeladyPolicy(["a", "b"])
    pol.attach(2)
    pol.insert("a", 1, 0.0)
    with pytest.raises(InputError, match=r"reference 1 is 'c'.*has 'b'"):
        pol.insert("c", 1, 1.0)
    pol.insert("b", 1, 1.0)
    with pytest.raises(InputError, match="end of the string"):
        pol.hit("a", 2.0)


def test_lenient_mode_and_skip_account_for_refused_references() -> None:
    trace = ["a", "big", "b", "a", "big", "b"]
    cache = TierCache(
        capacity=2,
        policy=make_policy("opt", future=trace, strict=False),
        high_watermark=1.0,
        low_watermark=1.0,
    )
    sizes = {"a": 1, "b": 1, "big": 5}  # "big" is refused (larger than the cache)
    for t, key in enumerate(trace):
        cache.access(key, sizes[key], float(t))
    assert cache.stats.refused == 2
    assert cache.stats.hits == 2  # a and b stay resident
    strict = BeladyPolicy(trace)
    strict.attach(2)
    strict.insert("a", 1, 0.0)
    strict.skip()
    strict.insert("b", 1, 2.0)
    assert strict.position == 3


def test_large_trace_victims_are_farthest_next_use() -> None:
    """Big enough for heap compaction; victims checked against bisect over positions."""
    rng = np.random.default_rng(5)
    n_keys = 400
    weights = 1.0 / np.arange(1, n_keys + 1)
    trace = rng.choice(n_keys, size=8000, p=weights / weights.sum()).tolist()
    positions: dict[int, list[int]] = {}
    for i, key in enumerate(trace):
        positions.setdefault(key, []).append(i)
    last_ref: dict[int, int] = {}
    pos = 0
    checked = 0

    def next_use(key: int) -> float:
        lst = positions[key]
        j = bisect.bisect_right(lst, pos)
        return lst[j] if j < len(lst) else INF

    def check(key: int, size: int, color: str | None) -> None:
        nonlocal checked
        checked += 1
        candidates = [*cache, key]
        best = max(candidates, key=lambda q: (next_use(q), -last_ref[q]))
        assert key == best

    cache = TierCache(
        capacity=60,
        policy=BeladyPolicy(trace),
        high_watermark=1.0,
        low_watermark=1.0,
        on_evict=check,
    )
    for pos, key in enumerate(trace):
        cache.access(key, 1, float(pos))
        last_ref[key] = pos
    assert checked > 1000
