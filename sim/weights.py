"""A compute node's parameter store: HBM / pinned host / NVMe tiers and the fetch path.

Each tier is an :class:`engine.cache.TierCache` over the configured eviction policy (colour =
model name, for ``color-lru``). An HBM eviction demotes the chunk to host memory, a host
eviction to NVMe (inclusive staging: a chunk fetched from host stays there too).

Invariants kept here:

* ``counts[m][l]`` == number of chunks of layer ``l`` of model ``m`` resident in HBM, and
  ``full[m]`` == number of non-empty layers with every chunk resident, so "is model ``m``
  fully resident" is O(1) (updated on every admission and eviction callback);
* a chunk is in ``inflight_keys`` exactly while a transfer carrying it to this node runs.

Recency approximation: iterations do not touch a model's chunks one by one (that would cost
O(chunks) per step). The node records the times of the model's last ``TOUCH_HISTORY`` uses in
``pending_touch``; right before the next HBM admission (the only moment an eviction decision
can be made) the store replays, in time order, one touch per resident chunk per recorded use.
Policies thus see the correct last two uses of every resident chunk, but not the uses before
them (LRU-K with K <= 2 sees its exact K-distance; frequency counts are truncated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from engine.cache import TierCache
from sim.context import SimContext
from sim.metrics import EV_FETCH

HOST, NVME, REMOTE, OBJECT = 1, 2, 3, 4
#: uses replayed per model and flush: enough for LRU-K with K <= 2 to see its K-distance
TOUCH_HISTORY = 2


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
        c = ctx.sc.cache
        self.hbm = TierCache(
            hbm_bytes,
            policy=c.hbm_policy,
            policy_params=dict(c.params),
            high_watermark=c.high_watermark,
            low_watermark=min(c.low_watermark, c.high_watermark),
            on_evict=self._hbm_evicted,
            name=f"{name}.hbm",
        )
        self.host = (
            TierCache(
                host_bytes,
                policy=c.host_policy,
                high_watermark=1.0,
                low_watermark=1.0,
                on_evict=self._host_evicted,
                name=f"{name}.host",
            )
            if host_bytes > 0
            else None
        )
        self.nvme = (
            TierCache(
                nvme_bytes,
                policy=c.nvme_policy,
                high_watermark=1.0,
                low_watermark=1.0,
                name=f"{name}.nvme",
            )
            if nvme_bytes > 0
            else None
        )
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
        self.pending_touch: dict[int, list[float]] = {}
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
        """Make every chunk of model ``m`` resident (warm-up / coupled mode; no traffic
        counted). Returns False if HBM ran out of room."""
        sizes = self._size[m]
        base = self._base[m]
        if not self.resident_bytes[m]:  # nothing of it resident yet: one bulk admission
            items = [(base | cid, sizes[cid]) for cid in range(self._nchunks[m])]
            total = sum(sizes)
            if self.hbm.admit_many(items, now, self._colors[m]):
                self.counts[m] = list(self._lchunks[m])
                self.full[m] = self.ctx.models[m].nonempty_layers
                self.resident_bytes[m] = total
                return True
        return all(self._admit(m, cid, sizes[cid], now) for cid in range(self._nchunks[m]))

    def touch(self, m: int, now: float) -> None:
        """Model ``m``'s resident chunks were used at ``now`` (see the recency note)."""
        times = self.pending_touch.get(m)
        if times is None:
            self.pending_touch[m] = [now]
        elif times[-1] != now:
            times.append(now)
            if len(times) > TOUCH_HISTORY:
                del times[0]

    def _flush_touches(self) -> None:
        if not self.pending_touch:
            return
        items = sorted((t, m) for m, times in self.pending_touch.items() for t in times)
        self.pending_touch.clear()
        hbm = self.hbm
        lookup = hbm.lookup
        for t, m in items:
            base = self._base[m]
            for key in range(base, base + self._nchunks[m]):  # == base | cid, cid ascending
                if key in hbm:
                    lookup(key, t)

    def _admit(self, m: int, cid: int, size: int, now: float) -> bool:
        key = self._base[m] | cid
        hbm = self.hbm
        if key in hbm:
            return True
        if not hbm.admit(key, size, now, color=self._colors[m]):
            return False
        layer = self._layer_of[m][cid]
        c = self.counts[m]
        c[layer] += 1
        self.resident_bytes[m] += size
        if c[layer] == self._lchunks[m][layer]:
            self.full[m] += 1
        return True

    def _hbm_evicted(self, key: Any, size: int, color: str | None) -> None:
        m, cid = key >> 32, key & 0xFFFFFFFF
        layer = self._layer_of[m][cid]
        c = self.counts[m]
        if c[layer] == self._lchunks[m][layer]:
            self.full[m] -= 1
        c[layer] -= 1
        self.resident_bytes[m] -= size
        if self.host is not None and key not in self.host:
            self.host.admit(key, size, self.env.now, color=color)

    def _host_evicted(self, key: Any, size: int, color: str | None) -> None:
        if self.nvme is not None and key not in self.nvme and size <= self.nvme.capacity:
            self.nvme.admit(key, size, self.env.now, color=color)

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
    ) -> simpy.Event | None:
        """Start ONE aggregated transfer per source for chunks ``cids`` of ``layer`` (R21/R27:
        ``priority`` 0 = needed now). ``charge(tier, chunks, bytes)`` accounts the traffic.
        Returns the event that fires when all of them are resident, or ``None`` if none."""
        if not cids:
            pending = self.inflight.get((m, layer))
            return pending[-1] if pending else None
        env, now = self.env, self.env.now
        groups: dict[tuple[int, int, int], int] = {}
        counts = [0] * 5
        nbytes = [0] * 5
        host, nvme = self.host, self.nvme
        base, sizes = self._base[m], self._size[m]
        serve = self.ctx.directory.serve
        inflight_add = self.inflight_keys.add
        idx = self.idx
        for cid in cids:
            key = base | cid
            size = sizes[cid]
            if host is not None and host.lookup(key, now):
                g, tier = (HOST, 0, 0), HOST
            elif nvme is not None and nvme.lookup(key, now):
                g, tier = (NVME, 0, 0), NVME
            else:
                ps, ps_tier = serve(m, cid, key, size, now, idx)
                tier = OBJECT if ps_tier == OBJECT else REMOTE
                g = (REMOTE, ps, ps_tier)
            groups[g] = groups.get(g, 0) + size
            counts[tier] += 1
            nbytes[tier] += size
            inflight_add(key)
        for tier in range(1, 5):
            if counts[tier]:
                charge(tier, counts[tier], nbytes[tier])
        events = [
            self.ctx.network.transfer(self._path(g), size, priority)
            for g, size in sorted(groups.items())
        ]
        ev = events[0] if len(events) == 1 else simpy.AllOf(env, events)
        done = env.event()
        self.inflight.setdefault((m, layer), []).append(done)
        self.fetches_after_warmup += 1
        self.ctx.trace.rec(now, EV_FETCH, self.idx, (m << 20) | layer)
        ev.callbacks.append(lambda e: self._arrived(e, m, layer, cids, now, done))
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
        self, ev: simpy.Event, m: int, layer: int, cids: list[int], t0: float, done: simpy.Event
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
        self._flush_touches()
        self.ctx.metrics.fetch_lat.append(now - t0)
        sizes, admit = self._size[m], self._admit
        track, arrived_at = self.track_arrival, self.arrived_at
        for cid in cids:
            admit(m, cid, sizes[cid], now)
            if track:
                arrived_at[base | cid] = now
        done.succeed(True)

    def pin_layer(self, m: int, layer: int, pin: bool) -> None:
        """Pin (or unpin) every chunk of a fully resident layer while it computes."""
        base, ls = self._base[m], self._lstart[m]
        f = self.hbm.pin if pin else self.hbm.unpin
        for key in range(base + ls[layer], base + ls[layer + 1]):  # == base | cid
            f(key)
