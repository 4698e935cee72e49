"""`lru-k`: brute-force victims, LRU equivalence, CRP, RIP, pins."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.cache import TierCache
from engine.errors import InputError
from engine.policy import make_policy
from engine.policy.lruk import LRUKPolicy
from tests.engine.policy.pin_rules import PinRules

INF = math.inf
KEYS = st.integers(min_value=0, max_value=9)
SIZES = st.lists(st.integers(min_value=1, max_value=4), min_size=10, max_size=10)


def brute_force_victim(
    refs: list[tuple[int, float]], candidates: list[int], now: float, k: int
) -> int:
    """Max backward K-distance over the raw reference string; LRU among infinite ones.

    Backward K-distance of q at ``now`` = now - time of the K-th most recent reference to q,
    infinite when q has fewer than K references (LRU among those). Ties (several references
    at one time) go by reference order: the page whose K-th most recent reference (last
    reference, among the infinite ones) comes earlier in the string -- O'Neil's clock that
    counts references, where times never tie.
    """
    times: dict[int, list[tuple[float, int]]] = {}
    for index, (key, t) in enumerate(refs):
        times.setdefault(key, []).append((t, index))
    return victim_from_times(times, candidates, now, k)


def victim_from_times(
    times: dict[int, list[tuple[float, int]]], candidates: list[int], now: float, k: int
) -> int:
    """The same rule from each page's (time, position) reference list, oldest first."""
    best, best_rank = None, None
    for q in sorted(candidates):
        mine = times[q]
        ref = mine[-k] if len(mine) >= k else mine[-1]
        dist = now - ref[0] if len(mine) >= k else INF
        rank = (dist, -ref[1])
        if best_rank is None or rank > best_rank:
            best, best_rank = q, rank
    assert best is not None
    return best


class _PinningMachine(PinRules, RuleBasedStateMachine):
    """Shared rules: pin/unpin/invalidate on ``self.cache``; subclasses add accesses."""

    cache: TierCache
    now: float

    def _setup_common(self) -> None:
        self.pins: dict[int, int] = {}
        self.refs: list[tuple[int, float]] = []  # raw references that reached the policy
        self.requests = 0

    @rule(key=KEYS)
    def invalidate(self, key: int) -> None:
        if key in self.pins or key not in self.cache:
            return
        self.cache.remove(key, self.now)
        # An invalidation forgets the page's history.
        self.refs = [(q, t) for q, t in self.refs if q != key]

    def _access(self, key: int, size: int) -> bool:
        self.requests += 1
        hit = self.cache.access(key, size, self.now)
        if key in self.cache:  # refused admissions never reach the policy
            self.refs.append((key, self.now))
        return hit

    @invariant()
    def cache_invariants(self) -> None:
        assert self.cache.used <= self.cache.capacity
        assert self.cache.stats.hits + self.cache.stats.misses == self.requests
        for key in self.pins:
            assert key in self.cache  # pinned pages are never evicted
        assert sorted(self.cache._policy) == sorted(self.cache)


class BruteForceMachine(_PinningMachine):
    """(a) CRP = 0, RIP infinite: every victim is the brute-force max backward K-distance."""

    @initialize(
        capacity=st.integers(min_value=1, max_value=8),
        k=st.integers(min_value=1, max_value=3),
        unit=st.booleans(),
        sizes=SIZES,
    )
    def setup(self, capacity: int, k: int, unit: bool, sizes: list[int]) -> None:
        self._setup_common()
        self.k = k
        self.sizes = [1] * 10 if unit else sizes
        self.now = 0.0
        self.evictions = 0
        self.cache = TierCache(
            capacity=capacity,
            policy=LRUKPolicy(k=k, crp=0.0, rip=None),
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=self._check_victim,
        )

    def _check_victim(self, key: int, size: int, color: str | None) -> None:
        self.evictions += 1
        resident_before = [*self.cache, key]
        candidates = [q for q in resident_before if q not in self.pins]
        assert key == brute_force_victim(self.refs, candidates, self.now, self.k)

    @rule(key=KEYS, dt=st.sampled_from([0.0, 0.25, 1.0, 3.0]))
    def access(self, key: int, dt: float) -> None:
        self.now += dt  # several references at one time are allowed with CRP = 0
        self._access(key, self.sizes[key])


