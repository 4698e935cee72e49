"""engine.missratio.replay: hand-checked LRU case, an LRU reference model, and invariants that
hold for every registered policy (enumerated at run time)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.missratio import COLUMNS, replay
from engine.policy import policy_names
from engine.traces import NO_COLOR, Trace

POLICIES = [p for p in policy_names() if p != "none"]


def make_trace(keys: list[int], sizes: list[int], colors: list[int] | None = None) -> Trace:
    return Trace(
        time=np.arange(len(keys), dtype=np.float64),
        key=np.asarray(keys, dtype=np.int64),
        size=np.asarray(sizes, dtype=np.int64),
        color=None if colors is None else np.asarray(colors, dtype=np.int32),
        color_names=("m0", "m1") if colors is not None else (),
    )


def lru_reference(keys: list[int], sizes: list[int], capacity: int) -> dict[str, int]:
    """Byte-capacity LRU: evict least recently used until the newcomer fits; objects larger
    than the cache are never admitted."""
    cache: OrderedDict[int, int] = OrderedDict()
    used = hits = misses = bytes_missed = evictions = 0
    for k, s in zip(keys, sizes, strict=True):
        if k in cache:
            cache.move_to_end(k)
            hits += 1
            continue
        misses += 1
        bytes_missed += s
        if s > capacity:
            continue
        while used + s > capacity:
            _, old = cache.popitem(last=False)
            used -= old
            evictions += 1
        cache[k] = s
        used += s
    return {"hits": hits, "misses": misses, "bytes_missed": bytes_missed, "evictions": evictions}


def test_lru_hand_computed() -> None:
    # a(10) b(20) a c(30) b   -- worked out by hand:
    # capacity 30: a miss; b miss (used 30); a hit; c miss, evicts b then a; b miss, evicts c
    # capacity 20: a miss; b miss evicts a; a miss evicts b; c (30 B) can never fit: miss,
    #              bypasses the cache; b miss evicts a
    tr = make_trace([0, 1, 0, 2, 1], [10, 20, 10, 30, 20])
    raw = replay(tr, ["lru"], [30, 20])
    assert list(raw.columns) == list(COLUMNS)
    df = raw.set_index("cache_bytes")
    assert df.loc[30, ["hits", "misses", "evictions"]].tolist() == [1, 4, 3]
    assert df.loc[30, "miss_ratio"] == pytest.approx(0.8)
    assert df.loc[30, "byte_miss_ratio"] == pytest.approx(80 / 90)
    assert df.loc[20, ["hits", "misses", "evictions"]].tolist() == [0, 5, 3]
    assert df.loc[20, "bytes_missed"] == df.loc[20, "bytes_requested"] == 90
    assert df.loc[20, "byte_miss_ratio"] == 1.0


@given(
    refs=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 6)), min_size=1, max_size=80),
    capacity=st.integers(1, 20),
)
def test_lru_matches_reference_model(refs: list[tuple[int, int]], capacity: int) -> None:
    # an object keeps one size for the whole trace (its first one)
    first: dict[int, int] = {}
    keys = [k for k, _ in refs]
    sizes = [first.setdefault(k, s) for k, s in refs]
    row = replay(make_trace(keys, sizes), ["lru"], [capacity]).iloc[0]
    ref = lru_reference(keys, sizes, capacity)
    assert {k: int(row[k]) for k in ref} == ref
    assert row["requests"] == len(keys)


@pytest.mark.parametrize("name", POLICIES)
@given(
    keys=st.lists(st.integers(0, 15), min_size=1, max_size=120),
    capacity=st.integers(1, 12),
)
def test_every_policy_counts_every_access(name: str, keys: list[int], capacity: int) -> None:
    tr = make_trace(keys, [1] * len(keys), [k % 2 for k in keys])
    row = replay(tr, [name], [capacity]).iloc[0]
    assert row["hits"] + row["misses"] == row["requests"] == len(keys)
    assert row["misses"] >= len(set(keys))  # compulsory misses at least
    assert 0.0 <= row["miss_ratio"] <= 1.0
    assert row["bytes_requested"] == len(keys)
    if capacity >= len(set(keys)):  # everything fits: only compulsory misses, no eviction
        assert row["misses"] == len(set(keys))
        assert row["evictions"] == 0


@pytest.mark.skipif("opt" not in POLICIES, reason="opt (Belady) policy not registered yet")
@given(keys=st.lists(st.integers(0, 8), min_size=1, max_size=60), capacity=st.integers(1, 6))
def test_opt_never_misses_more_than_any_policy(keys: list[int], capacity: int) -> None:
    df = replay(make_trace(keys, [1] * len(keys)), POLICIES, [capacity]).set_index("policy")
    assert df.loc["opt", "misses"] == df["misses"].min()


def test_colours_do_not_change_lru() -> None:
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 30, 400).tolist()
    sizes = [1 + k % 4 for k in keys]
    colours = [NO_COLOR if k % 3 == 0 else k % 2 for k in keys]
    plain = replay(make_trace(keys, sizes), ["lru"], [10, 25])
    coloured = replay(make_trace(keys, sizes, colours), ["lru"], [10, 25])
    assert plain.equals(coloured)


def test_rows_follow_the_given_order_and_progress_adds_up() -> None:
    names = POLICIES[::-1]
    tr = make_trace(list(range(50)) * 3, [2] * 150)
    seen: list[int] = []
    df = replay(tr, names, [40, 8, 1], progress=seen.append)
    assert df["policy"].tolist() == [n for n in names for _ in range(3)]
    assert df["cache_bytes"].tolist() == [40, 8, 1] * len(names)
    assert sum(seen) == 150 * 3 * len(names)
    # size 1 < every object (2 B): nothing is ever cached
    assert (df[df["cache_bytes"] == 1]["misses"] == 150).all()


def test_bad_arguments() -> None:
    tr = make_trace([1, 2], [1, 1])
    with pytest.raises(InputError, match=r"allowed: .*lru"):
        replay(tr, ["no-such-policy"], [4])
    with pytest.raises(InputError, match="no policies"):
        replay(tr, [], [4])
    with pytest.raises(InputError, match="no cache sizes"):
        replay(tr, ["lru"], [])
    with pytest.raises(InputError, match=">= 1 byte"):
        replay(tr, ["lru"], [0])
    with pytest.raises(InputError, match="not replayed: fifo"):
        replay(tr, ["lru"], [4], policy_params={"fifo": {}})
    with pytest.raises(InputError, match="lru"):
        replay(tr, ["lru"], [4], policy_params={"lru": {"k": 2}})


def test_clocks() -> None:
    """``references`` hands the policies positions; with CRP = 0 LRU-K ignores tied times."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 40, 600).tolist()
    tied = Trace(
        time=np.repeat(np.arange(60, dtype=np.float64), 10),  # ten accesses per timestamp
        key=np.asarray(keys, dtype=np.int64),
        size=np.ones(600, dtype=np.int64),
    )
    by_time = replay(tied, ["lru-k"], [5, 15], clock="time")
    by_refs = replay(tied, ["lru-k"], [5, 15], clock="references")
    assert by_time.equals(by_refs)
    # CRP of 3: in seconds almost every re-reference is correlated, in references few are.
    params = {"lru-k": {"crp": 3.0}}
    crp_time = replay(tied, ["lru-k"], [15], params, clock="time")
    crp_refs = replay(tied, ["lru-k"], [15], params, clock="references")
    assert crp_time["misses"].iloc[0] != crp_refs["misses"].iloc[0]
    with pytest.raises(InputError, match="allowed: time, references"):
        replay(tied, ["lru"], [5], clock="wall")


def test_objects_larger_than_the_cache_are_counted() -> None:
    tr = make_trace([0, 1, 2, 1, 0, 3], [1, 9, 9, 9, 1, 2])
    row = replay(tr, ["lru"], [4]).iloc[0]
    assert (row["too_large_objects"], row["too_large_accesses"]) == (2, 3)
    assert (row["hits"], row["misses"]) == (1, 5)
    assert row["hit_ratio"] == pytest.approx(1 / 6)
