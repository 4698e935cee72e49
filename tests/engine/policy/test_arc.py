"""`arc`: the paper's invariants (stateful), a paper-structured reference model, a
hand-checked sequence and scan resistance."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.cache import TierCache
from engine.policy.arc import ARCPolicy
from tests.engine.policy.pin_rules import PinRules

KEYS = st.integers(min_value=0, max_value=15)


def _arc_cache(capacity: int) -> tuple[TierCache, ARCPolicy]:
    pol = ARCPolicy()
    cache = TierCache(capacity=capacity, policy=pol, high_watermark=1.0, low_watermark=1.0)
    return cache, pol


class ARCInvariantMachine(PinRules, RuleBasedStateMachine):
    """Accesses, pins and invalidations; the paper's invariants hold in bytes after each."""

    @initialize(
        capacity=st.integers(min_value=1, max_value=10),
        unit=st.booleans(),
        sizes=st.lists(st.integers(min_value=1, max_value=4), min_size=16, max_size=16),
    )
    def setup(self, capacity: int, unit: bool, sizes: list[int]) -> None:
        self.unit = unit
        self.sizes = [1] * 16 if unit else sizes
        self.cache, self.pol = _arc_cache(capacity)
        self.c = capacity
        self.now = 0.0
        self.pins: dict[int, int] = {}

    @rule(key=KEYS)
    def access(self, key: int) -> None:
        self.now += 1.0
        self.cache.access(key, self.sizes[key], self.now)

    @rule(key=KEYS)
    def invalidate(self, key: int) -> None:
        if key not in self.pins and self.cache.remove(key, self.now):
            # No ghost is kept for an invalidated key.
            assert key not in self.pol.b1 and key not in self.pol.b2

    @invariant()
    def paper_invariants(self) -> None:
        pol, c = self.pol, self.c
        t1, t2, b1, b2 = pol.t1, pol.t2, pol.b1, pol.b2
        s1, s2, g1, g2 = pol.list_bytes()
        for keys, total in ((t1, s1), (t2, s2), (b1, g1), (b2, g2)):
            assert sum(self.sizes[k] for k in keys) == total
        if self.unit:
            assert (s1, s2, g1, g2) == (len(t1), len(t2), len(b1), len(b2))
        assert s1 + s2 <= c
        assert s1 + g1 <= c
        assert s1 + s2 + g1 + g2 <= 2 * c
        assert 0 <= pol.p <= c
        all_keys = [*t1, *t2, *b1, *b2]
        assert len(all_keys) == len(set(all_keys))  # pairwise disjoint
        assert sorted([*t1, *t2]) == sorted(self.cache)
        for key in self.pins:
            assert key in self.cache


ARCInvariantMachine.TestCase.settings = settings(stateful_step_count=60)
TestARCInvariants = ARCInvariantMachine.TestCase


class PaperARC:
    """ARC(c) for unit sizes written case by case from the paper's pseudocode.

    Only the two documented protocol differences are applied: REPLACE runs before ``p`` is
    adapted on a ghost hit, and REPLACE does not look at ``x`` (no ``x in B2`` tie rule).
    Case IV keeps the paper's order (delete ghosts, then REPLACE).
    """

    def __init__(self, c: int) -> None:
        self.c = c
        self.p = 0.0
        self.t1: list[int] = []
        self.t2: list[int] = []
        self.b1: list[int] = []
        self.b2: list[int] = []

    def _replace(self) -> None:
        if self.t1 and (len(self.t1) > self.p or not self.t2):
            self.b1.append(self.t1.pop(0))
        else:
            self.b2.append(self.t2.pop(0))

    def access(self, x: int) -> bool:
        c = self.c
        if x in self.t1 or x in self.t2:  # case I
            (self.t1 if x in self.t1 else self.t2).remove(x)
            self.t2.append(x)
            return True
        if x in self.b1:  # case II
            if len(self.t1) + len(self.t2) == c:
                self._replace()
            self.p = min(c, self.p + max(1.0, len(self.b2) / len(self.b1)))
            self.b1.remove(x)
            self.t2.append(x)
            return False
        if x in self.b2:  # case III
            if len(self.t1) + len(self.t2) == c:
                self._replace()
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            self.b2.remove(x)
            self.t2.append(x)
            return False
        l1 = len(self.t1) + len(self.b1)  # case IV
        l2 = len(self.t2) + len(self.b2)
        if l1 == c:
            if len(self.t1) < c:
                self.b1.pop(0)
                self._replace()
            else:
                self.t1.pop(0)
        elif l1 + l2 >= c:
            if l1 + l2 == 2 * c:
                self.b2.pop(0)
            self._replace()
        self.t1.append(x)
        return False


