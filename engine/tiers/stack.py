"""The tier stack: caches over real bytes, fastest first, backed by an object store.

``TierStack(levels, backing)`` chains cache levels -- typically device (HBM), host (pinned
DRAM) and SSD -- above a backing store (the object store, the source of truth, never evicted).
Each level is a :class:`engine.cache.TierCache` (the same class and policies the simulator
uses) paired with the :class:`~engine.tiers.base.Tier` that holds the bytes.

Behaviour:

* **read** goes down the stack: the first level where the key is resident serves it (a hit
  there, a miss in every level above); if none has it the backing store does. The bytes are
  then **promoted** into every level above the one that served them (inclusive caching: the
  lower copy stays); admission decisions are taken top-down, bytes move bottom-up. The returned array is the copy in the highest level that admitted it.
* **eviction demotes**: when a level's cache evicts a key (``on_evict``), its bytes move to the
  next level down if that level does not hold them yet (and admits them), then are dropped.
  The last cache level just drops them (the backing store still has the object).
* **verification**: levels with ``verify=True`` (by default the SSD; the backing store
  always) have every read checked by ``validator(key, host_bytes)``. Bad bytes are never
  returned or promoted: the bad copy is deleted from that level and the read goes on down the
  stack; bad bytes in the backing store are re-read (``retries`` times), then taken from each
  replica in turn, and a good replica copy repairs the backing store. If no good copy exists,
  :class:`ObjectCorrupt`; if the object is absent everywhere, :class:`ObjectMissing`.

Invariants (checked by :meth:`TierStack.check`): for every level, the names its tier holds are
exactly the names of the keys its cache holds; bytes moved between levels are counted in
``bytes_moved`` under ``"<from>-><to>"`` tier names.

The stack never reads a clock: each call takes ``now`` and hands it to the caches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from engine.cache import TierCache
from engine.config import CacheCfg
from engine.policy.base import Key
from engine.tiers.base import Tier, TierMiss, as_host_bytes
from engine.tiers.chain import TierChain
from engine.tiers.device import DeviceTier
from engine.tiers.host import HostTier
from engine.tiers.ssd import SsdTier

Validator = Callable[[Key, np.ndarray], bool]

__all__ = [
    "Level",
    "ObjectCorrupt",
    "ObjectMissing",
    "ReadResult",
    "TierStack",
    "default_name",
    "level_caches",
    "make_stack",
]


class ObjectMissing(KeyError):
    """The object is in no level, not in the backing store and not in any replica."""

    def __init__(self, key: Key, name: str, searched: Sequence[str]) -> None:
        super().__init__(f"object {name!r} (key {key!r}) not found in {', '.join(searched)}")
        self.key, self.name, self.searched = key, name, list(searched)

    def __str__(self) -> str:
        return str(self.args[0])


class ObjectCorrupt(RuntimeError):
    """Every copy of the object that exists failed verification; nothing was served."""

    def __init__(self, key: Key, name: str, bad: Sequence[str]) -> None:
        super().__init__(
            f"object {name!r} (key {key!r}) failed verification in every copy: {', '.join(bad)}"
        )
        self.key, self.name, self.bad = key, name, list(bad)


def default_name(key: Key) -> str:
    """Object name of ``key``: tuple parts joined by ``/`` (ints zero-padded), else ``str``."""
    parts = key if isinstance(key, tuple) else (key,)
    return "/".join(f"{p:08d}" if isinstance(p, int) else str(p) for p in parts)


@dataclass
class Level:
    """One cache level: the bytes (``tier``), the decisions (``cache``), whether to verify."""

    tier: Tier
    cache: TierCache
    verify: bool = False


class ReadResult(NamedTuple):
    """``data``: the bytes (1-D uint8, in the highest level that holds them); ``level``: index
    of the level that served the read (``len(levels)`` = backing store); ``source``: its tier
    name; ``corrupt``: bad copies found (and discarded) on the way."""

    data: Any
    level: int
    source: str
    corrupt: int


class TierStack:
    """Cache levels over a backing store; see the module docstring for the contract."""

    def __init__(
        self,
        levels: Sequence[Level],
        backing: Tier,
        *,
        replicas: Sequence[Tier] = (),
        validator: Validator | None = None,
        name_of: Callable[[Key], str] = default_name,
        retries: int = 1,
    ) -> None:
        self.levels = list(levels)
        self.backing = backing
        self.replicas = list(replicas)
        self.validator = validator
        self.name_of = name_of
        self.retries = retries
        self.bytes_moved: dict[str, int] = {}
        self.corrupt_found: dict[str, int] = {}
        # the decisions: the same chain of rules the simulator's weight store uses
        self.chain = TierChain(
            [lvl.cache for lvl in self.levels], on_move=self._move, on_drop=self._drop
        )
        # (key, served level, bytes) of the read being promoted: its first copy comes from
        # these bytes, read when the key was located, whatever its level holds since
        self._in_flight: tuple[Key, int, Any] | None = None

    # -- public --------------------------------------------------------------------------
    def read(
        self,
        key: Key,
        size: int,
        now: float,
        color: str | None = None,
        *,
        count: bool = True,
        pin: bool = False,
    ) -> ReadResult:
        """Return ``key``'s bytes (``size`` of them), promoting them up the stack.

        ``count=False`` (prefetch) leaves hit/miss counters and recency untouched where the
        key is already resident. ``pin=True`` pins the copy in level 0 (if it was admitted
        there); release it with :meth:`unpin`.
        """
        if pin and self.levels and key in self.levels[0].cache:
            self.levels[0].cache.pin(key)  # resident: pinned before the read, so it stays
            return self.read_many([(key, size)], now, color, count=count)[0]
        return self.read_many([(key, size)], now, color, count=count, pin=pin)[0]

    def read_many(
        self,
        items: Sequence[tuple[Key, int]],
        now: float,
        color: str | None = None,
        *,
        count: bool = True,
        before_promote: Callable[[], object] | None = None,
        pin: bool = False,
    ) -> list[ReadResult]:
        """Read several objects as one transfer does: every ``(key, size)`` is located (and
        its bytes taken from the level that serves it) first, then ``before_promote()`` runs,
        then each is promoted in order and, with ``pin``, pinned in level 0 as it lands (so a
        later one cannot evict it). A copy evicted from its level between the two phases is
        still promoted from the bytes already read (they were in flight)."""
        located = [(key, size, *self._locate(key, size, now, color, count)) for key, size in items]
        if before_promote is not None:
            before_promote()
        out: list[ReadResult] = []
        for key, size, served, data, corrupt in located:
            self._in_flight = (key, served, data)
            try:
                held = self.chain.promote(key, size, served, now, color)
            finally:
                self._in_flight = None
            if held:
                data = self.levels[held[0]].tier.get(self.name_of(key))
                if pin and held[0] == 0:
                    self.levels[0].cache.pin(key)
            out.append(ReadResult(data, served, self._source_name(served), corrupt))
        return out

    def unpin(self, key: Key) -> None:
        """Release one pin of ``key`` in level 0."""
        self.levels[0].cache.unpin(key)

    def invalidate(self, key: Key, now: float) -> None:
        """Drop ``key`` from every cache level (e.g. a new version replaced it)."""
        self.chain.now = now
        name = self.name_of(key)
        for lvl in self.levels:
            if lvl.cache.remove(key, now):
                lvl.tier.delete(name)

    def where(self, key: Key) -> list[str]:
        """Names of the cache levels that hold ``key``, top first."""
        return [self.levels[i].tier.name for i in self.chain.where(key)]

    def check(self) -> None:
        """Assert the module invariants (tests call this after every step)."""
        for lvl in self.levels:
            cached = sorted(self.name_of(k) for k in lvl.cache)
            stored = lvl.tier.names()
            assert cached == stored, f"{lvl.tier.name}: cache {cached} != tier {stored}"

    # -- internals -----------------------------------------------------------------------
    def _locate(
        self, key: Key, size: int, now: float, color: str | None, count: bool
    ) -> tuple[int, Any, int]:
        """(serving level, its bytes, bad copies dropped on the way) for one read."""
        name = self.name_of(key)
        found: list[Any] = []
        dropped = 0

        def usable(i: int) -> bool:
            nonlocal dropped
            got = self._read_level(self.levels[i], key, name)
            if got is None:
                dropped += 1
                return False
            found.append(got)
            return True

        served = self.chain.locate(key, now, size=size, color=color, count=count, usable=usable)
        if served < len(self.levels):
            data = found[-1]
        else:
            data, bad = self._read_backing(key, name)
            dropped += bad
        if int(data.size) != size:
            raise ValueError(f"object {name!r}: {int(data.size)} bytes read, expected {size}")
        return served, data, dropped

    def _source_name(self, i: int) -> str:
        return self.levels[i].tier.name if i < len(self.levels) else self.backing.name

    def _move(self, src: int, dst: int, key: Key, size: int) -> None:
        """The chain decided a copy from level ``src`` (or the backing read) into ``dst``."""
        name = self.name_of(key)
        fl = self._in_flight
        if fl is not None and fl[0] == key and fl[1] == src:
            data = fl[2]
        else:
            data = self.levels[src].tier.get(name)
        self.levels[dst].tier.put(name, data)
        link = f"{self._source_name(src)}->{self.levels[dst].tier.name}"
        self.bytes_moved[link] = self.bytes_moved.get(link, 0) + size

    def _drop(self, i: int, key: Key, size: int, color: str | None) -> None:
        self.levels[i].tier.delete(self.name_of(key))

    def _verified(self, key: Key, tier: Tier, data: Any) -> bool:
        if self.validator is None:
            return True
        if self.validator(key, as_host_bytes(data)):
            return True
        self.corrupt_found[tier.name] = self.corrupt_found.get(tier.name, 0) + 1
        return False

    def _read_level(self, lvl: Level, key: Key, name: str) -> Any | None:
        try:
            data = lvl.tier.get(name)
        except TierMiss:
            lvl.tier.delete(name)
            return None
        if lvl.verify and not self._verified(key, lvl.tier, data):
            lvl.tier.delete(name)
            return None
        return data

    def _read_backing(self, key: Key, name: str) -> tuple[Any, int]:
        bad: list[str] = []
        missing: list[str] = []
        for store in [self.backing, *self.replicas]:
            for _ in range(self.retries + 1):
                try:
                    data = store.get(name)
                except TierMiss:
                    missing.append(store.name)
                    break
                if self._verified(key, store, data):
                    if store is not self.backing:  # repair the source of truth
                        self.backing.put(name, data)
                    return data, len(bad)
                bad.append(store.name)
        if bad:
            raise ObjectCorrupt(key, name, bad)
        raise ObjectMissing(key, name, [lvl.tier.name for lvl in self.levels] + missing)


def make_stack(
    backing: Tier,
    *,
    device_bytes: int = 0,
    host_bytes: int = 0,
    ssd_dir: str | Path | None = None,
    ssd_bytes: int = 0,
    policy: str = "lru",
    policy_params: dict[str, Any] | None = None,
    xp: ModuleType = np,
    replicas: Sequence[Tier] = (),
    high_watermark: float = 1.0,
    low_watermark: float = 1.0,
    cache: CacheCfg | None = None,
) -> TierStack:
    """The usual stack: device, host and SSD levels (each omitted when its capacity is 0)
    over ``backing``, every level a TierCache with ``policy``. The SSD level is verified.
    Watermarks default to 1.0 (evict only to make room), as in pure policy comparisons.

    ``cache``: the simulator's config section (:class:`engine.config.CacheCfg`); when given,
    the levels take its policies (``hbm_policy`` with ``params`` and the watermarks for the
    device, ``host_policy``, ``nvme_policy`` with watermarks 1.0 below), as the simulator's
    node tiers do, and ``policy``/``policy_params``/watermarks must be left at their defaults.
    """
    sizes = (device_bytes, host_bytes, ssd_bytes)
    if cache is not None:
        if (policy, policy_params, high_watermark, low_watermark) != ("lru", None, 1.0, 1.0):
            raise ValueError("give either cache (a CacheCfg) or policy/params/watermarks")
        caches = level_caches(cache, sizes, ("device", "host", "ssd"))
    else:
        caches = [
            None
            if capacity <= 0
            else TierCache(
                capacity,
                policy,
                dict(policy_params or {}),
                high_watermark=high_watermark,
                low_watermark=low_watermark,
                name=name,
            )
            for capacity, name in zip(sizes, ("device", "host", "ssd"), strict=True)
        ]
    tiers: list[tuple[Tier | None, bool]] = [
        (DeviceTier(xp=xp) if device_bytes else None, False),
        (HostTier(xp=xp) if host_bytes else None, False),
        (SsdTier(ssd_dir) if ssd_bytes and ssd_dir is not None else None, True),
    ]
    levels = [
        Level(tier, tc, verify)
        for (tier, verify), tc in zip(tiers, caches, strict=True)
        if tier is not None and tc is not None
    ]
    return TierStack(levels, backing, replicas=replicas)


def level_caches(
    cache: CacheCfg, sizes: tuple[int, int, int], names: tuple[str, str, str]
) -> list[TierCache | None]:
    """The HBM (device), host and NVMe (SSD) caches ``cache`` describes, of ``sizes`` bytes
    (``None`` for a level of size 0): ``hbm_policy`` with ``params`` and the watermarks (the
    low one capped at the high one) on top, ``host_policy`` and ``nvme_policy`` below with
    watermarks 1.0 (evict only to make room). The engine's stack and the simulator's weight
    store both build their levels here."""
    low = min(cache.low_watermark, cache.high_watermark)
    rules = [
        (cache.hbm_policy, dict(cache.params), cache.high_watermark, low),
        (cache.host_policy, {}, 1.0, 1.0),
        (cache.nvme_policy, {}, 1.0, 1.0),
    ]
    return [
        TierCache(size, pol, params, high_watermark=high, low_watermark=lw, name=name)
        if size > 0
        else None
        for size, name, (pol, params, high, lw) in zip(sizes, names, rules, strict=True)
    ]
