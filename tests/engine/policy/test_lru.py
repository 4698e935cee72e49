"""`lru` through `TierCache` against an OrderedDict reference model (stateful)."""

from __future__ import annotations

from collections import OrderedDict

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.cache import TierCache
from tests.engine.policy.pin_rules import PinRules

KEYS = st.integers(min_value=0, max_value=11)


class LRUModel:
    """A byte-capacity LRU cache with pins, written from the definition."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.order: OrderedDict[int, int] = OrderedDict()  # key -> size, LRU first
        self.pins: dict[int, int] = {}
        self.hits = 0
        self.misses = 0

    def used(self) -> int:
        return sum(self.order.values())

    def access(self, key: int, size: int) -> bool:
        if key in self.order:
            self.order.move_to_end(key)
            self.hits += 1
            return True
        self.misses += 1
        pinned_bytes = sum(self.order[k] for k in self.pins)
        if size > self.capacity or self.capacity - pinned_bytes < size:
            return False  # refused, nothing evicted
        while self.used() + size > self.capacity:
            victim = next(k for k in self.order if k not in self.pins)
            del self.order[victim]
        self.order[key] = size
        return False


class LRUMachine(PinRules, RuleBasedStateMachine):
    """Random accesses, pins, unpins and invalidations; cache and model must agree."""

    @initialize(
        capacity=st.integers(min_value=1, max_value=12),
        unit=st.booleans(),
        sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=12, max_size=12),
    )
    def setup(self, capacity: int, unit: bool, sizes: list[int]) -> None:
        self.sizes = [1] * 12 if unit else sizes
        self.cache = TierCache(
            capacity=capacity, policy="lru", high_watermark=1.0, low_watermark=1.0
        )
        self.model = LRUModel(capacity)
        self.now = 0.0
        self.requests = 0

    @rule(key=KEYS)
    def access(self, key: int) -> None:
        self.now += 1.0
        self.requests += 1
        got = self.cache.access(key, self.sizes[key], self.now)
        assert got == self.model.access(key, self.sizes[key])

    def pin_counts(self) -> dict[int, int]:
        return self.model.pins

    def pinnable(self) -> list[int]:
        return sorted(self.model.order)

    @rule(key=KEYS)
    def invalidate(self, key: int) -> None:
        if key in self.model.pins:
            return
        removed = self.cache.remove(key, self.now)
        assert removed == (key in self.model.order)
        self.model.order.pop(key, None)

    @invariant()
    def agrees_with_model(self) -> None:
        # Same resident set, in the same LRU order.
        assert list(self.cache._policy) == list(self.model.order)
        assert sorted(self.cache) == sorted(self.model.order)
        assert self.cache.used == self.model.used() <= self.cache.capacity
        stats = self.cache.stats
        assert (stats.hits, stats.misses) == (self.model.hits, self.model.misses)
        assert stats.hits + stats.misses == self.requests
        # Pinned keys are never evicted.
        for key in self.model.pins:
            assert key in self.cache


LRUMachine.TestCase.settings = settings(stateful_step_count=60)
TestLRUStateful = LRUMachine.TestCase


def test_lru_evicts_least_recent_hand_checked() -> None:
    cache = TierCache(capacity=3, policy="lru", high_watermark=1.0, low_watermark=1.0)
    for t, key in enumerate(["a", "b", "c", "a", "d"]):
        cache.access(key, 1, float(t))
    # "b" was the least recently used when "d" came.
    assert sorted(cache) == ["a", "c", "d"]
    cache.pin("c")
    cache.access("e", 1, 5.0)  # LRU order is c, a, d; c is pinned, so a goes
    assert sorted(cache) == ["c", "d", "e"]


def test_one_step_evict_removes_what_victim_names_with_and_without_pins() -> None:
    """``evict`` (the replay loop's one-step eviction) chooses exactly as ``victim``: the
    least recently referenced key, also on its fast path with nothing pinned."""
    from engine.policy.lru import LRUPolicy

    pol = LRUPolicy()
    for t, key in enumerate("abcd"):
        pol.insert(key, 1, float(t))
    pol.hit("a", 4.0)  # recency order now b, c, d, a
    assert pol.victim(5.0) == "b" and pol.evict(5.0) == "b"
    assert pol.evict(5.0, pinned={"c"}) == "d"
    assert list(pol) == ["c", "a"] and pol.evict(6.0) == "c"
    assert list(pol) == ["a"] and pol.evict(6.0) == "a" and pol.evict(6.0) is None