BruteForceMachine.TestCase.settings = settings(stateful_step_count=50)
TestLRUKBruteForce = BruteForceMachine.TestCase


@pytest.mark.slow
class TestLRUKBruteForceLong(BruteForceMachine.TestCase):
    """The same check with many more and longer runs (second test tier: ``-m slow``)."""

    settings = settings(max_examples=400, stateful_step_count=200, deadline=None)


class LRUEquivalenceMachine(_PinningMachine):
    """(b) K = 1, CRP = 0 behaves exactly as `lru`: same hits, residents and evictions."""

    @initialize(capacity=st.integers(min_value=1, max_value=8), unit=st.booleans(), sizes=SIZES)
    def setup(self, capacity: int, unit: bool, sizes: list[int]) -> None:
        self._setup_common()
        self.sizes = [1] * 10 if unit else sizes
        self.now = 0.0
        self.lru_evicted: list[int] = []
        self.lruk_evicted: list[int] = []
        self.lru = TierCache(
            capacity=capacity,
            policy="lru",
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=lambda key, size, color: self.lru_evicted.append(key),
        )
        self.cache = TierCache(
            capacity=capacity,
            policy="lru-k",
            policy_params={"k": 1, "crp": 0.0},
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=lambda key, size, color: self.lruk_evicted.append(key),
        )

    @rule(key=KEYS, dt=st.sampled_from([0.0, 1.0]))
    def access(self, key: int, dt: float) -> None:
        self.now += dt
        expected = self.lru.access(key, self.sizes[key], self.now)
        assert self._access(key, self.sizes[key]) == expected

    # Mirror pins and invalidations on the LRU cache.
    def mirror_pin(self, key: int) -> None:
        self.lru.pin(key)

    def mirror_unpin(self, key: int) -> None:
        self.lru.unpin(key)

    @rule(key=KEYS)
    def invalidate(self, key: int) -> None:
        if key in self.pins or key not in self.cache:
            return
        self.cache.remove(key, self.now)
        self.lru.remove(key, self.now)

    @invariant()
    def same_as_lru(self) -> None:
        assert list(self.cache._policy) == list(self.lru._policy)  # same eviction order
        assert self.lruk_evicted == self.lru_evicted
        assert (self.cache.stats.hits, self.cache.stats.misses) == (
            self.lru.stats.hits,
            self.lru.stats.misses,
        )


LRUEquivalenceMachine.TestCase.settings = settings(stateful_step_count=50)
TestLRUKEqualsLRU = LRUEquivalenceMachine.TestCase


class CRPMachine(_PinningMachine):
    """(c) CRP > 0: a page referenced within CRP of now is evicted only by the fallback."""

    @initialize(
        capacity=st.integers(min_value=1, max_value=6),
        k=st.integers(min_value=1, max_value=3),
        crp=st.sampled_from([0.5, 2.0, 5.0]),
    )
    def setup(self, capacity: int, k: int, crp: float) -> None:
        self._setup_common()
        self.crp = crp
        self.now = 0.0
        self.fallbacks = 0
        self.policy = LRUKPolicy(k=k, crp=crp)
        self.cache = TierCache(
            capacity=capacity,
            policy=self.policy,
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=self._check_victim,
        )

    def _last_ref(self, key: int) -> float:
        return max(t for q, t in self.refs if q == key)

    def _check_victim(self, key: int, size: int, color: str | None) -> None:
        candidates = [q for q in [*self.cache, key] if q not in self.pins]
        eligible = [q for q in candidates if self.now - self._last_ref(q) > self.crp]
        if eligible:
            assert key in eligible

            # Among eligible pages: smallest (HIST(p,K), its reference number); pages with
            # fewer than K references first, by the number of their last reference.
            def rank(q: int) -> tuple[float, int]:
                hist = self.policy.history(q)
                refs = self.policy.history_refs(q)
                assert hist is not None and refs is not None
                return hist[-1], refs[-1] if hist[-1] > -INF else refs[0]

            assert key == min(eligible, key=rank)
        else:
            # Documented fallback: the unpinned page with the oldest LAST, ignoring CRP.
            self.fallbacks += 1
            assert key == min(candidates, key=self._last_ref)
        assert self.policy.last(key) == self._last_ref(key)

    @rule(key=KEYS, dt=st.sampled_from([0.1, 0.3, 1.0, 2.5, 7.0]))
    def access(self, key: int, dt: float) -> None:
        self.now += dt
        self._access(key, 1)


