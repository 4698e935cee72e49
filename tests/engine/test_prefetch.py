"""Tests for engine.prefetch: heat decay against a reference model, and planner ordering rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.prefetch import HeatMap, PrefetchPlanner


def test_heat_halves_after_half_life() -> None:
    hm = HeatMap(half_life=10.0)
    hm.record(["a", "a", "b"], now=0.0)
    assert hm.heat("a", 0.0) == pytest.approx(2.0)
    assert hm.heat("a", 10.0) == pytest.approx(1.0)
    assert hm.heat("a", 30.0) == pytest.approx(0.25)
    assert hm.heat("zzz", 30.0) == 0.0
    hm.record(["b"], now=30.0)
    assert hm.heat("b", 30.0) == pytest.approx(1.0 + 0.125)


def test_hottest_orders_by_heat_then_key() -> None:
    hm = HeatMap(half_life=5.0)
    hm.record([3, 1, 2, 2, 9], now=0.0)
    hm.record([9, 9], now=5.0)  # 9: 0.5 + 2 = 2.5
    assert hm.hottest(3, now=5.0) == [9, 2, 1]  # 2 has 2*0.5 = 1.0 > 0.5
    assert hm.hottest(10, now=5.0) == [9, 2, 1, 3]  # 1 and 3 tie -> key order
    assert hm.hottest(0, now=5.0) == []


def test_time_never_runs_backwards_and_prune() -> None:
    hm = HeatMap(half_life=1.0)
    hm.record(["x"], now=5.0)
    with pytest.raises(ValueError):
        hm.heat("x", now=4.0)
    hm.record(["y"], now=20.0)
    assert hm.prune(now=20.0, below=0.01) == 1
    assert "x" not in hm and "y" in hm and len(hm) == 1
    with pytest.raises(ValueError):
        HeatMap(half_life=0)


class HeatMapMachine(RuleBasedStateMachine):
    """HeatMap vs a reference that keeps every access time and sums 2^-(age/half_life)."""

    @initialize(half_life=st.sampled_from([0.5, 3.0, 10.0]))
    def setup(self, half_life: float) -> None:
        self.hm = HeatMap(half_life)
        self.half_life = half_life
        self.now = 0.0
        self.log: dict[str, list[float]] = {}

    def ref(self, key: str) -> float:
        return sum(2.0 ** (-(self.now - t) / self.half_life) for t in self.log.get(key, []))

    @rule(dt=st.floats(0.0, 7.0, allow_nan=False))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(keys=st.lists(st.sampled_from("abcde"), max_size=4))
    def record(self, keys: list[str]) -> None:
        self.hm.record(keys, self.now)
        for k in keys:
            self.log.setdefault(k, []).append(self.now)

    @invariant()
    def heats_match(self) -> None:
        for key in "abcdef":
            assert self.hm.heat(key, self.now) == pytest.approx(self.ref(key), rel=1e-9, abs=1e-12)

    @invariant()
    def hottest_is_sorted(self) -> None:
        top = self.hm.hottest(5, self.now)
        heats = [self.ref(k) for k in top]
        assert all(a >= b - 1e-9 for a, b in itertools.pairwise(heats))


TestHeatMapMachine = HeatMapMachine.TestCase


def test_plan_critical_first_then_heat_then_key() -> None:
    hm = HeatMap()
    hm.record(["hot", "hot", "warm"], now=0.0)
    planner = PrefetchPlanner(window_batches=3, heat=hm)
    upcoming = [["c", "b", "warm"], ["hot", "a", "b"], ["z"], ["beyond"]]
    plan = planner.plan(upcoming, resident=set(), in_flight=set(), now=0.0)
    assert plan == [(0, "warm"), (0, "b"), (0, "c"), (1, "hot"), (1, "a"), (2, "z")]


def test_plan_excludes_resident_and_in_flight() -> None:
    planner = PrefetchPlanner(window_batches=5)
    upcoming = [[1, 2, 3], [4, 5, 1]]
    plan = planner.plan(upcoming, resident={2}, in_flight=[5], now=0.0)
    assert plan == [(0, 1), (0, 3), (1, 4)]


def test_plan_respects_budget() -> None:
    planner = PrefetchPlanner(window_batches=3)
    sizes = {1: 40, 2: 40, 3: 10, 4: 5}
    plan = planner.plan([[1, 2], [3, 4]], (), (), 0.0, budget_bytes=85, size_of=sizes.__getitem__)
    assert plan == [(0, 1), (0, 2)]  # 3 (10 B) would exceed 85 -> stop, don't skip ahead
    with pytest.raises(ValueError):
        planner.plan([[1]], (), (), 0.0, budget_bytes=10)
    with pytest.raises(ValueError):
        PrefetchPlanner(window_batches=0)


@given(
    upcoming=st.lists(st.lists(st.integers(0, 30), max_size=8), max_size=7),
    resident=st.frozensets(st.integers(0, 30)),
    in_flight=st.frozensets(st.integers(0, 30)),
    window=st.integers(1, 5),
    accesses=st.lists(st.integers(0, 30), max_size=40),
    budget=st.one_of(st.none(), st.integers(0, 400)),
)
def test_plan_properties(upcoming, resident, in_flight, window, accesses, budget) -> None:
    hm = HeatMap(half_life=2.0)
    for i, key in enumerate(accesses):
        hm.record([key], now=i * 0.5)
    now = len(accesses) * 0.5
    size_of = lambda k: 10 + k  # noqa: E731
    planner = PrefetchPlanner(window_batches=window, heat=hm)
    plan = planner.plan(
        upcoming, resident, in_flight, now, budget, size_of if budget is not None else None
    )
    keys = [k for _, k in plan]
    assert len(keys) == len(set(keys))
    assert not (set(keys) & (resident | in_flight))
    # priority = first distance the key is needed at, within the window
    first: dict[int, int] = {}
    for d, batch in enumerate(upcoming[:window]):
        for k in batch:
            first.setdefault(k, d)
    assert all(first[k] == p for p, k in plan)
    prios = [p for p, _ in plan]
    assert prios == sorted(prios)
    for (p1, k1), (p2, k2) in itertools.pairwise(plan):
        if p1 == p2:
            h1, h2 = hm.heat(k1, now), hm.heat(k2, now)
            assert h1 > h2 or (h1 == h2 and k1 < k2)
    eligible = [k for k in first if k not in resident and k not in in_flight]
    if budget is None:
        assert set(keys) == set(eligible)
    else:
        assert sum(size_of(k) for k in keys) <= budget
        if len(keys) < len(eligible):  # stopped: the next key in order would not fit
            full = planner.plan(upcoming, resident, in_flight, now)
            nxt = full[len(keys)][1]
            assert full[: len(keys)] == plan
            assert sum(size_of(k) for k in keys) + size_of(nxt) > budget
