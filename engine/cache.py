"""`TierCache`: a byte-capacity cache of variable-size objects over any eviction policy.

One instance is one storage tier (HBM, pinned host memory, NVMe, ...). The cache owns the
resident set and its sizes, pins and statistics; the policy (:mod:`engine.policy`) only ranks
keys. The same class runs in the simulator (no bytes: it tracks keys and sizes) and in the real
engine (which keeps the bytes in a store keyed the same way and listens to ``on_evict``).

Invariants kept here:

* ``used == sum(size of resident objects) <= capacity`` after every call;
* an object with a pin count > 0 is never evicted;
* ``hits + misses == lookups`` (``access`` counts as one lookup), per cache and per colour;
* the policy's resident set equals the cache's.

Watermarks (R30): when an admission leaves ``used > high_watermark * capacity`` the cache
evicts, in policy order, until ``used <= low_watermark * capacity``. ``high_watermark=1.0``
turns this off (eviction only to make room), which is what pure policy comparisons want; it is
the default here, in scenarios (``cache.high_watermark``) and in ``pdsim cache replay``, so a
cache built in a notebook decides like the simulator's unless watermarks are set explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.cache_loop import access_plain
from engine.errors import ObjectTooLargeError
from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import make_policy

EvictCallback = Callable[[Key, int, "str | None"], None]


@dataclass
class CacheStats:
    """Counters of one cache, one colour or one object. Bytes are object sizes."""

    hits: int = 0
    misses: int = 0
    bytes_hit: int = 0
    bytes_missed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    evictions: int = 0
    refused: int = 0

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_ratio(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def miss_ratio(self) -> float:
        n = self.hits + self.misses
        return self.misses / n if n else 0.0

    @property
    def byte_miss_ratio(self) -> float:
        n = self.bytes_hit + self.bytes_missed
        return self.bytes_missed / n if n else 0.0

    def as_dict(self) -> dict[str, float]:
        d: dict[str, float] = dict(asdict(self))
        d["hit_ratio"] = self.hit_ratio
        d["byte_miss_ratio"] = self.byte_miss_ratio
        return d


@dataclass
class TierCache:
    """A cache of ``capacity`` bytes whose victims are chosen by ``policy``.

    ``policy`` is a policy object or a registered name (built with ``policy_params``).
    ``on_evict(key, size, color)`` is called for every object the cache evicts (not for
    explicit ``remove``), so an owner can demote it to a lower tier or drop its bytes.
    ``track_objects`` keeps per-object statistics (costs memory: off by default).
    """

    capacity: int
    policy: EvictionPolicy | str = "lru"
    policy_params: dict[str, Any] = field(default_factory=dict)
    high_watermark: float = 1.0
    low_watermark: float = 1.0
    on_evict: EvictCallback | None = None
    track_objects: bool = False
    name: str = "cache"

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError(f"{self.name}: capacity must be > 0 bytes, got {self.capacity}")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ValueError(
                f"{self.name}: need 0 < low_watermark <= high_watermark <= 1, got "
                f"{self.low_watermark} and {self.high_watermark}"
            )
        if isinstance(self.policy, str):
            self.policy = make_policy(self.policy, **self.policy_params)
        self._policy: EvictionPolicy = self.policy
        self._policy.attach(self.capacity)
        # Resident objects: key -> size; key -> colour for the coloured ones only.
        self._sizes: dict[Key, int] = {}
        self._colors: dict[Key, str] = {}
        self._pinned: dict[Key, int] = {}
        self.used = 0
        self.stats = CacheStats()
        # Counters of coloured objects only; uncoloured ones are derived (see color_stats).
        self._color_stats: dict[str, CacheStats] = {}
        self.color_used: dict[str | None, int] = {}
        self.object_stats: dict[Key, CacheStats] = {}
        self._high = int(self.high_watermark * self.capacity)
        self._low = int(self.low_watermark * self.capacity)

    # -- queries -----------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._sizes)

    def size_of(self, key: Key) -> int:
        """Size in bytes of resident ``key`` (``KeyError`` if absent)."""
        return self._sizes[key]

    def color_of(self, key: Key) -> str | None:
        """Colour of resident ``key`` (``KeyError`` if absent)."""
        if key not in self._sizes:
            raise KeyError(key)
        return self._colors.get(key)

    def pin_count(self, key: Key) -> int:
        return self._pinned.get(key, 0)

    @property
    def color_stats(self) -> dict[str | None, CacheStats]:
        """Statistics per colour; objects without a colour are under ``None``."""
        out: dict[str | None, CacheStats] = dict(sorted(self._color_stats.items()))
        rest = CacheStats(**asdict(self.stats))
        for cs in self._color_stats.values():
            for f in fields(CacheStats):
                setattr(rest, f.name, getattr(rest, f.name) - getattr(cs, f.name))
        if any(getattr(rest, f.name) for f in fields(CacheStats)):
            out[None] = rest
        return out

    def _colour(self, color: str) -> CacheStats:
        cs = self._color_stats.get(color)
        if cs is None:
            cs = self._color_stats[color] = CacheStats()
        return cs

    @property
    def free(self) -> int:
        return self.capacity - self.used

    # -- the hot path --------------------------------------------------------------------
    def lookup(self, key: Key, now: float, size: int = 0, color: str | None = None) -> bool:
        """Count a reference to ``key``: a hit updates the policy; a miss only counts.

        ``size`` and ``color`` are used for the miss counters (a hit uses the stored ones).
        """
        stored = self._sizes.get(key)
        if stored is not None:
            self._policy.hit(key, now)
            self._count(True, stored, self._colors.get(key), key)
            return True
        self._count(False, size, color, key)
        return False

    def access(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> bool:
        """``lookup`` then, on a miss, ``admit``. Returns whether it was a hit.

        An object larger than the whole cache is counted as a miss and refused (not raised),
        so trace replay can go on; an admission with nothing evictable is refused likewise.
        """
        stored = self._sizes.get(key)
        if stored is not None:
            self._policy.hit(key, now)
            if not self.track_objects and key not in self._colors:
                s = self.stats  # fast path: uncoloured, no per-object stats
                s.hits += 1
                s.bytes_hit += stored
            else:
                self._count(True, stored, self._colors.get(key), key)
            return True
        self._count(False, size, color, key)
        if size > self.capacity or not self._make_room(size, now):
            self._refuse(color)
            return False
        self._insert(key, size, now, color, cost)
        return False

    def access_many(
        self,
        keys: Sequence[Key],
        sizes: Sequence[int],
        times: Sequence[float],
        colors: Sequence[str | None] | None = None,
        fixed_sizes: bool = False,
    ) -> int:
        """``access(keys[i], sizes[i], times[i], colors[i])`` for every ``i`` in order.

        Returns the number of hits. The results -- statistics, resident set, policy decisions
        -- are exactly those of the loop of :meth:`access`. When no colour is given, nothing
        is pinned or coloured, watermark eviction is off (``high_watermark = 1.0``),
        ``on_evict`` is unset and per-object statistics are off (a trace replay), it runs a
        tight loop that calls the policy directly (evicting with ``policy.evict``), or hands
        the whole run to the policy's ``access_batch`` when it has one (the same steps; see
        :class:`engine.policy.lruk2.LRU2Policy`), and settles the counters once at the end;
        otherwise it calls :meth:`access` per element.
        ``fixed_sizes=True`` promises that every key has the same size in ``sizes`` as when
        it became resident (true of traces whose objects keep one size); the tight loop then
        counts hit bytes from ``sizes`` instead of looking each hit up.

        If the policy raises, the exception propagates and the cache's counters are not
        brought up to date: discard the cache.
        """
        n = len(keys)
        if len(sizes) != n or len(times) != n:
            raise ValueError(f"{self.name}: keys, sizes and times differ in length")
        replay_state = not (
            self._pinned or self._colors or self.track_objects or self.on_evict is not None
        )
        if colors is None and replay_state and self._high >= self.capacity:
            return self._access_plain(keys, sizes, times, fixed_sizes)
        access, before = self.access, self.stats.hits
        for k, s, t, c in zip(keys, sizes, times, colors or [None] * n, strict=True):
            access(k, s, t, c)
        return self.stats.hits - before

    def _access_plain(
        self, keys: Sequence[Key], sizes: Sequence[int], times: Sequence[float], fixed: bool
    ) -> int:
        """The tight loop of :meth:`access_many` (preconditions checked there); see
        :func:`engine.cache_loop.access_plain`."""
        return access_plain(self, keys, sizes, times, fixed)

    def admit(
        self,
        key: Key,
        size: int,
        now: float,
        color: str | None = None,
        cost: float = 0.0,
        pin: bool = False,
    ) -> bool:
        """Make ``key`` resident (evicting as the policy says); no lookup is counted.

        Returns ``False`` (and changes nothing) when not enough unpinned bytes can be freed.
        Raises :class:`ObjectTooLargeError` when ``size`` exceeds the whole capacity.
        Admitting a resident key only pins it if asked (its size must not change).
        """
        if size < 0:
            raise ValueError(f"{self.name}: object {key!r} has negative size {size}")
        if size > self.capacity:
            raise ObjectTooLargeError(
                f"{self.name}: object {key!r} of {size} B exceeds the whole capacity "
                f"of {self.capacity} B"
            )
        if key not in self._sizes:
            if not self._make_room(size, now):
                self._refuse(color)
                return False
            self._insert(key, size, now, color, cost)
        if pin:
            self.pin(key)
        return True

    def admit_many(
        self, items: Sequence[tuple[Key, int]], now: float, color: str | None = None
    ) -> bool:
        """Admit every ``(key, size)`` of ``items`` in one pass, in order, as :meth:`admit`
        would one by one -- only when none is resident and all fit under the high watermark
        without an eviction (a warm start of a large model). Otherwise change nothing and
        return ``False``."""
        total = sum(size for _, size in items)
        sizes = self._sizes
        if self.used + total > min(self.capacity, self._high) or any(
            k in sizes or size < 0 for k, size in items
        ):
            return False
        insert = self._policy.insert
        colors = self._colors
        for key, size in items:
            sizes[key] = size
            if color is not None:
                colors[key] = color
            insert(key, size, now, color, 0.0)
        self.used += total
        self.color_used[color] = self.color_used.get(color, 0) + total
        self.stats.bytes_in += total
        if color is not None:
            self._colour(color).bytes_in += total
        return True

    # -- pins and removal ----------------------------------------------------------------
    def pin(self, key: Key) -> None:
        """Pin resident ``key`` (in use): it will not be evicted until unpinned."""
        if key not in self._sizes:
            raise KeyError(f"{self.name}: cannot pin {key!r}: not resident")
        self._pinned[key] = self._pinned.get(key, 0) + 1

    def unpin(self, key: Key) -> None:
        """Release one pin of ``key``."""
        n = self._pinned.get(key, 0)
        if n <= 0:
            raise KeyError(f"{self.name}: {key!r} is not pinned")
        if n == 1:
            del self._pinned[key]
        else:
            self._pinned[key] = n - 1

    def remove(self, key: Key, now: float) -> bool:
        """Invalidate ``key`` (not an eviction; ``on_evict`` is not called). False if absent."""
        if key not in self._sizes:
            return False
        if key in self._pinned:
            raise ValueError(f"{self.name}: cannot remove pinned object {key!r}")
        self._policy.remove(key, now, False)
        self._drop(key)
        return True

    def evict_to(self, target_used: int, now: float) -> list[Key]:
        """Evict in policy order until ``used <= target_used`` or nothing is evictable."""
        evicted: list[Key] = []
        while self.used > target_used:
            key = self._evict_one(now)
            if key is None:
                break
            evicted.append(key)
        return evicted

    # -- internals -------------------------------------------------------------------------
    def _count(self, hit: bool, size: int, color: str | None, key: Key) -> None:
        s = self.stats
        if hit:
            s.hits += 1
            s.bytes_hit += size
        else:
            s.misses += 1
            s.bytes_missed += size
        if color is not None:
            cs = self._color_stats.get(color)
            if cs is None:
                cs = self._color_stats[color] = CacheStats()
            if hit:
                cs.hits += 1
                cs.bytes_hit += size
            else:
                cs.misses += 1
                cs.bytes_missed += size
        if self.track_objects:
            os_ = self.object_stats.get(key)
            if os_ is None:
                os_ = self.object_stats[key] = CacheStats()
            if hit:
                os_.hits += 1
                os_.bytes_hit += size
            else:
                os_.misses += 1
                os_.bytes_missed += size

    def _make_room(self, size: int, now: float) -> bool:
        need = self.used + size - self.capacity
        if need <= 0:
            return True
        # Check first that enough unpinned bytes exist, so a refusal changes nothing.
        if self._pinned:
            pinned_bytes = sum(self._sizes[k] for k in self._pinned)
            if self.capacity - pinned_bytes < size:
                return False
        while self.used + size > self.capacity:
            if self._evict_one(now) is None:
                return False
        return True

    def _insert(self, key: Key, size: int, now: float, color: str | None, cost: float) -> None:
        self._sizes[key] = size
        if color is not None:
            self._colors[key] = color
        self.used += size
        self.color_used[color] = self.color_used.get(color, 0) + size
        self.stats.bytes_in += size
        if color is not None:
            self._colour(color).bytes_in += size
        self._policy.insert(key, size, now, color, cost)
        if self.used > self._high:
            # The object just admitted is no candidate for the watermark eviction it caused
            # (else an admission could evict itself, and admit(pin=True) would then fail).
            pinned = self._pinned
            pinned[key] = pinned.get(key, 0) + 1
            try:
                self.evict_to(self._low, now)
            finally:
                if pinned[key] == 1:
                    del pinned[key]
                else:
                    pinned[key] -= 1

    def _refuse(self, color: str | None) -> None:
        self.stats.refused += 1
        if color is not None:
            self._colour(color).refused += 1

    def _evict_one(self, now: float) -> Key | None:
        key = self._policy.victim(now, self._pinned)
        if key is None:
            return None
        # Invariant: the policy never proposes a pinned key.
        assert key not in self._pinned, f"policy {self._policy.name} proposed pinned {key!r}"
        self._policy.remove(key, now, True)
        size, color = self._drop(key)
        stats = self.stats
        stats.evictions += 1
        stats.bytes_out += size
        if color is not None:
            cs = self._colour(color)
            cs.evictions += 1
            cs.bytes_out += size
        if self.track_objects:
            self.object_stats.setdefault(key, CacheStats()).evictions += 1
        if self.on_evict is not None:
            self.on_evict(key, size, color)
        return key

    def _drop(self, key: Key) -> tuple[int, str | None]:
        """Forget resident ``key``; return its size and colour."""
        size = self._sizes.pop(key)
        color = self._colors.pop(key, None) if self._colors else None
        self.used -= size
        self.color_used[color] -= size
        return size, color