CRPMachine.TestCase.settings = settings(stateful_step_count=50)
TestLRUKCorrelatedPeriod = CRPMachine.TestCase


@pytest.mark.slow
class TestLRUKCorrelatedPeriodLong(CRPMachine.TestCase):
    settings = settings(max_examples=400, stateful_step_count=200, deadline=None)


@pytest.mark.parametrize("k", [2, 3])
def test_large_trace_victims_match_brute_force(k: int) -> None:
    """Big enough for the heap's lazy refresh and stale-entry compaction to run."""
    rng = np.random.default_rng(k)
    n_keys, capacity = 600, 120
    weights = 1.0 / np.arange(1, n_keys + 1)
    keys = rng.choice(n_keys, size=6000, p=weights / weights.sum()).tolist()
    steps = rng.choice([0.0, 1.0], size=len(keys), p=[0.2, 0.8]).tolist()
    invalidate = rng.random(len(keys)) < 0.05
    times: dict[int, list[tuple[float, int]]] = {}
    now = 0.0
    checked = 0

    def check(key: int, size: int, color: str | None) -> None:
        nonlocal checked
        checked += 1
        assert key == victim_from_times(times, [*cache, key], now, k)

    pol = LRUKPolicy(k=k)
    cache = TierCache(
        capacity=capacity, policy=pol, high_watermark=1.0, low_watermark=1.0, on_evict=check
    )
    for index, (key, dt, inval) in enumerate(zip(keys, steps, invalidate, strict=True)):
        now += dt
        if inval and key in cache:
            cache.remove(key, now)  # forgets the history
            del times[key]
            continue
        cache.access(key, 1, now)
        times.setdefault(key, []).append((now, index))
    assert checked > 1000
    assert len(pol._heap) <= 2 * len(cache) + 64 + 1  # stale entries are compacted away


# -- hand-checked examples ---------------------------------------------------------------


def test_correlated_reference_only_updates_last_and_shift_adds_correlation_period() -> None:
    pol = make_policy("lru-k", k=3, crp=5.0)
    assert isinstance(pol, LRUKPolicy)
    pol.attach(10)
    pol.insert("p", 1, 0.0)
    assert pol.history("p") == (0.0, -INF, -INF)
    pol.hit("p", 2.0)  # 2 - LAST(0) <= 5: correlated
    assert pol.history("p") == (0.0, -INF, -INF)
    assert pol.last("p") == 2.0
    pol.hit("p", 10.0)  # 10 - LAST(2) > 5: uncorrelated, correl period = 2 - 0 = 2
    assert pol.history("p") == (10.0, 2.0, -INF)
    pol.hit("p", 12.0)  # correlated again
    pol.hit("p", 30.0)  # correl period = 12 - 10 = 2: HIST(3) = 2 + 2, HIST(2) = 10 + 2
    assert pol.history("p") == (30.0, 12.0, 4.0)
    assert pol.last("p") == 30.0


