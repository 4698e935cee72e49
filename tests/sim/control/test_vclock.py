"""Vector clocks: ordering against a reference dict model, merge as least upper bound, and
the conflict rule's determinism and symmetry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from sim.control.vclock import Order, VectorClock, Version, compare, merge, resolve

writers = st.sampled_from(["a", "b", "c", "d"])
clocks = st.dictionaries(writers, st.integers(0, 4), max_size=4).map(VectorClock.of)


def ref_le(a: VectorClock, b: VectorClock) -> bool:
    return all(a.get(w) <= b.get(w) for w in "abcd")


@given(clocks, clocks)
def test_compare_matches_reference(a: VectorClock, b: VectorClock) -> None:
    le, ge = ref_le(a, b), ref_le(b, a)
    expected = {
        (True, True): Order.EQUAL,
        (True, False): Order.BEFORE,
        (False, True): Order.AFTER,
        (False, False): Order.CONCURRENT,
    }[(le, ge)]
    assert compare(a, b) is expected
    flipped = {Order.BEFORE: Order.AFTER, Order.AFTER: Order.BEFORE}
    assert compare(b, a) is flipped.get(expected, expected)
    assert (compare(a, b) is Order.EQUAL) == (a == b)  # canonical representation


@given(clocks, clocks, clocks)
def test_merge_is_least_upper_bound(a: VectorClock, b: VectorClock, c: VectorClock) -> None:
    m = merge(a, b)
    assert ref_le(a, m) and ref_le(b, m)
    assert merge(a, b) == merge(b, a)
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a
    if ref_le(a, c) and ref_le(b, c):
        assert ref_le(m, c)


@given(clocks, writers)
def test_tick_moves_strictly_after(a: VectorClock, w: str) -> None:
    t = a.tick(w)
    assert compare(a, t) is Order.BEFORE
    assert t.get(w) == a.get(w) + 1
    assert t.lamport_sum() == a.lamport_sum() + 1


def test_examples() -> None:
    a = VectorClock.of({"n1": 2, "n2": 1})
    b = VectorClock.of({"n1": 1, "n2": 3})
    assert compare(a, b) is Order.CONCURRENT
    assert merge(a, b).as_dict() == {"n1": 2, "n2": 3}
    assert VectorClock.of({"x": 0}) == VectorClock.empty()


@given(clocks, clocks, writers, writers)
def test_resolve_is_symmetric_and_dominates(
    ca: VectorClock, cb: VectorClock, wa: str, wb: str
) -> None:
    a, b = Version(ca, wa, ("val", wa, ca)), Version(cb, wb, ("val", wb, cb))
    r1, c1 = resolve(a, b)
    r2, c2 = resolve(b, a)
    order = compare(ca, cb)
    if order is Order.CONCURRENT:
        assert c1 is not None and c2 is not None
        assert r1.value == r2.value and r1.writer == r2.writer
        assert c1.loser.value == c2.loser.value
        assert {c1.loser.value, r1.value} == {a.value, b.value}
        # the documented rule: larger Lamport sum, then larger writer id
        key = lambda v: (v.clock.lamport_sum(), v.writer, v.clock.entries)  # noqa: E731
        assert r1.value == max(a, b, key=key).value
        # the resolved clock dominates both inputs
        assert compare(ca, r1.clock) is Order.BEFORE and compare(cb, r1.clock) is Order.BEFORE
    else:
        assert c1 is None and c2 is None
        newer = b if order is Order.BEFORE else a
        if order is not Order.EQUAL:
            assert r1 == newer and r2 == newer


def test_resolve_none_and_stale() -> None:
    v1 = Version(VectorClock.of({"a": 1}), "a", 1)
    v2 = Version(VectorClock.of({"a": 2}), "a", 2)
    assert resolve(None, v1) == (v1, None)
    assert resolve(v2, v1) == (v2, None)  # stale update ignored


def test_bad_counters_rejected() -> None:
    with pytest.raises(InputError, match="allowed: int >= 0"):
        VectorClock.of({"a": -1})
    with pytest.raises(InputError, match="must be a string"):
        VectorClock.of([(3, 1)])  # type: ignore[list-item]
