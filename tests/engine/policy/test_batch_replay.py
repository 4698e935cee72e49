"""The replay fast path (``TierCache.access_many`` and, for LRU-2, ``LRU2Policy.access_batch``)
against the per-access path (``TierCache.access`` with an ``on_evict`` recorder, which rules
the fast path out).

Random traces and sizes (unit, one size per key, or any size per access), random clocks with
ties, cut into random runs of which each is replayed either in one ``access_many`` call or
access by access. After every access, a fresh cache fed the same prefix the same way must be in
the same state as the per-access cache: counters, resident keys in order, the policy's victim
order and (LRU-K) every key's history and reference numbers. Equal states after every prefix
give equal hit/miss sequences and equal evictions at every access.

The keys come from one of several universes, so LRU-2's two ways of indexing its state are
both exercised, and the switch between them at any point of a run: dense non-negative ints
(trace keys; the batch may be a list, a memoryview or a numpy array, as trace replay passes),
strings, ints far apart, negative ints, and dense ints with one string among them.
"""

from __future__ import annotations

import copy
import pickle
from itertools import pairwise
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache import TierCache
from engine.policy import make_policy
from engine.policy.lruk2 import LRU2Policy

KEYS = 10

#: key universes: index ``j`` of a scenario names key ``universe[j]``
UNIVERSES: dict[str, list[Any]] = {
    "dense": list(range(KEYS)),
    "strings": [f"k{j}" for j in range(KEYS)],
    "far-apart": [10**12 + 7 * j for j in range(KEYS)],
    "negative": [-1 - j for j in range(KEYS)],
    "dense+string": [*range(KEYS - 1), "s"],
}
#: how an ``access_many`` batch of int keys is passed
CONTAINERS = ("list", "memoryview", "ndarray")

Access = tuple[Any, int, float]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 40))
    idx = draw(st.lists(st.integers(0, KEYS - 1), min_size=n, max_size=n))
    universe = UNIVERSES[draw(st.sampled_from(sorted(UNIVERSES)))]
    keys = [universe[j] for j in idx]
    kind = draw(st.sampled_from(["unit", "per-key", "per-access"]))
    if kind == "unit":
        sizes = [1] * n
    elif kind == "per-key":
        size_of = draw(st.lists(st.integers(1, 6), min_size=KEYS, max_size=KEYS))
        sizes = [size_of[j] for j in idx]
    else:  # sizes may change between accesses; larger than the cache now and then
        sizes = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    steps = draw(st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.5]), min_size=n, max_size=n))
    times, now = [], 0.0
    for dt in steps:
        now += dt
        times.append(now)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(n, 1)), max_size=6))))
    bounds = [0, *[c for c in cuts if c < n], n]
    runs = [(a, b, draw(st.booleans())) for a, b in pairwise(bounds)]
    return {
        "accesses": list(zip(keys, sizes, times, strict=True)),
        "universe": universe,
        "container": draw(st.sampled_from(CONTAINERS)),
        "fixed": kind != "per-access",
        "capacity": draw(st.integers(1, 8) if kind == "unit" else st.integers(1, 14)),
        "runs": [r for r in runs if r[0] < r[1]],
    }


def state(cache: TierCache, universe: list[Any]) -> dict[str, Any]:
    """Everything the two paths must agree on."""
    policy = cache.policy
    out: dict[str, Any] = {
        "stats": cache.stats.as_dict(),
        "used": cache.used,
        "uncoloured_used": cache.color_used.get(None, 0),
        "resident": [(k, cache.size_of(k)) for k in cache],
        "policy_order": list(policy),  # type: ignore[arg-type]
    }
    if isinstance(policy, LRU2Policy):
        out["history"] = [
            (policy.history(k), policy.history_refs(k), policy.retained(k, 0.0)) for k in universe
        ]
    return out


