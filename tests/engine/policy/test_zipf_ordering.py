"""On independent Zipf(1.0) references: miss ratio Belady <= LRU-2 <= LRU."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache import TierCache
from engine.policy import make_policy


def zipf_trace(n_refs: int, n_objects: int, alpha: float, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_objects + 1) ** alpha
    return rng.choice(n_objects, size=n_refs, p=weights / weights.sum()).tolist()


def miss_ratio(name: str, trace: list[int], capacity: int, **params: object) -> float:
    if name == "opt":
        params = {"future": trace}
    cache = TierCache(
        capacity=capacity,
        policy=make_policy(name, **params),
        high_watermark=1.0,
        low_watermark=1.0,
    )
    access = cache.access
    for t, key in enumerate(trace):
        access(key, 1, float(t))
    return cache.stats.miss_ratio


@pytest.mark.parametrize("cache_fraction", [0.05, 0.10])
def test_belady_le_lru2_le_lru(cache_fraction: float) -> None:
    n_objects = 10_000
    trace = zipf_trace(200_000, n_objects, alpha=1.0, seed=7)
    capacity = int(cache_fraction * n_objects)
    opt = miss_ratio("opt", trace, capacity)
    lru2 = miss_ratio("lru-k", trace, capacity, k=2)
    lru = miss_ratio("lru", trace, capacity)
    assert opt <= lru2 <= lru
    assert 0.0 < opt < 1.0
