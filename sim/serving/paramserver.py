"""Parameter servers, the chunk directory, hot-shard replication and cold-start warm-up.

* :class:`ParamServer` holds chunks in a DRAM :class:`~engine.cache.TierCache` over an SSD one
  over the object store (R23/R25: hot -> warm -> cold). Serving a chunk promotes it to DRAM.
* :class:`MetadataDirectory` maps every chunk to the servers holding a replica. Initial
  placement is the consistent-hash ring (:class:`engine.hashring.HashRing`, with replication
  and optional bounded load). It is the in-process stand-in for the Raft-backed metadata
  service (issue 5): ``replicas``, ``add_replica``, ``drop_server`` are the whole interface.
* Hot shards (R8/R11): every ``window`` seconds the directory compares each chunk's request
  count in the window with an exponentially weighted baseline of earlier windows
  (``b <- (b + count) / 2``); a chunk with ``count >= min_count`` and ``count > factor * b``
  is hot and gains one replica on the next ring server (copied server-to-server over RDMA),
  up to ``max_replicas``. The first window only sets the baseline.
* Placement unit (``ring.placement``): ``shard`` puts whole shards on the ring -- a layer
  with ``layer`` sharding, a layer's head group with ``layer-head`` (R26) -- so a layer comes
  from one server (one flow); ``chunk`` (default) spreads every chunk on its own.
* Routing: a fetch goes to the live replicas of a chunk in rotation.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import simpy

from engine.cache import TierCache
from engine.hashring import HashRing
from sim.serving.context import SimContext
from sim.serving.metrics import EV_REPLICA

DRAM, SSD, OBJECT = 10, 11, 4


class ParamServer:
    """One parameter server (see the module docstring). ``up`` is False while stopped."""

    def __init__(self, ctx: SimContext, idx: int, name: str, links: dict[str, Any]) -> None:
        cfg = ctx.sc.cluster.ps
        self.ctx, self.idx, self.name, self.links = ctx, idx, name, links
        self.dram = TierCache(
            cfg.dram,
            "lru",
            high_watermark=1.0,
            low_watermark=1.0,
            on_evict=self._dram_evicted,
            name=f"{name}.dram",
        )
        self.ssd = TierCache(
            cfg.ssd, "lru", high_watermark=1.0, low_watermark=1.0, name=f"{name}.ssd"
        )
        self.up = True
        self.served = 0

    def stop(self) -> None:
        """Take the server out of service (faults); the directory routes around it."""
        self.up = False

    def start(self) -> None:
        self.up = True

    def _dram_evicted(self, key: Any, size: int, color: str | None) -> None:
        if key not in self.ssd and size <= self.ssd.capacity:
            self.ssd.admit(key, size, self.ctx.env.now)

    def serve(self, key: int, size: int, now: float) -> int:
        """Serve one chunk; returns where it came from (DRAM, SSD or OBJECT) and promotes it."""
        self.served += 1
        if self.dram.lookup(key, now):
            return DRAM
        if self.ssd.lookup(key, now):
            self.dram.admit(key, size, now)
            return SSD
        if size <= self.ssd.capacity:
            self.ssd.admit(key, size, now)
        self.dram.admit(key, size, now)
        return OBJECT

    def path_out(self, tier: int) -> list[Any]:
        """Links a chunk crosses from ``tier`` of this server to its NIC."""
        lk = self.links
        if tier == DRAM:
            return [lk["nic"]]
        if tier == SSD:
            return [lk["ssd"], lk["nic"]]
        return [lk["object"], lk["nic"]]


class MetadataDirectory:
    """Chunk -> replica servers; see the module docstring."""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        rc = ctx.sc.ring
        names = [s.name for s in ctx.servers]
        self.ring = HashRing(
            names,
            vnodes=rc.vnodes,
            replication=min(rc.replication, len(names)),
            load_factor=rc.load_factor,
        )
        index = {n: i for i, n in enumerate(names)}
        self._replicas: list[list[list[int]]] = []
        for m in ctx.models:
            keys = self.placement_keys(m, rc.placement)
            unique = list(dict.fromkeys(keys))  # first-seen order: deterministic
            placed = self.ring.assign(unique)
            # each chunk gets its own list (replicas of hot chunks grow independently)
            self._replicas.append([[index[s] for s in placed[k]] for k in keys])
        self.window_counts = [np.zeros(m.n_chunks, dtype=np.int64) for m in ctx.models]
        self.baseline: list[np.ndarray | None] = [None] * len(ctx.models)
        self._rr = 0

    @staticmethod
    def placement_keys(m: Any, placement: str) -> list[Any]:
        """Ring key of every chunk of model ``m``: the chunk itself (``chunk``), or its shard
        (``shard``: the layer, or the layer's head group with head sharding -- R26), so one
        server holds a whole shard and a layer fetch is one flow per server."""
        if placement == "chunk":
            return [m.base | cid for cid in range(m.n_chunks)]
        layer = np.repeat(np.arange(m.n_layers), m.layer_chunks)
        return [f"{m.name}/{int(la)}/{int(h)}" for la, h in zip(layer, m.chunk_head, strict=True)]

    def replicas(self, m: int, cid: int) -> list[int]:
        return self._replicas[m][cid]

    def add_replica(self, m: int, cid: int, ps: int) -> None:
        reps = self._replicas[m][cid]
        if ps not in reps:
            reps.append(ps)

    def drop_server(self, ps: int) -> None:
        """Forget every replica on server ``ps`` (e.g. after it was lost for good)."""
        for per_model in self._replicas:
            for reps in per_model:
                if ps in reps and len(reps) > 1:
                    reps.remove(ps)

    def serve(
        self, m: int, cid: int, key: int, size: int, now: float, node: int = -1
    ) -> tuple[int, int]:
        """Pick a live replica in rotation and serve from it: ``(server, tier)``; ``(-1,
        OBJECT)`` when no replica is up (the node then reads the object store itself).
        ``node`` is the requesting compute node (the fault-aware directory routes by it)."""
        self.window_counts[m][cid] += 1
        servers = self.ctx.servers
        reps = self._replicas[m][cid]
        live = [p for p in reps if servers[p].up]
        if not live:
            return -1, OBJECT
        self._rr += 1
        ps = live[self._rr % len(live)]
        return ps, servers[ps].serve(key, size, now)

    # -- warm-up and hot shards ------------------------------------------------------------
    def warm_up(self, shares: list[float], fraction: float, now: float) -> None:
        """Cold-start warm-up (R8): every server's SSD gets its chunks, its DRAM the hottest
        ones (models by traffic share, then layer order) up to ``fraction`` of its DRAM."""
        order = sorted(range(len(shares)), key=lambda i: (-shares[i], i))
        for ps in self.ctx.servers:
            limit = int(ps.dram.capacity * fraction)
            for m in order:
                mr = self.ctx.models[m]
                for cid in range(mr.n_chunks):
                    if ps.idx not in self._replicas[m][cid]:
                        continue
                    key, size = mr.base | cid, int(mr.chunk_size[cid])
                    if ps.ssd.used + size <= ps.ssd.capacity:
                        ps.ssd.admit(key, size, now)
                    if ps.dram.used + size <= limit:
                        ps.dram.admit(key, size, now)

    def hot_shard_process(self) -> Any:
        """SimPy process: detect hot chunks each window and replicate them."""
        cfg = self.ctx.sc.hot_shards
        env = self.ctx.env
        while True:
            yield env.timeout(cfg.window)
            self._detect(cfg)

    def _detect(self, cfg: Any) -> None:
        net = self.ctx.network
        copies: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for m, counts in enumerate(self.window_counts):
            base = self.baseline[m]
            if base is None:
                self.baseline[m] = counts.astype(np.float64)
                counts[:] = 0
                continue
            hot = np.nonzero((counts >= cfg.min_count) & (counts > cfg.factor * base))[0]
            self.baseline[m] = (base + counts) / 2.0
            counts[:] = 0
            mr = self.ctx.models[m]
            for cid in hot.tolist():
                reps = self._replicas[m][cid]
                if len(reps) >= cfg.max_replicas:
                    continue
                src = next((p for p in reps if self.ctx.servers[p].up), None)
                if src is None:
                    continue
                names = self.ring.lookup(mr.base | cid, n=min(len(reps) + 1, len(self.ring.nodes)))
                dst = next((self._index(n) for n in names if self._index(n) not in reps), None)
                if dst is None or not self.ctx.servers[dst].up:
                    continue
                copies.setdefault((src, dst), []).append((m, cid, int(mr.chunk_size[cid])))
        for (src, dst), items in sorted(copies.items()):
            nbytes = sum(s for _, _, s in items)
            path = [self.ctx.servers[src].links["nic"], self.ctx.servers[dst].links["nic"]]
            ev = net.transfer(path, nbytes, 2)
            ev.callbacks.append(partial(self._copied, dst=dst, items=items))

    def _copied(self, ev: simpy.Event, dst: int, items: list[tuple[int, int, int]]) -> None:
        if not ev.ok:
            ev.defused = True
            return
        now = self.ctx.env.now
        ps = self.ctx.servers[dst]
        for m, cid, size in items:
            key = self.ctx.models[m].base | cid
            ps.dram.admit(key, size, now)
            self.add_replica(m, cid, dst)
            self.ctx.trace.rec(now, EV_REPLICA, dst, key)
        self.ctx.metrics.replicas_added += len(items)

    def _index(self, name: str) -> int:
        for i, s in enumerate(self.ctx.servers):
            if s.name == name:
                return i
        raise KeyError(name)
