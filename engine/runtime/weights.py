"""Weight sources: a layer's tensors assembled from its chunks.

A source answers ``layer(l)`` with the layer's bytes as one flat float32 array of the compute
backend (cut into tensors by :func:`engine.runtime.model.unpack`). Two sources:

* :class:`ResidentWeights` -- every layer regenerated once from the manifest's seed and kept
  (the reference run: "all weights resident").
* :class:`TieredWeights` -- chunks read through a :class:`engine.chunkstore.ChunkStore` (its
  :class:`engine.tiers.TierStack`: device, host, SSD over the object store; every read from SSD
  or the object store is verified). The device level's cache is the engine's HBM cache.

Accounting (the simulator's rules, :mod:`sim.serving.replica` / :mod:`sim.serving.paramstore`, so the two report the
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
from engine.tiers.chain import TouchReplay

__all__ = ["TIER_NAMES", "ResidentWeights", "TieredWeights", "WeightSource"]

#: per-tier counters, in the simulator's order (``remote`` is never used by one engine node)
TIER_NAMES: tuple[str, ...] = ("hbm", "host", "nvme", "remote", "object")
_LEVEL_TIER = {"device": 0, "host": 1, "ssd": 2, "object": 4}


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

    def __init__(
        self,
        store: ChunkStore,
        xp: ModuleType = np,
        *,
        touches: TouchReplay | None = None,
        group: int = 0,
    ) -> None:
        """``touches``: the replay record shared by every model on ``store``'s stack (a new one
        when this is the only model); ``group``: this model's index in it."""
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
        self.fetch_cpu_s = 0.0  # the reading threads' CPU seconds in those reads
        self.fetch_bytes = 0
        self._touches = touches if touches is not None else TouchReplay()  # see touch
        self._group = group
        keys = [store.key(c) for c in range(self.table.n_chunks)]
        self._touches.register(group, lambda: keys)
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
    def fetch(self, cids: list[int], now: float) -> int:
        """Bring chunks ``cids`` into the device level (prefetch or demand) as one transfer,
        charging sources (the simulator's rule: locate all, replay touches, promote all).
        Returns the bytes it moved (0 when every chunk was already resident)."""
        with self.lock:
            todo = [c for c in cids if self.store.key(c) not in self.device]
            if not todo:
                return 0
            t0, c0 = time.perf_counter(), time.thread_time()
            results = self.store.read_chunks(
                todo, self._clock(now), count=True, before_promote=self._flush_touches
            )
            # CPU window inside the wall window: read the CPU clock last at the start and
            # first at the end, so fetch_cpu_s <= fetch_s up to the clocks' resolution
            c1 = time.thread_time()
            self.fetch_s += time.perf_counter() - t0
            self.fetch_cpu_s += c1 - c0
            moved = 0
            for cid, res in zip(todo, results, strict=True):
                size = int(self.table.size[cid])
                moved += size
                self._charge(self._tier_of(res.level), 1, size)
            self.fetch_bytes += moved
            return moved

    def warm(self, now: float = 0.0) -> None:
        """Read every chunk once in id order without counting (cold-start warm-up): the device
        level ends with the last chunks that fit, lower levels with the rest. Then assemble
        each multi-chunk layer whose chunks are all in the device level (:meth:`layer`'s
        buffer), as a server builds its weight views before its first request: else the
        first iteration copies every such layer into fresh pages (the 67 MB validation
        decoder: 205 ms against 45 ms for the same iteration warm)."""
        with self.lock:
            for cid in range(self.table.n_chunks):
                self.store.read_chunk(cid, now, count=False)
            for layer in range(self.n_layers):
                keys = self.keys(layer)
                if len(keys) > 1 and all(k in self.device for k in keys):
                    self._assemble(layer, self._device_parts(keys))

    def layer(self, layer: int, now: float) -> Any:
        """The layer's values from the device level; missing chunks are fetched first. The
        layer's chunks stay pinned until :meth:`release`. Fetch and pin happen under one
        lock hold, so no prefetch can evict a chunk between its fetch and its pin."""
        with self.lock:
            t = self._clock(now)
            ids = self._ids[layer]
            keys = [self.store.key(c) for c in ids]
            device = self.device
            # The simulator's rule (sim.serving.replica): resident chunks are pinned first (each access
            # once, a hit), then the missing ones come in one transfer per round, each pinned
            # as it lands; a round repeats only for chunks a concurrent eviction took.
            missing = [c for c, k in zip(ids, keys, strict=True) if k not in device]
            pinned = [k for k in keys if k in device]
            for k in pinned:
                device.pin(k)
            self._charge(0, len(pinned), 0)
            while missing:
                results = self.store.read_chunks(
                    missing, t, count=True, before_promote=self._flush_touches, pin=True
                )
                for cid, res in zip(missing, results, strict=True):
                    self._charge(self._tier_of(res.level), 1, int(self.table.size[cid]))
                landed = [self.store.key(c) for c in missing if self.store.key(c) in device]
                if not landed:
                    raise RuntimeError(
                        f"layer {layer}: the device level ({device.capacity} B, {device.used} B "
                        "in use) has no unpinned room for its missing chunks"
                    )
                pinned += landed
                missing = [c for c in missing if self.store.key(c) not in device]
            parts = self._device_parts(keys)
            self._pinned[layer] = pinned
        return self._assemble(layer, parts).view(self.xp.float32)

    def _device_parts(self, keys: list[tuple[str, int]]) -> list[Any]:
        """The device level's arrays of chunks ``keys``, in order (call with the lock held;
        every key resident)."""
        name_of, tier = self.store.stack.name_of, self.store.stack.levels[0].tier
        return [tier.get(name_of(key)) for key in keys]

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

    # -- recency of resident chunks (the simulator's rule, sim.serving.paramstore) -----------------------
    def touch(self, now: float) -> None:
        """Every resident chunk was used by the iteration that ended at ``now``. As in the
        simulator (one :class:`engine.tiers.chain.TouchReplay` rule), uses are not looked up
        one by one: the last iteration ends are replayed (one lookup per resident chunk, in id
        order) right before the next device admission, so both caches see the same calls."""
        with self.lock:
            self._touches.record(self._group, now)

    def last_time(self) -> float:
        """The latest ``now`` handed to the caches."""
        with self.lock:
            return self._now

    def _flush_touches(self) -> None:
        """Replay the pending touches (call with the lock held, before an admission)."""
        self._touches.replay(self.device)

    def _tier_of(self, level: int) -> int:
        levels = self.store.stack.levels
        return _LEVEL_TIER.get(levels[level].tier.kind, 4) if level < len(levels) else 4

    def _charge(self, tier: int, count: int, nbytes: int) -> None:
        self.hits[tier] += count
        self.bytes[tier] += nbytes
        if self.on_charge is not None:
            self.on_charge(tier, count, nbytes)
