"""`fifo` through `TierCache` against a deque reference model (stateful)."""

from __future__ import annotations

from collections import deque

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.cache import TierCache
from tests.engine.policy.pin_rules import PinRules

KEYS = st.integers(min_value=0, max_value=11)


class FIFOModel:
    """Byte-capacity FIFO with pins: evict the oldest admitted unpinned key."""

    def __init__(self, capacity: int, sizes: list[int]) -> None:
        self.capacity = capacity
        self.sizes = sizes
        self.queue: deque[int] = deque()
        self.pins: dict[int, int] = {}

    def used(self) -> int:
        return sum(self.sizes[k] for k in self.queue)

    def access(self, key: int) -> bool:
        if key in self.queue:
            return True  # a hit does not reorder
        size = self.sizes[key]
        pinned_bytes = sum(self.sizes[k] for k in self.pins)
        if self.capacity - pinned_bytes < size:
            return False
        while self.used() + size > self.capacity:
            victim = next(k for k in self.queue if k not in self.pins)
            self.queue.remove(victim)
        self.queue.append(key)
        return False


class FIFOMachine(PinRules, RuleBasedStateMachine):
    @initialize(
        capacity=st.integers(min_value=1, max_value=10),
        unit=st.booleans(),
        sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=12, max_size=12),
    )
    def setup(self, capacity: int, unit: bool, sizes: list[int]) -> None:
        self.sizes = [1] * 12 if unit else sizes
        self.cache = TierCache(
            capacity=capacity, policy="fifo", high_watermark=1.0, low_watermark=1.0
        )
        self.model = FIFOModel(capacity, self.sizes)
        self.now = 0.0

    @rule(key=KEYS)
    def access(self, key: int) -> None:
        self.now += 1.0
        assert self.cache.access(key, self.sizes[key], self.now) == self.model.access(key)

    def pin_counts(self) -> dict[int, int]:
        return self.model.pins

    def pinnable(self) -> list[int]:
        return sorted(self.model.queue)

    @rule(key=KEYS)
    def invalidate(self, key: int) -> None:
        if key in self.model.pins:
            return
        assert self.cache.remove(key, self.now) == (key in self.model.queue)
        if key in self.model.queue:
            self.model.queue.remove(key)

    @invariant()
    def agrees_with_model(self) -> None:
        assert list(self.cache._policy) == list(self.model.queue)
        assert self.cache.used == self.model.used() <= self.cache.capacity
        for key in self.model.pins:
            assert key in self.cache


FIFOMachine.TestCase.settings = settings(stateful_step_count=60)
TestFIFOStateful = FIFOMachine.TestCase


def test_hits_do_not_reorder() -> None:
    cache = TierCache(capacity=2, policy="fifo", high_watermark=1.0, low_watermark=1.0)
    cache.access("a", 1, 0.0)
    cache.access("b", 1, 1.0)
    assert cache.access("a", 1, 2.0)  # hit; a stays the oldest
    cache.access("c", 1, 3.0)
    assert sorted(cache) == ["b", "c"]
