"""`pin` through `TierCache` against a reference model (stateful), and the cyclic layer scan
that motivates it: LRU gets no hits, `pin` keeps its pinned bytes, OPT bounds both."""

from __future__ import annotations

from collections import OrderedDict

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.cache import TierCache
from engine.errors import InputError
from engine.policy import make_policy
from engine.policy.pin import PinPolicy
from tests.engine.policy.pin_rules import PinRules

KEYS = st.integers(min_value=0, max_value=11)


class PinModel:
    """A byte-capacity cache with a pinned set and an LRU stream region, from the rules in
    the policy's docstring: a key joins the pinned set at insertion if it fits the budget;
    victims are the LRU unpinned stream keys, then pinned-set keys newest first."""

    def __init__(self, capacity: int, budget: int) -> None:
        self.capacity = capacity
        self.budget = budget
        self.pinned_set: OrderedDict[int, int] = OrderedDict()  # key -> size, oldest first
        self.stream: OrderedDict[int, int] = OrderedDict()  # key -> size, LRU first
        self.pins: dict[int, int] = {}  # the cache's pins (objects in use)
        self.hits = 0
        self.misses = 0

    def size_of(self, key: int) -> int:
        return self.pinned_set.get(key) or self.stream[key]

    def resident(self) -> list[int]:
        return list(self.stream) + list(reversed(self.pinned_set))  # eviction order

    def used(self) -> int:
        return sum(self.pinned_set.values()) + sum(self.stream.values())

    def access(self, key: int, size: int) -> bool:
        if key in self.stream or key in self.pinned_set:
            if key in self.stream:
                self.stream.move_to_end(key)
            self.hits += 1
            return True
        self.misses += 1
        pinned_bytes = sum(self.size_of(k) for k in self.pins)
        if size > self.capacity or self.capacity - pinned_bytes < size:
            return False  # refused, nothing evicted
        while self.used() + size > self.capacity:
            victim = next(k for k in self.resident() if k not in self.pins)
            self.drop(victim)
        if sum(self.pinned_set.values()) + size <= self.budget:
            self.pinned_set[key] = size
        else:
            self.stream[key] = size
        return False

    def drop(self, key: int) -> None:
        if key in self.pinned_set:
            del self.pinned_set[key]
        else:
            del self.stream[key]


class PinMachine(PinRules, RuleBasedStateMachine):
    """Random accesses, pins, unpins and invalidations; cache and model must agree."""

    @initialize(
        capacity=st.integers(min_value=1, max_value=12),
        unit=st.booleans(),
        sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=12, max_size=12),
        fraction=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
        pinned_bytes=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    )
    def setup(
        self,
        capacity: int,
        unit: bool,
        sizes: list[int],
        fraction: float,
        pinned_bytes: int | None,
    ) -> None:
        self.sizes = [1] * 12 if unit else sizes
        self.cache = TierCache(
            capacity=capacity,
            policy="pin",
            policy_params={"fraction": fraction, "pinned_bytes": pinned_bytes},
            high_watermark=1.0,
            low_watermark=1.0,
        )
        budget = int(fraction * capacity) if pinned_bytes is None else min(pinned_bytes, capacity)
        self.model = PinModel(capacity, budget)
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
        return sorted(self.model.resident())

    @rule(key=KEYS)
    def invalidate(self, key: int) -> None:
        if key in self.model.pins:
            return
        removed = self.cache.remove(key, self.now)
        assert removed == (key in self.model.resident())
        if removed:
            self.model.drop(key)

    @invariant()
    def agrees_with_model(self) -> None:
        policy = self.cache._policy
        assert isinstance(policy, PinPolicy)
        assert policy.budget == self.model.budget
        # Same resident keys, same split, same eviction order.
        assert list(policy) == self.model.resident()
        assert [k for k in policy if policy.in_pinned_set(k)] == list(
            reversed(self.model.pinned_set)
        )
        assert policy.pinned_used == sum(self.model.pinned_set.values()) <= policy.budget
        assert self.cache.used == self.model.used() <= self.cache.capacity
        stats = self.cache.stats
        assert (stats.hits, stats.misses) == (self.model.hits, self.model.misses)
        assert stats.hits + stats.misses == self.requests
        for key in self.model.pins:
            assert key in self.cache


PinMachine.TestCase.settings = settings(stateful_step_count=60)
TestPinStateful = PinMachine.TestCase


# -- the cyclic layer scan ---------------------------------------------------------------------
def _scan_hits(policy: str, n_chunks: int, capacity: int, cycles: int, **params: object) -> int:
    """Hits of ``cycles`` scans over chunks 0..n_chunks-1 (1 byte each) in a ``capacity``
    cache; ``opt`` gets the whole reference string as its future."""
    refs = [k for _ in range(cycles) for k in range(n_chunks)]
    if policy == "opt":
        params = {**params, "future": refs}
    cache = TierCache(
        capacity, make_policy(policy, **params), high_watermark=1.0, low_watermark=1.0
    )
    for t, key in enumerate(refs):
        cache.access(key, 1, float(t))
    return cache.stats.hits