@given(
    capacity=st.integers(min_value=1, max_value=6),
    trace=st.lists(st.integers(min_value=0, max_value=12), max_size=120),
)
def test_matches_paper_structured_reference_on_unit_sizes(capacity: int, trace: list[int]) -> None:
    cache, pol = _arc_cache(capacity)
    ref = PaperARC(capacity)
    for t, key in enumerate(trace):
        assert cache.access(key, 1, float(t)) == ref.access(key)
        assert (pol.t1, pol.t2, pol.b1, pol.b2) == (
            tuple(ref.t1),
            tuple(ref.t2),
            tuple(ref.b1),
            tuple(ref.b2),
        )
        assert pol.p == ref.p


def test_hand_checked_sequence() -> None:
    cache, pol = _arc_cache(3)
    hits = [cache.access(k, 1, float(t)) for t, k in enumerate([1, 2, 3, 1, 4, 2, 5, 1, 6])]
    assert hits == [False, False, False, True, False, False, False, False, False]
    # 1,2,3 fill T1; 1 hits -> T2; 4 evicts 2 (|T1|=2 > p=0) to B1; 2 is a B1 ghost hit:
    # 3 is evicted, p -> 1, 2 -> T2; 5: |T1|=1 is not > p=1, so 1 goes from T2 to B2;
    # 1 is a B2 ghost hit: 4 is evicted (|T1|=2 > 1), p -> 0; 6: 5 is evicted to B1 and
    # |T1|+|B1| = 4 > 3 drops ghost 3.
    assert pol.t1 == (6,)
    assert pol.t2 == (2, 1)
    assert pol.b1 == (4, 5)
    assert pol.b2 == ()
    assert pol.p == 0.0


def test_byte_sizes_adapt_p_by_object_size() -> None:
    cache, pol = _arc_cache(10)
    cache.access("a", 4, 0.0)
    cache.access("a", 4, 1.0)  # a -> T2
    cache.access("b", 4, 2.0)
    cache.access("c", 2, 3.0)  # full: 10 bytes
    cache.access("d", 2, 4.0)  # |T1| = 6 > p = 0: b goes to B1; |T1| + |B1| = 8 <= 10
    assert (pol.t1, pol.t2, pol.b1) == (("c", "d"), ("a",), ("b",))
    # Ghost hit on b: REPLACE first frees room (c: T1 = 4 > p = 0) and then
    # p += size(b) * max(1, |B2| / |B1|) = 4 bytes.
    assert not cache.access("b", 4, 5.0)
    assert (pol.t1, pol.t2, pol.b1, pol.b2) == (("d",), ("a", "b"), ("c",), ())
    assert pol.p == 4.0
    assert pol.list_bytes() == (2, 8, 2, 0)


@settings(max_examples=40)
@given(
    capacity=st.integers(min_value=4, max_value=20),
    hot_fraction=st.floats(min_value=0.1, max_value=0.5),
    rounds=st.integers(min_value=2, max_value=4),
    scan_factor=st.integers(min_value=2, max_value=5),
)
def test_one_time_scan_does_not_flush_frequent_set(
    capacity: int, hot_fraction: float, rounds: int, scan_factor: int
) -> None:
    hot = [f"hot{i}" for i in range(max(1, int(capacity * hot_fraction)))]
    scan = [f"scan{i}" for i in range(scan_factor * capacity)]
    trace = hot * rounds + scan
    arc, _ = _arc_cache(capacity)
    lru = TierCache(capacity=capacity, policy="lru", high_watermark=1.0, low_watermark=1.0)
    for t, key in enumerate(trace):
        arc.access(key, 1, float(t))
        lru.access(key, 1, float(t))
    assert all(k in arc for k in hot)  # ARC keeps the frequently used set ...
    assert not any(k in lru for k in hot)  # ... which the scan flushes out of LRU