def replay_runs(
    name: str,
    capacity: int,
    accesses: list[Access],
    runs: list[tuple[int, int, bool]],
    fixed: bool,
    end: int,
    container: str = "list",
) -> TierCache:
    """A fresh cache fed ``accesses[:end]``: each run in one ``access_many`` call (when its
    flag is set; int keys passed as ``container``) or access by access."""
    cache = TierCache(capacity=capacity, policy=make_policy(name))
    for a, b, batch in runs:
        b = min(b, end)
        if a >= b:
            break
        part = accesses[a:b]
        if batch:
            keys: Any = [k for k, _, _ in part]
            if container != "list" and all(type(k) is int for k in keys):
                arr = np.array(keys, dtype=np.int64)
                keys = arr if container == "ndarray" else arr.data
            cache.access_many(
                keys,
                [s for _, s, _ in part],
                [t for _, _, t in part],
                fixed_sizes=fixed,
            )
        else:
            for k, s, t in part:
                cache.access(k, s, t)
    return cache


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(["lru", "lru-k"]), sc=scenarios())
def test_batch_path_decides_as_the_per_access_path(name: str, sc: dict[str, Any]) -> None:
    accesses, runs, fixed, capacity = sc["accesses"], sc["runs"], sc["fixed"], sc["capacity"]
    universe, container = sc["universe"], sc["container"]
    evicted: list[Any] = []
    ref = TierCache(
        capacity=capacity,
        policy=make_policy(name),
        on_evict=lambda key, size, color: evicted.append(key),
    )
    before = state(ref, universe)
    for i, (k, s, t) in enumerate(accesses):
        hits = ref.stats.hits
        evicted.clear()
        ref.access(k, s, t)
        after = state(ref, universe)
        got = state(replay_runs(name, capacity, accesses, runs, fixed, i + 1, container), universe)
        assert got == after, (i, k, s, t)
        # the same hit or miss, and the same keys evicted in the same order, at access i
        assert got["stats"]["hits"] - before["stats"]["hits"] == ref.stats.hits - hits
        gone = {key for key, _ in before["resident"]} - {key for key, _ in got["resident"]}
        assert [key for key in before["policy_order"] if key in gone] == evicted, i
        before = got


def test_batch_counts_hit_bytes_from_the_stored_size() -> None:
    """With sizes that change between accesses a hit counts the resident object's size."""
    for name in ("lru", "lru-k"):
        cache = TierCache(capacity=10, policy=make_policy(name))
        hits = cache.access_many([1, 1, 2, 1], [4, 7, 3, 9], [0.0, 1.0, 2.0, 3.0])
        assert hits == 2
        assert cache.stats.bytes_hit == 8  # two hits of the 4-byte object admitted first
        assert cache.stats.bytes_missed == 7


@settings(max_examples=60, deadline=None)
@given(
    idx=st.lists(st.integers(0, KEYS - 1), max_size=60),
    split=st.integers(0, 60),
    capacity=st.integers(1, 6),
    universe=st.sampled_from(sorted(UNIVERSES)),
)
def test_copies_of_lru2_are_independent_and_decide_alike(
    idx: list[int], split: int, capacity: int, universe: str
) -> None:
    """deepcopy and pickle rebuild the closures over the copy's own structures."""
    known = UNIVERSES[universe]
    keys = [known[j] for j in idx]
    cache = TierCache(capacity=capacity, policy=make_policy("lru-k"))
    head, tail = keys[:split], keys[split:]
    cache.access_many(head, [1] * len(head), [float(i) for i in range(len(head))], None, True)
    twins = [copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))]
    times = [float(len(head) + i) for i in range(len(tail))]
    cache.access_many(tail, [1] * len(tail), times, None, True)
    for twin in twins:
        assert type(twin.policy) is LRU2Policy
        twin.access_many(tail, [1] * len(tail), times, None, True)
        assert state(twin, known) == state(cache, known)
    # the copies did not write into the original (nor the original into them)
    extra = TierCache(capacity=capacity, policy=make_policy("lru-k"))
    extra.access_many(keys, [1] * len(keys), [float(i) for i in range(len(keys))], None, True)
    assert state(extra, known) == state(cache, known)
