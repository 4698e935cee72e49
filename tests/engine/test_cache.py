"""TierCache against a reference model: stateful Hypothesis tests plus targeted cases.

The stateful machine drives one cache with random accesses, lookups, admissions, pins,
unpins, removals and explicit evictions of variable-size, optionally coloured objects. A
plain-Python model keeps the resident set, sizes, pins and counters and checks after every
step: capacity never exceeded, ``used`` equals the resident bytes, pinned objects never
evicted, hits + misses == lookups (per cache and per colour), refusal only when pinned bytes
leave no room (and then nothing changes), the watermark rule, ``on_evict`` called exactly for
the evicted keys, and ``bytes_in - bytes_out - removed == used``.

With ``lru`` the model also predicts every victim (an ordered dict, oldest first). Every
other registered policy that needs no constructor argument runs through the same machine with
the policy-independent checks (policies are picked up from the registry at collection time).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engine.cache import TierCache
from engine.errors import ObjectTooLargeError
from engine.policy import policy_class, policy_names

N_KEYS = 10
COLORS = (None, "a", "b")


def _no_arg_policies() -> list[str]:
    """Registered policies constructible without arguments (``opt`` needs the future)."""
    out = []
    for name in policy_names():
        if name == "opt":
            continue
        params = inspect.signature(policy_class(name).__init__).parameters.values()
        required = [
            p
            for p in params
            if p.name != "self"
            and p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        if not required:
            out.append(name)
    return out


class CacheMachine(RuleBasedStateMachine):
    """Drives a TierCache; ``policy_name`` and ``exact_lru`` are set by :func:`_machine_for`."""

    policy_name = "lru"
    exact_lru = True

    def __init__(self) -> None:
        super().__init__()
        self.cache: TierCache | None = None

    # -- set-up ---------------------------------------------------------------------------
    @initialize(
        capacity=st.integers(10, 60),
        sizes=st.lists(st.integers(1, 40), min_size=N_KEYS, max_size=N_KEYS),
        colors=st.lists(st.sampled_from(COLORS), min_size=N_KEYS, max_size=N_KEYS),
        marks=st.one_of(
            st.just((1.0, 1.0)),
            st.tuples(st.floats(0.3, 1.0), st.floats(0.3, 1.0)).map(lambda t: (max(t), min(t))),
        ),
    )
    def setup(
        self,
        capacity: int,
        sizes: list[int],
        colors: list[str | None],
        marks: tuple[float, float],
    ) -> None:
        high, low = marks
        self.sizes = sizes
        self.sizes[-1] = capacity + 1  # one object never fits
        self.colors = colors
        self.capacity = capacity
        self.high = int(high * capacity)
        self.low = int(low * capacity)
        self.log: list[Any] = []
        self.cache = TierCache(
            capacity=capacity,
            policy=self.policy_name,
            high_watermark=high,
            low_watermark=low,
            on_evict=lambda k, s, c: self.log.append((k, s, c)),
            name="t",
        )
        # the model
        self.res: OrderedDict[int, int] = OrderedDict()  # key -> size, LRU first
        self.pins: dict[int, int] = {}
        self.hits = 0
        self.misses = 0
        self.col_lookups: dict[str | None, list[int]] = {c: [0, 0] for c in COLORS}
        self.removed = 0
        self.evicted = 0
        self.now = 0.0

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    @property
    def c(self) -> TierCache:
        assert self.cache is not None
        return self.cache

    # -- model helpers --------------------------------------------------------------------
    def _used(self) -> int:
        return sum(self.res.values())

    def _pinned_bytes(self) -> int:
        return sum(self.res[k] for k in self.pins)

    def _lru_victims(self, key: int, size: int) -> list[int]:
        """Exact LRU prediction of the evictions admitting ``key`` causes (not applied)."""
        order = [k for k in self.res if k not in self.pins]
        used = self._used()
        out: list[int] = []
        while used + size > self.capacity:
            v = order.pop(0)
            out.append(v)
            used -= self.res[v]
        used += size
        if used > self.high:
            while used > self.low and order:
                v = order.pop(0)
                out.append(v)
                used -= self.res[v]
        return out

    def _count(self, key: int, hit: bool) -> None:
        color = self.colors[key]
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        self.col_lookups[color][0 if hit else 1] += 1

    def _admit_in_model(self, key: int) -> bool:
        """Apply an admission of absent ``key`` to the model, checking the cache's evictions.

        Call after the cache did it; ``self.log`` holds the evictions it reported.
        """
        size = self.sizes[key]
        fits = self.capacity - self._pinned_bytes() >= size
        evicted = [k for k, _, _ in self.log]
        self.log.clear()
        if not fits:
            # refusal: nothing may change
            assert evicted == []
            assert key not in self.c
            return False
        if self.exact_lru:
            assert evicted == self._lru_victims(key, size)
        used = self._used()
        assert len(set(evicted)) == len(evicted)
        for k in evicted:
            assert k in self.res, f"evicted {k} was not resident"
            assert k not in self.pins, f"pinned {k} evicted"
            assert k != key
        # Split the evictions into "make room" (shortest prefix that fits) and watermark.
        m = 0
        while used + size > self.capacity:
            used -= self.res[evicted[m]]
            m += 1
        used += size
        if used > self.high:
            for k in evicted[m:]:
                assert used > self.low, "watermark eviction went below the low mark"
                used -= self.res[k]
            others_unpinned = [
                k for k in self.res if k not in self.pins and k not in evicted and k != key
            ]
            assert used <= self.low or not others_unpinned
        else:
            assert len(evicted) == m, "evicted more than needed below the high watermark"
        for k in evicted:
            del self.res[k]
        self.evicted += len(evicted)
        self.res[key] = size
        return True

    # -- rules ----------------------------------------------------------------------------
    @rule(key=st.integers(0, N_KEYS - 1))
    def access(self, key: int) -> None:
        now = self._tick()
        hit = self.c.access(key, self.sizes[key], now, self.colors[key])
        assert hit == (key in self.res)
        self._count(key, hit)
        if hit:
            self.res.move_to_end(key)
            assert self.log == []
            return
        if self.sizes[key] > self.capacity:
            assert key not in self.c and self.log == []
            return
        admitted = self._admit_in_model(key)
        assert (key in self.c) == admitted

    @rule(key=st.integers(0, N_KEYS - 1))
    def lookup(self, key: int) -> None:
        now = self._tick()
        hit = self.c.lookup(key, now, self.sizes[key], self.colors[key])
        assert hit == (key in self.res)
        self._count(key, hit)
        if hit:
            self.res.move_to_end(key)

    @rule(key=st.integers(0, N_KEYS - 1), pin=st.booleans())
    def admit(self, key: int, pin: bool) -> None:
        now = self._tick()
        size = self.sizes[key]
        if size > self.capacity:
            with pytest.raises(ObjectTooLargeError):
                self.c.admit(key, size, now, self.colors[key], pin=pin)
            assert key not in self.c
            return
        if key in self.res:
            assert self.c.admit(key, size, now, self.colors[key], pin=pin)
            assert self.log == []
        else:
            ok = self.c.admit(key, size, now, self.colors[key], pin=pin)
            assert ok == self._admit_in_model(key)
            if not ok:
                return
        if pin:
            self.pins[key] = self.pins.get(key, 0) + 1

    @precondition(lambda self: bool(getattr(self, "res", None)))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.res)))
        self.c.pin(key)
        self.pins[key] = self.pins.get(key, 0) + 1

    @precondition(lambda self: bool(getattr(self, "pins", None)))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.pins)))
        self.c.unpin(key)
        if self.pins[key] == 1:
            del self.pins[key]
        else:
            self.pins[key] -= 1

    @rule(key=st.integers(0, N_KEYS - 1))
    def remove(self, key: int) -> None:
        now = self._tick()
        if key in self.pins:
            with pytest.raises(ValueError):
                self.c.remove(key, now)
            assert key in self.c
            return
        assert self.c.remove(key, now) == (key in self.res)
        assert self.log == [], "remove is not an eviction"
        if key in self.res:
            self.removed += self.res.pop(key)

    @rule(frac=st.floats(0.0, 1.0))
    def evict_to(self, frac: float) -> None:
        now = self._tick()
        target = int(frac * self.capacity)
        out = self.c.evict_to(target, now)
        assert out == [k for k, _, _ in self.log]
        self.log.clear()
        used = self._used()
        expected: list[int] | None = None
        if self.exact_lru:
            expected = []
            for k in self.res:
                if used <= target:
                    break
                if k not in self.pins:
                    expected.append(k)
                    used -= self.res[k]
            assert out == expected
        for k in out:
            assert k in self.res and k not in self.pins
            del self.res[k]
        self.evicted += len(out)
        left = [k for k in self.res if k not in self.pins]
        assert self._used() <= target or not left

    @precondition(lambda self: bool(getattr(self, "pins", None)))
    @rule()
    def pin_everything_then_admit(self) -> None:
        """With every resident object pinned, an admission that needs room changes nothing."""
        for k in sorted(self.res):
            if k not in self.pins:
                self.c.pin(k)
                self.pins[k] = 1
        before = (sorted(self.c), self.c.used, self.c.stats.evictions, self.c.stats.refused)
        absent = [k for k in range(N_KEYS - 1) if k not in self.res]
        for k in absent:
            if self.capacity - self._pinned_bytes() < self.sizes[k] <= self.capacity:
                assert self.c.admit(k, self.sizes[k], self._tick(), self.colors[k]) is False
                assert (sorted(self.c), self.c.used, self.c.stats.evictions) == before[:3]
                assert self.c.stats.refused == before[3] + 1
                assert self.log == []
                break

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        if self.cache is None:
            return
        c = self.c
        assert sorted(c) == sorted(self.res)
        assert sorted(c._policy) == sorted(self.res), "policy and cache resident sets differ"
        assert len(c._policy) == len(self.res)
        for k, s in self.res.items():
            assert c.size_of(k) == s
            assert c.pin_count(k) == self.pins.get(k, 0)
        assert c.used == self._used() <= self.capacity
        assert c.free == self.capacity - c.used
        assert c.stats.hits == self.hits and c.stats.misses == self.misses
        assert c.stats.lookups == self.hits + self.misses
        assert c.stats.evictions == self.evicted
        assert c.stats.bytes_in - c.stats.bytes_out - self.removed == c.used
        cs = c.color_stats
        for color, (h, m) in self.col_lookups.items():
            got = cs.get(color)
            gh, gm = (got.hits, got.misses) if got else (0, 0)
            assert (gh, gm) == (h, m), f"colour {color}: {(gh, gm)} != {(h, m)}"
        for color in COLORS:
            want = sum(s for k, s in self.res.items() if self.colors[k] == color)
            assert c.color_used.get(color, 0) == want


def _machine_for(name: str) -> type[CacheMachine]:
    return type(
        f"CacheMachine_{name.replace('-', '_')}",
        (CacheMachine,),
        {"policy_name": name, "exact_lru": name == "lru"},
    )


TestLRUCacheMachine = _machine_for("lru").TestCase
TestLRUCacheMachine.settings = settings(stateful_step_count=50)


@pytest.mark.parametrize("name", _no_arg_policies())
def test_every_policy_keeps_cache_invariants(name: str) -> None:
    run_state_machine_as_test(_machine_for(name), settings=settings(stateful_step_count=40))


# -- targeted cases ------------------------------------------------------------------------
def test_admit_larger_than_capacity_raises_and_access_refuses() -> None:
    c = TierCache(capacity=100, high_watermark=1.0, low_watermark=1.0)
    with pytest.raises(ObjectTooLargeError, match="exceeds the whole capacity of 100 B"):
        c.admit("big", 101, 0.0)
    assert c.access("big", 101, 1.0) is False
    assert "big" not in c and c.stats.misses == 1 and c.stats.refused == 1


def test_admit_and_pin_survives_its_own_watermark_eviction() -> None:
    # 90 of 100 bytes crosses the 80% mark; the new object must stay (and be pinned).
    c = TierCache(capacity=100, high_watermark=0.8, low_watermark=0.5)
    c.admit("x", 30, 0.0)
    assert c.admit("big", 60, 1.0, pin=True)
    assert "big" in c and c.pin_count("big") == 1
    assert "x" not in c and c.used == 60


def test_watermark_evicts_down_to_low_mark() -> None:
    evicted: list[str] = []
    c = TierCache(
        capacity=100,
        high_watermark=0.8,
        low_watermark=0.5,
        on_evict=lambda k, s, col: evicted.append(k),
    )
    for i in range(8):
        c.access(f"k{i}", 10, float(i))
    assert evicted == []  # 80 bytes: at, not above, the high mark
    c.access("k8", 10, 8.0)  # 90 > 80 -> evict LRU first down to 50
    assert evicted == ["k0", "k1", "k2", "k3"]
    assert c.used == 50


def test_refusals_are_counted_per_colour() -> None:
    c = TierCache(capacity=10, high_watermark=1.0, low_watermark=1.0)
    c.admit("a", 10, 0.0, color="m1", pin=True)
    assert c.admit("b", 5, 1.0, color="m2") is False
    assert c.access("c", 5, 2.0) is False
    cs = c.color_stats
    assert cs["m2"].refused == 1 and cs["m1"].refused == 0
    assert cs[None].refused == 1 and c.stats.refused == 2


def test_pin_and_remove_errors() -> None:
    c = TierCache(capacity=10)
    with pytest.raises(KeyError):
        c.pin("nope")
    c.admit("a", 1, 0.0, pin=True)
    with pytest.raises(ValueError, match="pinned"):
        c.remove("a", 1.0)
    c.unpin("a")
    with pytest.raises(KeyError):
        c.unpin("a")
    assert c.remove("a", 2.0) and not c.remove("a", 3.0)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 10, "high_watermark": 0.5, "low_watermark": 0.7}, "watermark"),
        ({"capacity": 10, "low_watermark": 0.0}, "watermark"),
    ],
)
def test_bad_construction(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        TierCache(**kw)


# -- access_many: the replay loop gives what the loop of access gives ----------------------

MANY_POLICIES = [p for p in policy_names() if p != "none"]


def _many_cache(name: str, capacity: int, keys: list[int]) -> TierCache:
    params: dict[str, Any] = {"future": keys} if name == "opt" else {}
    return TierCache(
        capacity=capacity,
        policy=name,
        policy_params=params,
        high_watermark=1.0,
        low_watermark=1.0,
    )


@pytest.mark.parametrize("name", MANY_POLICIES)
@given(
    refs=st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from([0.0, 0.0, 1.0])), min_size=1, max_size=90
    ),
    capacity=st.integers(1, 14),
    sizes=st.lists(st.integers(1, 5), min_size=13, max_size=13),
    fixed=st.booleans(),
)
def test_access_many_equals_the_access_loop(
    name: str, refs: list[tuple[int, float]], capacity: int, sizes: list[int], fixed: bool
) -> None:
    """Same stats, residents, eviction order and used bytes; objects > capacity refused."""
    keys = [k for k, _ in refs]
    times: list[float] = []
    now = 0.0
    for _, dt in refs:
        now += dt
        times.append(now)
    sz = [sizes[k] for k in keys]
    fitting = [k for k, s in zip(keys, sz, strict=True) if s <= capacity]
    loop, many = _many_cache(name, capacity, fitting), _many_cache(name, capacity, fitting)
    loop_hits = sum(loop.access(k, s, t) for k, s, t in zip(keys, sz, times, strict=True))
    assert many.access_many(keys, sz, times, fixed_sizes=fixed) == loop_hits
    assert many.stats == loop.stats
    assert many.used == loop.used == sum(many.size_of(k) for k in many)
    assert list(many) == list(loop)
    assert list(many._policy) == list(loop._policy)
    assert many.color_used == {None: many.used} or many.used == 0


def test_access_many_falls_back_to_access_when_pinned() -> None:
    fast, slow = (
        TierCache(capacity=3, policy="lru", high_watermark=1.0, low_watermark=1.0) for _ in range(2)
    )
    for c in (fast, slow):
        c.access("p", 1, 0.0)
        c.pin("p")
    fast.access_many(["a", "b", "c", "a"], [1, 1, 1, 1], [1.0, 2.0, 3.0, 4.0])
    for k, t in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("a", 4.0)):
        slow.access(k, 1, t)
    assert fast.stats == slow.stats and sorted(fast) == sorted(slow) == ["a", "c", "p"]
    with pytest.raises(ValueError, match="differ in length"):
        fast.access_many(["a"], [1, 2], [0.0])


def test_admit_many_equals_admit_one_by_one_or_changes_nothing() -> None:
    items = [("a", 3), ("b", 4), ("c", 2)]
    bulk, single = (
        TierCache(capacity=20, policy="lru", high_watermark=0.5, low_watermark=0.4)
        for _ in range(2)
    )
    assert bulk.admit_many(items, 1.0, color="m")
    for key, size in items:
        single.admit(key, size, 1.0, color="m")
    assert bulk.used == single.used == 9 and list(bulk) == list(single)
    assert bulk.color_of("b") == "m" and bulk.color_used == single.color_used
    assert bulk.stats == single.stats and bulk.color_stats == single.color_stats
    assert not bulk.admit_many([("d", 1), ("a", 3)], 2.0)  # "a" is resident: nothing changes
    assert not bulk.admit_many([("d", 2)], 2.0)  # 11 B > high watermark (10 B)
    assert "d" not in bulk and bulk.used == 9
