"""`priority`: the victim is the brute-force argmin of the score formula at ``now``.

The reference model keeps, per resident object, its frequency, last reference, transfer cost
and insertion number, and computes ``w_f*log(f+1) - w_s*(now-last)/unit - w_c*cost`` for
every unpinned object at the current ``now`` -- an O(n) scan, which the policy replaces by a
heap over a time-invariant key. Weights are drawn on a binary grid (and times are integers)
so that exact ties are exact in floating point and the tie rule (older last reference, then
earlier insertion) is tested too.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.cache import TierCache
from engine.errors import InputError
from engine.policy import make_policy
from engine.policy.priority import PriorityPolicy

N_KEYS = 12
grid = st.integers(0, 8).map(lambda i: i / 8)  # weights 0, 1/8, ..., 1 (exact in binary)
signed_grid = st.integers(-8, 8).map(lambda i: i / 8)


class PriorityMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.p: PriorityPolicy | None = None

    @initialize(
        w_f=st.one_of(grid, signed_grid),
        w_s=st.one_of(grid, signed_grid),
        w_c=signed_grid,
        unit=st.sampled_from([0.5, 1.0, 2.0]),
        bandwidth=st.sampled_from([None, 4.0, 16.0]),
        start=st.integers(0, 10**6),
    )
    def setup(
        self,
        w_f: float,
        w_s: float,
        w_c: float,
        unit: float,
        bandwidth: float | None,
        start: int,
    ) -> None:
        self.w = (w_f, w_s, w_c, unit)
        self.bandwidth = bandwidth
        self.p = PriorityPolicy(w_f=w_f, w_s=w_s, w_c=w_c, staleness_unit=unit, bandwidth=bandwidth)
        self.p.attach(10**9)
        self.now = float(start)
        self.n_ins = 0
        # key -> [freq, last, cost seconds, insertion number]
        self.res: dict[int, list[float]] = {}
        self.pins: set[int] = set()

    @property
    def pol(self) -> PriorityPolicy:
        assert self.p is not None
        return self.p

    def _score(self, key: int) -> float:
        w_f, w_s, w_c, unit = self.w
        f, last, cost, _ = self.res[key]
        return w_f * math.log(f + 1) - (w_s * (self.now - last) / unit + w_c * cost)

    def _model_victim(self) -> int | None:
        cands = [k for k in self.res if k not in self.pins]
        if not cands:
            return None
        scores = {k: self._score(k) for k in cands}
        best = min(scores.values())
        tied = [k for k in cands if scores[k] <= best + 1e-9]
        return min(tied, key=lambda k: (self.res[k][1], self.res[k][3]))

    @rule(dt=st.sampled_from([0, 0, 1, 2, 5, 30]))
    def advance(self, dt: int) -> None:
        self.now += dt

    @rule(
        key=st.integers(0, N_KEYS - 1),
        size=st.integers(1, 64),
        cost=st.sampled_from([0.0, 0.0, 0.25, 1.0, 2.5, 10.0]),
    )
    def insert_or_hit(self, key: int, size: int, cost: float) -> None:
        if key in self.res:
            self.pol.hit(key, self.now)
            self.res[key][0] += 1
            self.res[key][1] = self.now
        else:
            self.pol.insert(key, size, self.now, None, cost)
            tc = size / self.bandwidth if cost == 0 and self.bandwidth else cost
            self.n_ins += 1
            self.res[key] = [1, self.now, tc, self.n_ins]

    @precondition(lambda self: bool(getattr(self, "res", None)))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(set(self.res) - self.pins) or [-1]))
        if key < 0:
            return
        self.pol.remove(key, self.now, evicted=data.draw(st.booleans()))
        del self.res[key]

    @precondition(lambda self: bool(getattr(self, "res", None)))
    @rule()
    def evict_victim(self) -> None:
        v = self.pol.victim(self.now, self.pins)
        assert v == self._model_victim()
        if v is not None:
            self.pol.remove(v, self.now, evicted=True)
            del self.res[v]

    @precondition(lambda self: bool(getattr(self, "res", None)))
    @rule(data=st.data())
    def toggle_pin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.res)))
        self.pins ^= {key}

    @invariant()
    def victim_is_argmin(self) -> None:
        if self.p is None:
            return
        assert self.pol.victim(self.now, self.pins) == self._model_victim()
        assert sorted(self.pol) == sorted(self.res) and len(self.pol) == len(self.res)
        for k, (f, _, _, _) in self.res.items():
            assert self.pol.frequency(k) == f
            assert self.pol.score(k, self.now) == pytest.approx(self._score(k), abs=1e-9)
        # memory stays proportional to the resident set (stale heap entries are compacted)
        assert len(self.pol._heap) <= 2 * len(self.res) + 65


TestPriorityMachine = PriorityMachine.TestCase
TestPriorityMachine.settings = settings(stateful_step_count=60)


@settings(max_examples=30)
@given(
    w=st.tuples(st.floats(-2, 2), st.floats(-2, 2), st.floats(-2, 2)),
    ops=st.lists(st.tuples(st.integers(0, 9), st.floats(0, 3), st.floats(0, 5)), max_size=80),
)
def test_victim_is_argmin_with_real_valued_weights(
    w: tuple[float, float, float], ops: list[tuple[int, float, float]]
) -> None:
    """Arbitrary float weights: the victim's score is the minimum (up to rounding)."""
    p = PriorityPolicy(*w)
    now = 0.0
    state: dict[int, tuple[int, float, float]] = {}
    for key, dt, cost in ops:
        now += dt
        if key in state:
            p.hit(key, now)
            f, _, c = state[key]
            state[key] = (f + 1, now, c)
        else:
            p.insert(key, 1, now, cost=cost)
            state[key] = (1, now, cost)
        v = p.victim(now)
        scores = {
            k: w[0] * math.log(f + 1) - w[1] * (now - last) - w[2] * c
            for k, (f, last, c) in state.items()
        }
        assert v is not None
        assert scores[v] <= min(scores.values()) + 1e-9 * (1 + now)