def test_pages_with_fewer_than_k_references_go_first_lru_among_them() -> None:
    pol = LRUKPolicy(k=2)
    pol.attach(10)
    pol.insert("a", 1, 0.0)
    pol.insert("b", 1, 1.0)
    pol.hit("a", 2.0)  # a has 2 references: finite K-distance
    pol.insert("c", 1, 3.0)
    assert pol.victim(4.0) == "b"  # b and c have one reference; b is the older
    assert pol.victim(4.0, pinned={"b"}) == "c"
    assert pol.victim(4.0, pinned={"b", "c"}) == "a"
    assert pol.victim(4.0, pinned={"a", "b", "c"}) is None
    assert list(pol) == ["b", "c", "a"]


def test_fallback_evicts_oldest_last_when_nothing_is_outside_crp() -> None:
    cache = TierCache(
        capacity=2,
        policy="lru-k",
        policy_params={"k": 2, "crp": 10.0},
        high_watermark=1.0,
        low_watermark=1.0,
    )
    cache.access("a", 1, 0.0)
    cache.access("b", 1, 1.0)
    cache.access("a", 1, 1.5)  # correlated: LAST(a) = 1.5, now b has the oldest LAST
    cache.access("c", 1, 2.0)  # a and b both within CRP: fallback evicts b
    assert sorted(cache) == ["a", "c"]
    cache.pin("a")
    cache.access("d", 1, 3.0)  # c within CRP, a pinned: fallback takes c
    assert sorted(cache) == ["a", "d"]
    cache.access("e", 1, 20.0)  # d eligible now (20 - 3 > 10), a pinned
    assert sorted(cache) == ["a", "e"]


def test_eligible_page_is_preferred_over_in_crp_page_with_larger_distance() -> None:
    pol = LRUKPolicy(k=2, crp=5.0)
    pol.attach(10)
    pol.insert("old", 1, 0.0)
    pol.hit("old", 6.0)  # uncorrelated (6 - 0 > 5): HIST(old) = (6, 0)
    pol.insert("new", 1, 8.0)  # one reference: infinite backward 2-distance
    assert pol.history("old") == (6.0, 0.0)
    assert pol.victim(14.0) == "new"  # both eligible: infinite distance goes first
    assert pol.victim(12.0) == "old"  # "new" is within CRP (12 - 8 <= 5), "old" is not
    assert pol.victim(10.0) == "old"  # both within CRP: fallback, oldest LAST (6 < 8)
    assert pol.victim(10.0, pinned={"old"}) == "new"


def test_history_is_retained_for_rip_and_not_after() -> None:
    pol = LRUKPolicy(k=2, rip=10.0)
    pol.attach(1)
    pol.insert("p", 1, 0.0)
    pol.hit("p", 1.0)
    assert pol.history("p") == (1.0, 0.0)
    pol.remove("p", 2.0, evicted=True)
    assert "p" not in pol
    assert pol.retained("p", 11.0)  # 11 - LAST(1) = 10 <= RIP
    assert not pol.retained("p", 11.5)
    pol.insert("p", 1, 5.0)  # within RIP: old HIST shifted down
    assert pol.history("p") == (5.0, 1.0)
    pol.remove("p", 6.0, evicted=True)
    pol.insert("q", 1, 20.0)  # purges p's history (20 - 6 > 10)
    assert pol.history("p") is None
    pol.remove("q", 21.0, evicted=True)
    pol.insert("p", 1, 30.0)  # after RIP: a fresh page
    assert pol.history("p") == (30.0, -INF)


def test_history_after_rip_is_not_reused_even_before_purge() -> None:
    pol = LRUKPolicy(k=2, rip=1.0)
    pol.attach(1)
    pol.insert("p", 1, 0.0)
    pol.remove("p", 0.5, evicted=True)
    pol.insert("p", 1, 5.0)
    assert pol.history("p") == (5.0, -INF)


