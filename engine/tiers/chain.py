"""The tier rules, on keys and sizes only: which level serves a read, where the read is
promoted, where an eviction is demoted, and when past uses are replayed.

One :class:`TierChain` holds cache levels, fastest first (HBM, pinned host, SSD/NVMe), each an
:class:`engine.cache.TierCache`, above a backing store that always has every object (the object
store, or parameter servers). It moves no bytes; whoever owns the bytes listens to
``on_move`` and ``on_drop``. The engine's :class:`engine.tiers.TierStack` (real bytes) and the
simulator's :class:`sim.serving.paramstore.WeightStore` (sizes only, transfers on simulated links) both
decide through it, so the same calls give the same decisions on both sides.

The rules:

* **locate** looks levels up from ``start`` down; the first level that holds the key (and whose
  copy ``usable`` accepts) serves it. With ``count=True`` the serving level counts a hit and
  every level above it a miss; an unusable copy is removed from its level and counts a miss
  there. Returns the serving level's index, ``len(levels)`` for the backing store.
* **promote** admits a read served by level ``s`` into *every* level above ``s``, top-down (the
  level next to compute decides first, so its victims are demoted before lower levels choose
  theirs); then the copies move bottom-up along the physical path, one ``on_move(src, dst,
  key, size)`` per admitted level still holding the key (``src`` == ``len(levels)`` is the
  backing store). Inclusive caching: the lower copy stays.
* **demote**: when level ``i`` evicts a key, it is admitted into level ``i + 1`` if that level
  does not hold it yet (``on_move(i, i + 1, ...)`` when admitted), then ``on_drop(i, key, size,
  color)``. The last level just drops it; the backing store still has the object.

Invariant: ``on_drop(i, key)`` is called exactly once for each key that level ``i`` evicts,
after any demotion copy of it was made; ``on_move`` is called only for copies into a level that
admitted the key.

:class:`TouchReplay` is the recency rule for resident objects that are used every iteration
(weights): uses are recorded as times, at most ``history`` per group, and replayed in time
order as one lookup per resident key right before the next admission, so a policy sees the
last ``history`` uses of each resident key without one call per key per iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from engine.cache import TierCache
from engine.errors import ObjectTooLargeError
from engine.policy.base import Key

__all__ = ["TOUCH_HISTORY", "DropCallback", "MoveCallback", "TierChain", "TouchReplay"]

#: iteration ends replayed per group: enough for LRU-K with K <= 2 to see its K-distance
TOUCH_HISTORY = 2

MoveCallback = Callable[[int, int, Key, int], None]
DropCallback = Callable[[int, Key, int, "str | None"], None]


class TierChain:
    """Cache levels over a backing store, decisions only; see the module docstring."""

    def __init__(
        self,
        levels: Sequence[TierCache],
        *,
        on_move: MoveCallback | None = None,
        on_drop: DropCallback | None = None,
    ) -> None:
        self.levels = list(levels)
        self.on_move = on_move
        self.on_drop = on_drop
        #: the latest ``now`` handed to the chain (demotions inside an admission use it)
        self.now = 0.0
        for i, cache in enumerate(self.levels):
            if cache.on_evict is not None:
                raise ValueError(f"level {cache.name}: its cache already has an on_evict")
            cache.on_evict = self._demoter(i)

    @property
    def backing(self) -> int:
        """The index that stands for the backing store (one past the last level)."""
        return len(self.levels)

    def locate(
        self,
        key: Key,
        now: float,
        *,
        start: int = 0,
        size: int = 0,
        color: str | None = None,
        count: bool = True,
        usable: Callable[[int], bool] | None = None,
    ) -> int:
        """Index of the first level from ``start`` holding a usable copy of ``key``
        (``backing`` if none), counting hits and misses when ``count``."""
        self.now = now
        levels = self.levels
        for i in range(start, len(levels)):
            cache = levels[i]
            if key in cache:
                if usable is None or usable(i):
                    if count:
                        cache.lookup(key, now, size, color)
                    return i
                cache.remove(key, now)  # a bad or vanished copy: gone, and this is a miss
            if count:
                cache.lookup(key, now, size, color)
        return len(levels)

    def promote(
        self, key: Key, size: int, served: int, now: float, color: str | None = None
    ) -> list[int]:
        """Admit ``key`` into every level above ``served`` (top-down), then report the copies
        bottom-up through ``on_move``. Returns the levels that hold ``key`` afterwards, top
        first, among those above ``served``."""
        self.now = now
        levels = self.levels
        admitted = [self._admit(levels[j], key, size, now, color) for j in range(served)]
        held: list[int] = []
        src = served
        for j in range(served - 1, -1, -1):
            # a later (lower) admission may have evicted an earlier copy: check it is there
            if admitted[j] and key in levels[j]:
                if self.on_move is not None:
                    self.on_move(src, j, key, size)
                src = j
                held.append(j)
        held.reverse()
        return held

    def where(self, key: Key) -> list[int]:
        """Indices of the levels that hold ``key``, top first."""
        return [i for i, c in enumerate(self.levels) if key in c]

    # -- internals -----------------------------------------------------------------------
    @staticmethod
    def _admit(cache: TierCache, key: Key, size: int, now: float, color: str | None) -> bool:
        try:
            return cache.admit(key, size, now, color)
        except ObjectTooLargeError:  # larger than the whole level: it simply is not cached
            return False

    def _demoter(self, i: int) -> Callable[[Key, int, str | None], None]:
        def on_evict(key: Key, size: int, color: str | None) -> None:
            if i + 1 < len(self.levels):
                nxt = self.levels[i + 1]
                moved = key not in nxt and self._admit(nxt, key, size, self.now, color)
                if moved and self.on_move is not None:
                    self.on_move(i, i + 1, key, size)
            if self.on_drop is not None:
                self.on_drop(i, key, size, color)

        return on_evict


class TouchReplay:
    """Recorded uses of resident objects, replayed before the next admission (module doc).

    Groups (a model each) register the function that lists their keys, in replay order; one
    instance serves every group that shares a cache, so uses of all of them are replayed in
    one time-ordered pass.
    """

    def __init__(self, history: int = TOUCH_HISTORY) -> None:
        if history < 1:
            raise ValueError(f"touch history must be >= 1, got {history}")
        self.history = history
        self._pending: dict[int, list[float]] = {}
        self._keys: dict[int, Callable[[], Iterable[Key]]] = {}

    def register(self, group: int, keys: Callable[[], Iterable[Key]]) -> None:
        """``keys()`` lists ``group``'s keys in the order their lookups are replayed."""
        self._keys[group] = keys

    def record(self, group: int, now: float) -> None:
        """Every resident key of ``group`` was used at ``now`` (keeps the last ``history``)."""
        times = self._pending.get(group)
        if times is None:
            self._pending[group] = [now]
        elif times[-1] != now:
            times.append(now)
            if len(times) > self.history:
                del times[0]

    def forget(self, group: int) -> None:
        """Drop ``group``'s pending uses (its objects were replaced)."""
        self._pending.pop(group, None)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def replay(self, cache: TierCache) -> int:
        """Look up, in time order (ties: lower group first), every registered key of each
        group resident in ``cache`` once per recorded use; clears the record. Returns the
        number of lookups."""
        if not self._pending:
            return 0
        items = sorted((t, g) for g, times in self._pending.items() for t in times)
        self._pending.clear()
        lookup = cache.lookup
        n = 0
        for t, g in items:
            for key in self._keys[g]():
                if key in cache:
                    lookup(key, t)
                    n += 1
        return n
