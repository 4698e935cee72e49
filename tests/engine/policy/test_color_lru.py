"""`color-lru`: colour reservations, LRU within a colour, fallback, parameter validation.

The stateful test runs the policy inside a TierCache with 2-4 colours and random shares,
against a brute-force model of the documented victim rule (over-share colours first, oldest
head among them; else global LRU), and checks the isolation invariant at every eviction.
"""

from __future__ import annotations

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
from engine.policy.color_lru import DEFAULT_COLOR, ColorLRUPolicy

N_KEYS = 14


class ColorLRUMachine(RuleBasedStateMachine):
    """TierCache + color-lru against a list-based model of the victim rule."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: TierCache | None = None

    @initialize(
        n_colors=st.integers(2, 4),
        raw_shares=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
        capacity=st.integers(20, 80),
        sizes=st.lists(st.integers(1, 20), min_size=N_KEYS, max_size=N_KEYS),
        key_colors=st.lists(st.integers(0, 3), min_size=N_KEYS, max_size=N_KEYS),
        scale=st.floats(0.0, 1.0),
    )
    def setup(
        self,
        n_colors: int,
        raw_shares: list[float],
        capacity: int,
        sizes: list[int],
        key_colors: list[int],
        scale: float,
    ) -> None:
        names = [f"c{i}" for i in range(n_colors)]
        total = sum(raw_shares[:n_colors]) or 1.0
        # shares summing to `scale` <= 1; the last colour sometimes gets no entry at all
        shares = {n: raw_shares[i] / total * scale for i, n in enumerate(names)}
        if n_colors > 2:
            del shares[names[-1]]
        self.names = names
        self.capacity = capacity
        self.sizes = [min(s, capacity) for s in sizes]
        self.kcolor = [names[i % n_colors] for i in key_colors]
        self.policy = ColorLRUPolicy(shares=shares)
        self.log: list[int] = []
        self.cache = TierCache(
            capacity=capacity,
            policy=self.policy,
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=lambda k, s, c: self.log.append(k),
        )
        self.reserved = {n: int(shares.get(n, 0.0) * capacity) for n in names}
        self.res: dict[int, int] = {}  # key -> tick of last reference
        self.tick = 0
        self.pins: set[int] = set()
        self.lookups = {n: [0, 0] for n in names}

    @property
    def c(self) -> TierCache:
        assert self.cache is not None
        return self.cache

    # -- the model ---------------------------------------------------------------------------
    def _bytes(self, color: str) -> int:
        return sum(self.sizes[k] for k in self.res if self.kcolor[k] == color)

    def _over(self, color: str) -> bool:
        return self._bytes(color) > self.reserved[color]

    def _model_victim(self) -> int | None:
        free = [k for k in self.res if k not in self.pins]
        over = [k for k in free if self._over(self.kcolor[k])]
        pool = over or free
        return min(pool, key=self.res.__getitem__) if pool else None

    # -- rules -----------------------------------------------------------------------------
    @rule(key=st.integers(0, N_KEYS - 1))
    def access(self, key: int) -> None:
        color = self.kcolor[key]
        self.tick += 1
        hit = self.c.access(key, self.sizes[key], float(self.tick), color)
        assert hit == (key in self.res)
        self.lookups[color][0 if hit else 1] += 1
        if hit:
            self.res[key] = self.tick
            assert self.log == []
            return
        size = self.sizes[key]
        if self.capacity - sum(self.sizes[k] for k in self.pins) < size:
            assert self.log == [] and key not in self.c
            return
        expected: list[int] = []
        used = sum(self.sizes[k] for k in self.res)
        while used + size > self.capacity:
            v = self._model_victim()
            assert v is not None
            vc = self.kcolor[v]
            if not self._over(vc):
                # isolation: a colour within its reservation loses an object only when no
                # over-share colour has an unpinned object left
                assert not any(self._over(self.kcolor[k]) for k in self.res if k not in self.pins)
            expected.append(v)
            used -= self.sizes[v]
            del self.res[v]
        assert self.log == expected
        self.log.clear()
        self.res[key] = self.tick

    @precondition(lambda self: bool(getattr(self, "res", None)))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(set(self.res) - self.pins) or [-1]))
        if key >= 0:
            self.c.pin(key)
            self.pins.add(key)

    @precondition(lambda self: bool(getattr(self, "pins", None)))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.pins)))
        self.c.unpin(key)
        self.pins.discard(key)

    @rule(key=st.integers(0, N_KEYS - 1))
    def remove(self, key: int) -> None:
        if key in self.pins:
            return
        self.tick += 1
        assert self.c.remove(key, float(self.tick)) == (key in self.res)
        self.res.pop(key, None)

    @invariant()
    def agrees(self) -> None:
        if self.cache is None:
            return
        assert sorted(self.c) == sorted(self.res)
        assert self.policy.victim(0.0, self.pins) == self._model_victim()
        for n in self.names:
            assert self.policy.color_bytes(n) == self._bytes(n)
            assert self.policy.reserved(n) == self.reserved[n]
            st_ = self.c.color_stats.get(n)
            got = (st_.hits, st_.misses) if st_ else (0, 0)
            assert got == tuple(self.lookups[n])
        assert self.c.stats.lookups == sum(h + m for h, m in self.lookups.values())
        assert list(self.policy) == sorted(self.res, key=self.res.__getitem__)
        for n in self.names:  # LRU order within each colour
            mine = sorted((k for k in self.res if self.kcolor[k] == n), key=self.res.__getitem__)
            assert list(self.policy._lists.get(n, ())) == mine


TestColorLRUMachine = ColorLRUMachine.TestCase
TestColorLRUMachine.settings = settings(stateful_step_count=50)


# -- targeted behaviour ------------------------------------------------------------------------
def test_burst_of_one_model_cannot_flush_anothers_working_set() -> None:
    c = TierCache(
        capacity=100,
        policy="color-lru",
        policy_params={"shares": {"A": 0.5, "B": 0.3}},
        high_watermark=1.0,
        low_watermark=1.0,
    )
    t = 0.0
    for i in range(5):  # A's working set: 50 bytes, exactly its reservation
        t += 1
        c.access(("A", i), 10, t, "A")
    for i in range(200):  # B bursts through 2000 bytes of distinct objects
        t += 1
        c.access(("B", i), 10, t, "B")
    assert all(("A", i) in c for i in range(5))
    assert c.color_used["A"] == 50 and c.color_used["B"] == 50
    # the same burst under plain LRU flushes A completely
    lru = TierCache(capacity=100, policy="lru", high_watermark=1.0, low_watermark=1.0)
    t = 0.0
    for i in range(5):
        t += 1
        lru.access(("A", i), 10, t, "A")
    for i in range(200):
        t += 1
        lru.access(("B", i), 10, t, "B")
    assert not any(("A", i) in lru for i in range(5))


def test_oldest_head_among_over_share_colours_is_the_victim() -> None:
    p = ColorLRUPolicy(shares={"A": 0.2, "B": 0.2, "C": 0.6})
    p.attach(100)
    p.insert("b1", 30, 1.0, "B")  # B over share (30 > 20)
    p.insert("a1", 30, 2.0, "A")  # A over share (30 > 20)
    p.insert("c1", 10, 0.0, "C")  # C within its share (10 <= 60)
    p.hit("b1", 3.0)  # b1 now more recent than a1
    assert p.victim(4.0) == "a1"
    assert p.victim(4.0, pinned={"a1"}) == "b1"
    # both over-share colours pinned -> fall back to global LRU among the rest
    assert p.victim(4.0, pinned={"a1", "b1"}) == "c1"
    assert p.victim(4.0, pinned={"a1", "b1", "c1"}) is None


def test_none_colour_is_default_bucket() -> None:
    p = ColorLRUPolicy(shares={DEFAULT_COLOR: 0.5})
    p.attach(10)
    p.insert("x", 5, 0.0, None)
    p.insert("y", 3, 0.0, "other")
    assert p.color_bytes(None) == 5 and p.reserved(None) == 5
    assert not p.over_share(None) and p.over_share("other")
    p.insert("z", 1, 0.0, "other")
    assert p.victim(1.0) == "y"


@settings(max_examples=40)
@given(
    trace=st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 8), st.sampled_from([None, "a", "b"])),
        max_size=120,
    )
)
def test_without_shares_it_is_plain_lru(trace: list[tuple[int, int, str | None]]) -> None:
    logs: dict[str, list[int]] = {"lru": [], "color-lru": []}
    caches = {
        name: TierCache(
            capacity=24,
            policy=name,
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=lambda k, s, c, name=name: logs[name].append(k),
        )
        for name in logs
    }
    sizes: dict[int, tuple[int, str | None]] = {}
    for t, (key, size, color) in enumerate(trace):
        size, color = sizes.setdefault(key, (size, color))
        hits = {n: c.access(key, size, float(t), color) for n, c in caches.items()}
        assert hits["lru"] == hits["color-lru"]
    assert logs["lru"] == logs["color-lru"]


@pytest.mark.parametrize(
    ("shares", "msg"),
    [
        ({"a": 0.7, "b": 0.4}, "sum to at most 1"),
        ({"a": -0.1}, "in \\[0, 1\\]"),
        ({"a": 1.5}, "in \\[0, 1\\]"),
        ({"a": "half"}, "number"),
        ({"a": float("nan")}, "in \\[0, 1\\]"),
        ({1: 0.5}, "strings"),
        ([0.5], "mapping"),
    ],
)
def test_bad_shares_are_rejected(shares: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        ColorLRUPolicy(shares=shares)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="color-lru"):
        make_policy("color-lru", shares=shares)


def test_shares_summing_to_one_are_accepted() -> None:
    p = make_policy("color-lru", shares={"a": 0.1, "b": 0.2, "c": 0.7})
    assert isinstance(p, ColorLRUPolicy)
    p.attach(1000)
    assert (p.reserved("a"), p.reserved("b"), p.reserved("c"), p.reserved("zz")) == (
        100,
        200,
        700,
        0,
    )