def _evictions(policy: str, params: dict[str, float], trace: list[tuple[int, int]]) -> list[int]:
    out: list[int] = []
    c = TierCache(
        capacity=20,
        policy=policy,
        policy_params=params,
        high_watermark=1.0,
        low_watermark=1.0,
        on_evict=lambda k, s, col: out.append(k),
    )
    sizes: dict[int, int] = {}
    for t, (key, size) in enumerate(trace):
        c.access(key, sizes.setdefault(key, size), float(t))
    return out


@settings(max_examples=40)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(1, 6)), max_size=150))
def test_staleness_only_is_lru(trace: list[tuple[int, int]]) -> None:
    assert _evictions("priority", {"w_f": 0, "w_s": 1, "w_c": 0}, trace) == _evictions(
        "lru", {}, trace
    )


@settings(max_examples=40)
@given(st.lists(st.integers(0, 15), max_size=150))
def test_frequency_only_is_lfu(trace: list[int]) -> None:
    """w_f=1, others 0: least frequently used since admission; ties by older reference."""
    p = PriorityPolicy(w_f=1, w_s=0, w_c=0)
    freq: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, key in enumerate(trace):
        if key in freq:
            p.hit(key, float(t))
            freq[key] += 1
        else:
            if len(freq) == 6:
                v = p.victim(float(t))
                assert v == min(freq, key=lambda k: (freq[k], last[k]))
                p.remove(v, float(t), True)
                del freq[v], last[v]
            p.insert(key, 1, float(t))
            freq[key] = 1
        last[key] = t


def test_weights_change_decisions() -> None:
    """One history, three weightings, three different victims."""

    def run(**w: float) -> object:
        p = PriorityPolicy(**w)
        p.insert("hot", 1, 0.0, cost=0.1)  # old, referenced often, cheap to refetch
        for t in (1.0, 2.0, 3.0, 4.0):
            p.hit("hot", t)
        p.insert("costly", 1, 5.0, cost=50.0)  # referenced once, expensive to refetch
        p.insert("fresh", 1, 10.0, cost=0.1)  # newest, referenced once, cheap
        return p.victim(10.0)

    assert run(w_f=0, w_s=1, w_c=0) == "hot"  # LRU-like
    assert run(w_f=1, w_s=0, w_c=0) == "costly"  # LFU-like: tie of costly/fresh -> older
    assert run(w_f=0, w_s=0, w_c=1) == "costly"  # article's sign: costly evicted first
    assert run(w_f=0, w_s=0, w_c=-1) == "hot"  # inverted: cheapest first, older of the tie
    assert run(w_f=1, w_s=0, w_c=-0.1) == "fresh"  # frequency + cost protect the others
    # defaults 0.6/0.3/0.1: hot -0.73, costly -6.08, fresh 0.41
    assert run() == "costly"
    p = PriorityPolicy(w_f=0, w_s=10, w_c=1)
    p.insert("a", 1, 0.0, cost=1.0)
    p.insert("b", 1, 0.5, cost=10.0)
    # the ranking is time-invariant: the same victim at any later now
    assert p.victim(0.5) == p.victim(1e6) == "b"


def test_defaults_and_bandwidth_cost() -> None:
    p = make_policy("priority")
    assert isinstance(p, PriorityPolicy)
    assert (p.w_f, p.w_s, p.w_c, p.staleness_unit, p.bandwidth) == (0.6, 0.3, 0.1, 1.0, None)
    q = PriorityPolicy(w_f=0, w_s=0, w_c=1, bandwidth=100.0)
    assert q.transfer_cost(50, 0.0) == 0.5  # seconds = bytes / (bytes/s)
    assert q.transfer_cost(50, 2.0) == 2.0  # an explicit cost wins
    q.insert("small", 50, 0.0)
    q.insert("large", 500, 0.0)
    assert q.victim(0.0) == "large"  # article sign: dearer to fetch again, evicted first
    assert q.score("large", 0.0) == pytest.approx(-5.0)


def test_staleness_unit_scales_staleness() -> None:
    p = PriorityPolicy(w_f=0, w_s=1, w_c=0, staleness_unit=60.0)
    p.insert("k", 1, 0.0)
    assert p.score("k", 120.0) == pytest.approx(-2.0)  # two minutes stale


def test_pinned_objects_are_skipped_and_heap_is_intact() -> None:
    p = PriorityPolicy()
    for i in range(5):
        p.insert(i, 1, float(i))
    assert p.victim(5.0, pinned={0, 1}) == 2
    assert p.victim(5.0, pinned={0, 1, 2, 3, 4}) is None
    assert p.victim(5.0) == 0
    assert list(p) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"w_f": float("nan")}, "w_f"),
        ({"w_s": float("inf")}, "w_s"),
        ({"w_c": "x"}, "w_c"),
        ({"staleness_unit": 0}, "staleness_unit"),
        ({"bandwidth": -5}, "bandwidth"),
    ],
)
def test_bad_knobs(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        PriorityPolicy(**kw)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=msg):
        make_policy("priority", **kw)