def test_infinite_rip_keeps_history_and_invalidation_forgets_it() -> None:
    pol = LRUKPolicy(k=2)
    pol.attach(1)
    pol.insert("p", 1, 0.0)
    pol.remove("p", 1.0, evicted=True)
    pol.insert("p", 1, 1e9)
    assert pol.history("p") == (1e9, 0.0)
    pol.remove("p", 1e9 + 1, evicted=False)  # invalidation: no history kept
    assert pol.history("p") is None
    pol.insert("p", 1, 2e9)
    assert pol.history("p") == (2e9, -INF)


@pytest.mark.parametrize(
    "params",
    [{"k": 0}, {"k": 1.5}, {"crp": -1.0}, {"rip": -2.0}, {"crp": float("nan")}, {"kk": 2}],
)
def test_bad_parameters_are_input_errors(params: dict[str, float]) -> None:
    with pytest.raises(InputError, match="lru-k"):
        make_policy("lru-k", **params)


def test_equal_times_break_by_reference_order() -> None:
    # References a, b, b, a all at t = 0: HIST(a,2) and HIST(b,2) are both 0, but a's second
    # most recent reference (the 1st of the string) precedes b's (the 2nd). Counting
    # references as O'Neil does: backward 2-distances at reference 5 are 5-1 > 5-2, so a goes.
    pol = LRUKPolicy(k=2)
    pol.attach(10)
    pol.insert("a", 1, 0.0)
    pol.insert("b", 1, 0.0)
    pol.hit("b", 0.0)
    pol.hit("a", 0.0)
    assert pol.history("a") == pol.history("b") == (0.0, 0.0)
    assert pol.history_refs("a") == (4, 1) and pol.history_refs("b") == (3, 2)
    assert pol.victim(0.0) == "a"
    assert list(pol) == ["a", "b"]


@given(
    refs=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.0, 1.0])),
        min_size=1,
        max_size=150,
    ),
    capacity=st.integers(1, 4),
    k=st.integers(1, 3),
)
# a@0 b@0 b@1 a@2 c@2: HIST(a,2) = HIST(b,2) = 0, but a's comes first in the string
@example(refs=[(0, 0.0), (1, 0.0), (1, 1.0), (0, 1.0), (2, 0.0)], capacity=2, k=2)
def test_time_clock_with_ties_equals_reference_clock(
    refs: list[tuple[int, float]], capacity: int, k: int
) -> None:
    """With CRP = 0 the victims depend only on reference order, not on tied times."""
    evicted: dict[str, list[int]] = {"time": [], "refs": []}
    caches = {
        clock: TierCache(
            capacity=capacity,
            policy=LRUKPolicy(k=k),
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=lambda key, size, color, log=evicted[clock]: log.append(key),
        )
        for clock in evicted
    }
    now = 0.0
    for index, (key, dt) in enumerate(refs):
        now += dt
        assert caches["time"].access(key, 1, now) == caches["refs"].access(key, 1, float(index))
    assert evicted["time"] == evicted["refs"]
    assert list(caches["time"]._policy) == list(caches["refs"]._policy)


def test_a_reference_exactly_crp_after_last_is_correlated() -> None:
    """The rule is ``t - LAST(p) > crp`` for an uncorrelated reference: at exactly ``crp``
    only LAST moves (times chosen so that the differences are exact in binary)."""
    pol = make_policy("lru-k", k=3, crp=1.0)
    assert isinstance(pol, LRUKPolicy)
    pol.attach(10)
    pol.insert("p", 1, 0.0)
    pol.hit("p", 1.0)  # 1 - 0 == crp: correlated
    assert pol.history("p") == (0.0, -INF, -INF) and pol.last("p") == 1.0
    pol.hit("p", 2.5)  # 2.5 - 1 > crp: uncorrelated, correlation period 1 - 0 = 1
    assert pol.history("p") == (2.5, 1.0, -INF) and pol.last("p") == 2.5
