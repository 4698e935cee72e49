"""``engine.tiers.chain.TouchReplay`` by hand: it keeps the last ``history`` distinct use
times per group and replays them in time order (ties: lower group first)."""

from __future__ import annotations

from engine.cache import TierCache
from engine.tiers.chain import TouchReplay


class Recording(TierCache):
    """A cache that records its lookups."""

    def __init__(self) -> None:
        super().__init__(capacity=10, policy="lru", high_watermark=1.0, low_watermark=1.0)
        self.seen: list[tuple[float, object]] = []

    def lookup(self, key, now, size=0, color=None):  # type: ignore[no-untyped-def,override]
        self.seen.append((now, key))
        return super().lookup(key, now, size, color)


def test_replay_keeps_the_last_history_uses_in_time_order() -> None:
    cache = Recording()
    for key in ("a", "b", "c"):
        cache.access(key, 1, 0.0)
    tr = TouchReplay(history=2)
    tr.register(0, lambda: ["a", "b", "gone"])  # "gone" is not resident: not looked up
    tr.register(1, lambda: ["c"])
    for t in (1.0, 2.0, 2.0, 3.0):  # a repeated time counts once; 1.0 falls out
        tr.record(0, t)
    tr.record(1, 2.0)
    assert tr.replay(cache) == 5
    assert cache.seen == [(2.0, "a"), (2.0, "b"), (2.0, "c"), (3.0, "a"), (3.0, "b")]
    assert not tr and tr.replay(cache) == 0  # the record was cleared
