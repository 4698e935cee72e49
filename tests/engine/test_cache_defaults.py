"""One watermark default everywhere (issue 20, item 12): a TierCache built with no watermarks
evicts only to make room, as scenarios and ``pdsim cache replay`` do."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine import TierCache
from sim.scenario import CacheCfg


def test_the_defaults_agree_with_the_scenario_schema() -> None:
    c = TierCache(1000, "lru")
    cfg = CacheCfg()
    assert (c.high_watermark, c.low_watermark) == (cfg.high_watermark, cfg.low_watermark)
    assert (c.high_watermark, c.low_watermark) == (1.0, 1.0)


@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=60))
def test_default_cache_evicts_only_to_make_room(sizes: list[int]) -> None:
    """Reference: an LRU list that drops its oldest entries only while the new one does not
    fit (no early eviction at 80% as the old default did)."""
    cache = TierCache(1000, "lru")
    ref: list[tuple[int, int]] = []
    for i, size in enumerate(sizes):
        while ref and sum(s for _, s in ref) + size > 1000:
            ref.pop(0)
        ref.append((i, size))
        assert cache.admit(i, size, float(i))
        assert sorted(k for k, _ in ref) == sorted(cache)
        assert cache.used == sum(s for _, s in ref)
