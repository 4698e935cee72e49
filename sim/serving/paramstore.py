"""A compute node's parameter store: HBM / pinned host / NVMe tiers and the fetch path.

Each tier is an :class:`engine.cache.TierCache` over the configured eviction policy (colour =
model name, for ``color-lru``), and the three are one :class:`engine.tiers.chain.TierChain`:
the engine's tier stack decides through the same rules. A fetch looks the chunk up from HBM
down (a miss counted in each level above the one that serves it); when its transfer lands the
chunk is promoted into every level above the one that served it (inclusive caching); an
eviction demotes the chunk one level down.

Invariants kept here:

* ``counts[m][l]`` == number of chunks of layer ``l`` of model ``m`` resident in HBM, and
  ``full[m]`` == number of non-empty layers with every chunk resident, so "is model ``m``
  fully resident" is O(1) (updated on every HBM admission and on the chain's drop callback);
* a chunk is in ``inflight_keys`` exactly while a transfer carrying it to this node runs.

Recency approximation: iterations do not touch a model's chunks one by one (that would cost
O(chunks) per step). Uses are recorded per model in a :class:`engine.tiers.chain.TouchReplay`
and replayed right before the next HBM admission (the only moment an eviction decision can be
made), as the engine does: policies see the last two uses of every resident chunk, but not the
uses before them (LRU-K with K <= 2 sees its exact K-distance; frequency counts are truncated).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import simpy

from engine.cache import TierCache
from engine.tiers.chain import TierChain, TouchReplay
from engine.tiers.stack import level_caches
from sim.serving.context import SimContext
from sim.serving.metrics import EV_FETCH

HBM, HOST, NVME, REMOTE, OBJECT = 0, 1, 2, 3, 4


class WeightStore:
    """Weights of every model on one node; see the module docstring."""

    def __init__(
        self,
        ctx: SimContext,
        node_idx: int,
        name: str,
        hbm_bytes: int,
        host_bytes: int,
        nvme_bytes: int,
        links: dict[str, Any],
    ) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.idx = node_idx
        self.name = name
        self.links = links
        hbm, host, nvme = level_caches(
            ctx.sc.cache,
            (hbm_bytes, host_bytes, nvme_bytes),
            (f"{name}.hbm", f"{name}.host", f"{name}.nvme"),
        )
        if hbm is None:
            raise ValueError(f"{name}: the HBM weight cache needs a capacity > 0 bytes")
        self.hbm: TierCache = hbm
        self.host: TierCache | None = host
        self.nvme: TierCache | None = nvme
        levels = [(HBM, self.hbm), (HOST, self.host), (NVME, self.nvme)]
        #: the tier code (HBM, HOST, NVME) of each level of the chain, top first
        self.level_tier = [t for t, c in levels if c is not None]
        self.chain = TierChain([c for _, c in levels if c is not None], on_drop=self._dropped)
        n = len(ctx.models)
        self.counts: list[list[int]] = [[0] * m.n_layers for m in ctx.models]
        self.full: list[int] = [0] * n
        self.resident_bytes: list[int] = [0] * n
        self.chunk_layer = [np.repeat(np.arange(m.n_layers), m.layer_chunks) for m in ctx.models]
        # Plain-list views of the (immutable) model tables for the hot paths: indexing a list
        # is several times cheaper than indexing a numpy array and converting the scalar.
        self._base: list[int] = [m.base for m in ctx.models]
        self._size: list[list[int]] = [m.chunk_size.tolist() for m in ctx.models]
        self._layer_of: list[list[int]] = [cl.tolist() for cl in self.chunk_layer]
        self._lstart: list[list[int]] = [m.layer_start.tolist() for m in ctx.models]
        self._lchunks: list[list[int]] = [list(m.layer_chunks) for m in ctx.models]
        self._nchunks: list[int] = [m.n_chunks for m in ctx.models]
        self.inflight: dict[tuple[int, int], list[simpy.Event]] = {}
        self.inflight_keys: set[int] = set()
        self.touches = TouchReplay()
        for m in range(n):
            self.touches.register(m, partial(self._keys, m))
        self.track_arrival = ctx.sc.metrics.check_invariants
        self.arrived_at: dict[int, float] = {}
        self.fetches_after_warmup = 0
        self._colors = [m.name for m in ctx.models]

    # -- residency -------------------------------------------------------------------------
    def all_resident(self, m: int) -> bool:
        return self.full[m] == self.ctx.models[m].nonempty_layers

    def layer_resident(self, m: int, layer: int) -> bool:
        return self.counts[m][layer] == self._lchunks[m][layer]

    def affinity(self, m: int) -> float:
        """Share of model ``m``'s bytes resident in HBM (shard affinity, R2)."""
        return self.resident_bytes[m] / max(self.ctx.models[m].total_bytes, 1)

    def preload(self, m: int, now: float) -> bool:
        """Read every chunk of model ``m`` from the backing store, in id order, as the engine's
        cold-start warm-up does (warm-up / coupled mode; no traffic or lookups counted): each
        is promoted into every level. Returns False if HBM ran out of room."""
        sizes = self._size[m]
        base = self._base[m]
        if len(self.chain.levels) == 1 and not self.resident_bytes[m]:
            # HBM alone and nothing of the model in it: the same admissions, in one pass
            items = [(base | cid, sizes[cid]) for cid in range(self._nchunks[m])]
            if self.hbm.admit_many(items, now, self._colors[m]):
                self.counts[m] = list(self._lchunks[m])
                self.full[m] = self.ctx.models[m].nonempty_layers
                self.resident_bytes[m] = sum(sizes)
                return True
        backing = self.chain.backing
        # every chunk is read, as the engine's warm-up reads them all, even after a refusal
        ok = [self._promote(m, cid, sizes[cid], backing, now) for cid in range(self._nchunks[m])]
        return all(ok)

    def touch(self, m: int, now: float) -> None:
        """Model ``m``'s resident chunks were used at ``now`` (see the recency note)."""
        self.touches.record(m, now)

    def _keys(self, m: int) -> range:
        base = self._base[m]
        return range(base, base + self._nchunks[m])  # == base | cid, cid ascending

    def _promote(self, m: int, cid: int, size: int, served: int, now: float) -> bool:
        """Promote chunk ``cid`` (served by chain level ``served``) into every level above;
        keeps the HBM residency counters. True if it is resident in HBM afterwards."""
        key = self._base[m] | cid
        hbm = self.hbm
        if key in hbm:
            return True
        self.chain.promote(key, size, served, now, self._colors[m])
        if key not in hbm:
            return False
        layer = self._layer_of[m][cid]
        c = self.counts[m]
        c[layer] += 1
        self.resident_bytes[m] += size
        if c[layer] == self._lchunks[m][layer]:
            self.full[m] += 1
        return True

    def _dropped(self, level: int, key: Any, size: int, color: str | None) -> None:
        """The chain evicted ``key`` from ``level`` (after demoting it); HBM keeps counters."""
        if level != 0:
            return
        m, cid = key >> 32, key & 0xFFFFFFFF
        layer = self._layer_of[m][cid]
        c = self.counts[m]
        if c[layer] == self._lchunks[m][layer]:
            self.full[m] -= 1
        c[layer] -= 1
        self.resident_bytes[m] -= size

    # -- fetching ----------------------------------------------------------------------------
    def missing(self, m: int, layer: int) -> list[int]:
        """Chunk ids of ``layer`` neither resident in HBM nor in flight."""
        base, hbm, fl = self._base[m], self.hbm, self.inflight_keys
        ls = self._lstart[m]
        return [
            cid
            for cid in range(ls[layer], ls[layer + 1])
            if (base | cid) not in hbm and (base | cid) not in fl
        ]

    def fetch(
        self,
        m: int,
        layer: int,
        cids: list[int],
        priority: int,
        charge: Callable[[int, int, int], None],
        pin_into: list[int] | None = None,
        after: float = 0.0,
    ) -> simpy.Event | None:
        """Start ONE aggregated transfer per source for chunks ``cids`` of ``layer`` (R21/R27:
        ``priority`` 0 = needed now), its bytes moving ``after`` seconds from now (a copy
        thread's hand-off). ``charge(tier, chunks, bytes)`` accounts the traffic.
        With ``pin_into`` (a demand fetch) each chunk is pinned in HBM as it lands and its key
        appended there. Returns the event that fires when all of them have landed, or
        ``None`` if none."""
        if not cids:
            pending = self.inflight.get((m, layer))
            return pending[-1] if pending else None
        env, now = self.env, self.env.now
        groups: dict[tuple[int, int, int], int] = {}
        counts = [0] * 5
        nbytes = [0] * 5
        locate, level_tier, backing = self.chain.locate, self.level_tier, self.chain.backing
        base, sizes, color = self._base[m], self._size[m], self._colors[m]
        serve = self.ctx.directory.serve
        inflight_add = self.inflight_keys.add
        idx = self.idx
        todo: list[int] = []
        served: list[int] = []
        for cid in cids:
            key = base | cid
            size = sizes[cid]
            if key in self.hbm:  # resident after all (a stale plan): nothing to move
                continue
            level = locate(key, now, size=size, color=color)
            todo.append(cid)
            served.append(level)
            if level < backing:
                tier = level_tier[level]
                g = (tier, 0, 0)
            else:
                ps, ps_tier = serve(m, cid, key, size, now, idx)
                tier = OBJECT if ps_tier == OBJECT else REMOTE
                g = (REMOTE, ps, ps_tier)
            groups[g] = groups.get(g, 0) + size
            counts[tier] += 1
            nbytes[tier] += size
            inflight_add(key)
        if not todo:
            pending = self.inflight.get((m, layer))
            return pending[-1] if pending else None
        for tier in range(1, 5):
            if counts[tier]:
                charge(tier, counts[tier], nbytes[tier])
        events = [
            self.ctx.network.transfer(self._path(g), size, priority, after)
            for g, size in sorted(groups.items())
        ]
        ev = events[0] if len(events) == 1 else simpy.AllOf(env, events)
        done = env.event()
        self.inflight.setdefault((m, layer), []).append(done)
        self.fetches_after_warmup += 1
        self.ctx.trace.rec(now, EV_FETCH, self.idx, (m << 20) | layer)
        ev.callbacks.append(lambda e: self._arrived(e, m, layer, todo, served, now, done, pin_into))
        return done

    def _path(self, g: tuple[int, int, int]) -> list[Any]:
        lk = self.links
        if g[0] == HOST:
            return [lk["pcie"]]
        if g[0] == NVME:
            return [lk["nvme"], lk["pcie"]]
        ps = g[1]
        if ps < 0:  # no live replica: straight from the object store
            return [lk["object"], lk["pcie"]]
        return [*self.ctx.servers[ps].path_out(g[2]), lk["nic"], lk["pcie"]]

    def _arrived(
        self,
        ev: simpy.Event,
        m: int,
        layer: int,
        cids: list[int],
        served: list[int],
        t0: float,
        done: simpy.Event,
        pin_into: list[int] | None,
    ) -> None:
        now = self.env.now
        base = self._base[m]
        discard = self.inflight_keys.discard
        for cid in cids:
            discard(base | cid)
        pending = self.inflight.get((m, layer))
        if pending is not None:
            pending.remove(done)
            if not pending:
                del self.inflight[(m, layer)]
        if not ev.ok:  # a link dropped (faults): the caller finds the chunks missing and retries
            ev.defused = True
            done.succeed(False)
            return
        self.touches.replay(self.hbm)
        self.ctx.metrics.fetch_lat.append(now - t0)
        sizes, promote = self._size[m], self._promote
        track, arrived_at = self.track_arrival, self.arrived_at
        hbm = self.hbm
        for cid, level in zip(cids, served, strict=True):
            if promote(m, cid, sizes[cid], level, now) and pin_into is not None:
                key = base | cid
                if key not in pin_into:
                    hbm.pin(key)
                    pin_into.append(key)
            if track:
                arrived_at[base | cid] = now
        done.succeed(True)

    # -- streaming in (a cold start's load, sim.serving.coldstart) -----------------------------
    def begin_stream(self, m: int, layer: int) -> tuple[list[int], int, simpy.Event] | None:
        """Claim the chunks of ``layer`` neither resident nor in flight for a transfer the
        caller runs over its own path. Until :meth:`end_stream` they are in flight: a demand
        fetch of the layer waits for the returned event instead of fetching them again.
        Returns ``(chunk ids, bytes, done event)``, or None when nothing is missing."""
        cids = self.missing(m, layer)
        if not cids:
            return None
        base, sizes = self._base[m], self._size[m]
        for cid in cids:
            self.inflight_keys.add(base | cid)
        done = self.env.event()
        self.inflight.setdefault((m, layer), []).append(done)
        return cids, sum(sizes[c] for c in cids), done

    def end_stream(self, m: int, layer: int, cids: list[int], done: simpy.Event, ok: bool) -> None:
        """The transfer of a :meth:`begin_stream` claim ended; ``ok``: its bytes landed, and
        every chunk is promoted into every level (as read from the backing store). ``done``
        fires with ``ok`` (False: the caller or a demand fetch moves them again)."""
        base = self._base[m]
        for cid in cids:
            self.inflight_keys.discard(base | cid)
        pending = self.inflight.get((m, layer))
        if pending is not None and done in pending:
            pending.remove(done)
            if not pending:
                del self.inflight[(m, layer)]
        if ok:
            now = self.env.now
            self.touches.replay(self.hbm)
            sizes, backing = self._size[m], self.chain.backing
            for cid in cids:
                self._promote(m, cid, sizes[cid], backing, now)
        done.succeed(ok)

    def pin_resident(self, m: int, layer: int, held: list[int]) -> None:
        """Pin each chunk of ``layer`` resident in HBM and not yet in ``held`` (keys), in
        chunk order, and append it to ``held``."""
        base, ls, hbm = self._base[m], self._lstart[m], self.hbm
        for key in range(base + ls[layer], base + ls[layer + 1]):  # == base | cid
            if key in hbm and key not in held:
                hbm.pin(key)
                held.append(key)

    def missing_of(self, m: int, cids: list[int]) -> list[int]:
        """The chunk ids of ``cids`` (model ``m``) neither resident in HBM nor in flight, in
        the order given."""
        base, hbm, fl = self._base[m], self.hbm, self.inflight_keys
        return [cid for cid in cids if (base | cid) not in hbm and (base | cid) not in fl]

    def pin_chunks(self, m: int, cids: list[int], held: list[int]) -> None:
        """Pin each chunk of ``cids`` (model ``m``) resident in HBM and not yet in ``held``
        (keys), in the order given, and append its key to ``held``."""
        base, hbm = self._base[m], self.hbm
        for cid in cids:
            key = base | cid
            if key in hbm and key not in held:
                hbm.pin(key)
                held.append(key)

    def unpin(self, keys: list[int]) -> None:
        """Release one pin of each of ``keys``."""
        for key in keys:
            self.hbm.unpin(key)