def test_cyclic_scan_lru_zero_pin_keeps_its_set_hand_checked() -> None:
    # A 10-chunk model scanned 5 times through a 6-chunk cache.
    # LRU: when chunk k comes back, the 9 others were used since: stack distance 10 > 6, so it
    # was evicted -- 0 hits out of 50.
    assert _scan_hits("lru", 10, 6, 5) == 0
    assert _scan_hits("fifo", 10, 6, 5) == 0
    # pin, budget 4 of 6: chunks 0-3 join the pinned set in the first scan and hit in each of
    # the 4 later scans (16 hits); 4-9 cycle through 2 chunks of LRU space and never hit.
    assert _scan_hits("pin", 10, 6, 5, fraction=4 / 6) == 4 * 4
    # Budget 5 of 6 (one chunk of stream space): 5 hits per later scan.
    assert _scan_hits("pin", 10, 6, 5, pinned_bytes=5) == 5 * 4
    # Belady's MIN keeps capacity - 1 = 5 chunks per scan as well (and a few more where scans
    # overlap its choices): an upper bound for every online policy.
    opt = _scan_hits("opt", 10, 6, 5)
    assert opt >= 5 * 4


@settings(max_examples=40, deadline=None)
@given(
    n_chunks=st.integers(2, 30),
    capacity=st.integers(1, 29),
    cycles=st.integers(2, 6),
    budget=st.integers(0, 29),
)
def test_cyclic_scan_pin_hits_exactly_its_budget(
    n_chunks: int, capacity: int, cycles: int, budget: int
) -> None:
    capacity = min(capacity, n_chunks - 1)  # the model does not fit
    pinned = min(budget, capacity - 1)  # leave one chunk of stream space
    assert _scan_hits("lru", n_chunks, capacity, cycles) == 0
    hits = _scan_hits("pin", n_chunks, capacity, cycles, pinned_bytes=pinned)
    assert hits == pinned * (cycles - 1)
    assert hits <= _scan_hits("opt", n_chunks, capacity, cycles)


@settings(max_examples=40, deadline=None)
@given(
    refs=st.lists(st.integers(0, 9), min_size=1, max_size=80),
    sizes=st.lists(st.integers(1, 5), min_size=10, max_size=10),
    capacity=st.integers(1, 15),
)
def test_fraction_zero_is_lru(refs: list[int], sizes: list[int], capacity: int) -> None:
    caches = [
        TierCache(capacity, make_policy(name, **p), high_watermark=1.0, low_watermark=1.0)
        for name, p in (("lru", {}), ("pin", {"fraction": 0.0}))
    ]
    for t, key in enumerate(refs):
        got = [c.access(key, sizes[key], float(t)) for c in caches]
        assert got[0] == got[1]
        assert list(caches[0]._policy) == list(caches[1]._policy)


def test_in_use_stream_keys_make_the_pinned_set_give_way_newest_first() -> None:
    cache = TierCache(4, "pin", {"pinned_bytes": 3}, high_watermark=1.0, low_watermark=1.0)
    for t, key in enumerate("abcd"):  # a, b, c join the pinned set; d streams
        cache.access(key, 1, float(t))
    cache.pin("d")  # d is being computed on
    cache.access("e", 1, 4.0)  # no evictable stream key: c (newest pinned) goes, e joins
    assert sorted(cache) == ["a", "b", "d", "e"]
    policy = cache._policy
    assert isinstance(policy, PinPolicy)
    assert [policy.in_pinned_set(k) for k in "abde"] == [True, True, False, True]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"fraction": 1.5}, "fraction must be in"),
        ({"fraction": -0.1}, "fraction must be in"),
        ({"pinned_bytes": "12 GBB"}, "pinned_bytes|size"),
        ({"layers": 3}, "allowed: fraction, pinned_bytes"),
    ],
)
def test_bad_parameters_are_input_errors(params: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        make_policy("pin", **params)


def test_budget_from_size_string_and_capped_at_capacity() -> None:
    def budget(capacity: int, **params: object) -> int:
        policy = make_policy("pin", **params)
        TierCache(capacity, policy)  # attaches the policy to the capacity
        assert isinstance(policy, PinPolicy)
        return policy.budget

    assert budget(2**20, pinned_bytes="256KiB") == 2**18
    assert budget(100, pinned_bytes=1000) == 100
    assert budget(100, fraction=0.333) == 33
    assert budget(100) == 75  # the default fraction
