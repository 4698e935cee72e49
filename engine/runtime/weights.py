"""Weight sources: a layer's tensors assembled from its chunks.

A source answers ``layer(l)`` with the layer's bytes as one flat float32 array of the compute
backend (cut into tensors by :func:`engine.runtime.model.unpack`). Two sources:

* :class:`ResidentWeights` -- every layer regenerated once from the manifest's seed and kept
  (the reference run: "all weights resident").
* :class:`TieredWeights` -- chunks read through a :class:`engine.chunkstore.ChunkStore` (its
  :class:`engine.tiers.TierStack`: device, host, SSD over the object store; every read from SSD
  or the object store is verified). The device level's cache is the engine's HBM cache.

Accounting (the simulator's rules, :mod:`sim.node` / :mod:`sim.weights`, so the two report the
same numbers): each chunk is accessed once per iteration, when its layer is computed
(:meth:`TieredWeights.layer`): resident in the device level then, it counts one ``hbm`` hit;
each chunk fetched into the device level (demand or prefetch) counts one in the tier that
served it (``host``, ``nvme`` = SSD, ``object``) and its bytes there. A resident chunk's use is **not** looked up when it happens: as in the
simulator, the end of each iteration is recorded (:meth:`TieredWeights.touch`) and replayed
as one lookup per resident chunk right before the next admission, so both caches see the same
calls: these lookups, admissions on fetch, pins and evictions.

Thread safety: one lock (``self.lock``) guards the stack and counters; the prefetcher thread
and the compute thread both take it around every stack call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from engine.chunkstore import ChunkStore, layer_weights

__all__ = ["TIER_NAMES", "ResidentWeights", "TieredWeights", "WeightSource"]

#: per-tier counters, in the simulator's order (``remote`` is never used by one engine node)
TIER_NAMES: tuple[str, ...] = ("hbm", "host", "nvme", "remote", "object")
_LEVEL_TIER = {"device": 0, "host": 1, "ssd": 2, "object": 4}
TOUCH_HISTORY = 2  # iteration ends remembered between admissions (= sim.weights.TOUCH_HISTORY)


class WeightSource(Protocol):
    """What the scheduler needs from weights (see the module docstring)."""

    n_layers: int

    def layer(self, layer: int, now: float) -> Any:
        """Flat float32 values of ``layer`` (blocks until they are in device memory)."""
        ...

    def release(self, layer: int) -> None:
        """``layer`` finished computing (unpin its chunks)."""
        ...


class ResidentWeights:
    """Every layer regenerated from ``(seed, dtype, layer_bytes)`` and kept on backend ``xp``."""

    def __init__(self, seed: int, layer_bytes: list[int], xp: ModuleType = np) -> None:
        self.n_layers = len(layer_bytes)
        self._seed, self._sizes, self.xp = seed, list(layer_bytes), xp
        self._layers: list[Any] = []

    def load(self) -> None:
        """Generate every layer (call once before use; kept out of the constructor)."""
        self._layers = [
            self.xp.asarray(
                layer_weights(self._seed, self.n_layers, i, b, "float32").view(np.float32)
            )
            for i, b in enumerate(self._sizes)
        ]

    def layer(self, layer: int, now: float) -> Any:
        if not self._layers:
            self.load()
        return self._layers[layer]

    def release(self, layer: int) -> None:
        return None


class TieredWeights:
    """Chunks through a :class:`ChunkStore`'s tier stack; see the module docstring."""

    def __init__(self, store: ChunkStore, xp: ModuleType = np) -> None:
        self.store = store
        self.xp = xp
        self.table = store.table
        self.n_layers = self.table.n_layers
        self.device = store.stack.levels[0].cache
        self.lock = threading.Lock()
        self.hits = np.zeros(len(TIER_NAMES))
        self.bytes = np.zeros(len(TIER_NAMES))
        self.on_charge: Callable[[int, int, int], None] | None = None
        self._pinned: dict[int, list[tuple[str, int]]] = {}
        self._ids = [list(self.table.layer_slice(layer)) for layer in range(self.n_layers)]
        self._bufs: dict[int, Any] = {}  # layer -> assembled bytes of a multi-chunk layer
        self._parts: dict[int, list[Any]] = {}  # the chunk arrays that buffer was built from
        self.fetch_s = 0.0  # wall seconds spent in fetch() reads, and the bytes they moved
        self.fetch_bytes = 0
        self._touches: list[float] = []  # pending iteration ends (see touch)
        self._now = 0.0  # latest time handed to the caches: never decreases (two threads)

    def _clock(self, now: float) -> float:
        """Monotone time for the caches (call with the lock held)."""
        self._now = max(self._now, now)
        return self._now

    # -- queries (callers hold no lock; these take it) --------------------------------------
    def keys(self, layer: int) -> list[tuple[str, int]]:
        return [self.store.key(c) for c in self._ids[layer]]

    def missing(self, layer: int) -> list[int]:
        """Chunk ids of ``layer`` not resident in the device level."""
        with self.lock:
            return [c for c in self._ids[layer] if self.store.key(c) not in self.device]

    def all_resident(self) -> bool:
        with self.lock:
            return all(self.store.key(c) in self.device for c in range(self.table.n_chunks))

    # -- fetching -------------------------------------------------------------------------------
    def fetch(self, cids: list[int], now: float) -> None:
        """Bring chunks ``cids`` into the device level (prefetch or demand), charging sources."""
        for cid in cids:
            with self.lock:
                key = self.store.key(cid)
                if key in self.device:
                    continue
                self._flush_touches()
                t0 = time.perf_counter()
                res = self.store.read_chunk(cid, self._clock(now), count=True)
                self.fetch_s += time.perf_counter() - t0
                self.fetch_bytes += int(self.table.size[cid])
                self._charge(self._tier_of(res.level), 1, int(self.table.size[cid]))

    def warm(self, now: float = 0.0) -> None:
        """Read every chunk once in id order without counting (cold-start warm-up): the device
        level ends with the last chunks that fit, lower levels with the rest."""
        with self.lock:
            for cid in range(self.table.n_chunks):
                self.store.read_chunk(cid, now, count=False)

    def layer(self, layer: int, now: float) -> Any:
        """The layer's values from the device level; missing chunks are fetched first. The
        layer's chunks stay pinned until :meth:`release`. Fetch and pin happen under one
        lock hold, so no prefetch can evict a chunk between its fetch and its pin."""
        with self.lock:
            parts = []
            pins = []
            t = self._clock(now)
            hits = 0
            for cid in self._ids[layer]:
                key = self.store.key(cid)
                if key not in self.device:
                    self._flush_touches()
                    res = self.store.read_chunk(cid, t, count=True)
                    self._charge(self._tier_of(res.level), 1, int(self.table.size[cid]))
                else:
                    hits += 1
                self.device.pin(key)
                pins.append(key)
            self._charge(0, hits, 0)  # each chunk accessed once: resident now = an hbm hit
            for key in pins:
                parts.append(self.store.stack.levels[0].tier.get(self.store.stack.name_of(key)))
            self._pinned[layer] = pins
        return self._assemble(layer, parts).view(self.xp.float32)

    def _assemble(self, layer: int, parts: list[Any]) -> Any:
        """One flat array of the layer: the chunk itself when the layer is one chunk (no
        copy), else a per-layer buffer refilled only when some chunk array changed."""
        if len(parts) == 1:
            return parts[0]
        old = self._parts.get(layer)
        buf = self._bufs.get(layer)
        if buf is None:
            buf = self._bufs[layer] = self.xp.empty(sum(int(p.size) for p in parts), self.xp.uint8)
        if (
            old is None
            or len(old) != len(parts)
            or any(a is not b for a, b in zip(old, parts, strict=False))
        ):
            pos = 0
            for p in parts:
                buf[pos : pos + p.size] = p
                pos += int(p.size)
            self._parts[layer] = parts
        return buf

    def release(self, layer: int) -> None:
        with self.lock:
            for key in self._pinned.pop(layer, []):
                self.device.unpin(key)

    # -- recency of resident chunks (the simulator's rule, sim.weights) -----------------------
    def touch(self, now: float) -> None:
        """Every resident chunk was used by the iteration that ended at ``now``. As in the
        simulator, uses are not looked up one by one: the last ``TOUCH_HISTORY`` iteration
        ends are replayed (one lookup per resident chunk, in id order) right before the next
        device admission, so both caches see the same calls."""
        with self.lock:
            times = self._touches
            if not times or times[-1] != now:
                times.append(now)
                del times[:-TOUCH_HISTORY]

    def last_time(self) -> float:
        """The latest ``now`` handed to the caches."""
        with self.lock:
            return self._now

    def _flush_touches(self) -> None:
        """Replay the pending touches (call with the lock held, before an admission)."""
        if not self._touches:
            return
        times, self._touches = self._touches, []
        for t in times:
            for cid in range(self.table.n_chunks):
                key = self.store.key(cid)
                if key in self.device:
                    self.device.lookup(key, t)

    def _tier_of(self, level: int) -> int:
        levels = self.store.stack.levels
        return _LEVEL_TIER.get(levels[level].tier.kind, 4) if level < len(levels) else 4

    def _charge(self, tier: int, count: int, nbytes: int) -> None:
        self.hits[tier] += count
        self.bytes[tier] += nbytes
        if self.on_charge is not None:
            self.on_charge(tier, count, nbytes)
