"""The Wing-Gong register checker against a brute-force reference, on examples and on
random small histories."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.control.raft import HistoryOp
from sim.control.raft.linearizability import SearchBudgetExceeded, check_history, check_register


def op(
    kind: str,
    inv: float,
    resp: float | None,
    value: Any = None,
    result: Any = None,
    key: str = "k",
) -> HistoryOp:
    return HistoryOp(0, kind, key, value, inv, resp, result)


def brute_force(ops: list[HistoryOp]) -> bool:
    """Try every order of every allowed subset (unknown puts optional, unknown gets dropped)."""
    done = [o for o in ops if o.response is not None]
    maybe = [o for o in ops if o.response is None and o.op == "put"]
    for k in range(len(maybe) + 1):
        for extra in itertools.combinations(maybe, k):
            chosen = done + list(extra)
            for perm in itertools.permutations(chosen):
                ok, value = True, None
                for i, a in enumerate(perm):
                    # real-time order: nothing later in perm may have responded before a began
                    if any(b.response is not None and b.response < a.invoke for b in perm[i + 1 :]):
                        ok = False
                        break
                    if a.op == "put":
                        value = a.value
                    elif a.result != value:
                        ok = False
                        break
                if ok:
                    return True
    return False


def test_examples() -> None:
    # sequential write then read
    assert check_register([op("put", 0, 1, 5), op("get", 2, 3, result=5)])
    # stale read after a completed write: not linearizable
    assert not check_register([op("put", 0, 1, 5), op("get", 2, 3, result=None)])
    # concurrent read may see either value
    assert check_register([op("put", 0, 3, 5), op("get", 1, 2, result=None)])
    assert check_register([op("put", 0, 3, 5), op("get", 1, 2, result=5)])
    # two reads that see the write "un-happen"
    h = [op("put", 0, 10, 1), op("get", 1, 2, result=1), op("get", 3, 4, result=None)]
    assert not check_register(h)
    # an unknown write may take effect late ...
    assert check_register([op("put", 0, None, 7), op("get", 5, 6, result=7)])
    # ... or never
    assert check_register([op("put", 0, None, 7), op("get", 5, 6, result=None)])
    # but never before it was invoked
    assert not check_register([op("get", 0, 1, result=7), op("put", 2, None, 7)])


def test_history_split_by_key() -> None:
    h = [
        op("put", 0, 1, 1, key="a"),
        op("get", 2, 3, result=None, key="b"),
        op("get", 2, 3, result=2, key="a"),
    ]
    assert check_history(h) == ["a"]


def test_budget() -> None:
    # many overlapping writes and a read of a never-written value: exponential without memo
    h = [op("put", 0, 100, i) for i in range(11)] + [op("get", 0, 100, result=99)]
    with pytest.raises(SearchBudgetExceeded):
        check_register(h, max_states=50)
    assert not check_register(h)  # memoisation keeps the full search small
    with pytest.raises(SearchBudgetExceeded, match="limit is 10"):
        check_register(h, max_ops=10)


@st.composite
def histories(draw: st.DrawFn) -> list[HistoryOp]:
    n = draw(st.integers(1, 6))
    out = []
    for _ in range(n):
        inv = draw(st.integers(0, 10))
        dur = draw(st.integers(0, 5))
        unknown = draw(st.integers(0, 5)) == 0
        kind = draw(st.sampled_from(["put", "get"]))
        val = draw(st.integers(0, 2))
        out.append(
            op(
                kind,
                float(inv),
                None if unknown else float(inv + dur),
                value=val if kind == "put" else None,
                result=draw(st.sampled_from([None, 0, 1, 2])) if kind == "get" else val,
            )
        )
    return out


@given(histories())
def test_matches_brute_force(h: list[HistoryOp]) -> None:
    assert check_register(h) == brute_force(h)


@given(st.lists(st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 3)), max_size=25))
def test_sequential_histories_are_linearizable(seq: list[tuple[str, int]]) -> None:
    value, h = None, []
    for t, (kind, v) in enumerate(seq):
        if kind == "put":
            value = v
            h.append(op("put", 2 * t, 2 * t + 1, v, v))
        else:
            h.append(op("get", 2 * t, 2 * t + 1, result=value))
    assert check_register(h)
