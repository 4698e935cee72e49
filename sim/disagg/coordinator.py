"""The coordinator of a disaggregated cluster: both routing hops, the KV store lookups and
the KV transfers between a prefill and a decode replica.

Life of a request (docs/disaggregation.md has the figures):

1. **Prefill hop.** The scheduler (:class:`DisaggScheduler`) places the request on a live
   prefill replica with the ``prefill_routing`` router. With the store on, its leading prompt
   blocks found in the store are read into the replica first (``KvStore.load_seconds``, one
   timeout) and their tokens are not prefilled (``ComputeNode.prefix_skip``; at most
   ``prompt - 1`` tokens: the last one always runs, it yields the first token's logits).
2. **Prefill.** The replica runs prefill-only iterations; the prompt's last chunk samples the
   first token (TTFT). The replica frees the prompt's blocks and hands the request over
   (``on_prefilled``); its blocks enter the store.
3. **KV transfer.** ``bytes = (kv_tokens - tokens of prefix blocks the decode replica already
   holds) x kv_bytes_per_token``, where ``kv_tokens`` is the prompt (plus any tokens generated
   before a preemption). Path: both replicas' NVLink links inside a server, both NICs across
   servers (processor-shared with weight traffic). With ``overlap`` the first ``(L-1)/L`` of
   the bytes leave when the prompt's last iteration starts (layer by layer as it computes) and
   the last layer's share when it ends; else all bytes leave at the end.
4. **Decode.** The KV lands; the decode replica admits the request like a swapped-in sequence
   (blocks taken, no prefill) and generates the rest (TPOT).

Faults: a transfer a dropped link fails, or whose two hosts a partition separates when it
starts or when it would land (the control plane's reachability, ``faults`` on), is re-sent
after ``retry`` to a live decode replica the prefill replica reaches, re-chosen; a decode
replica that died before its KV landed is replaced by another; with none live and reachable
the transfer waits. Requests a killed replica held go back to the prefill
hop (:class:`sim.control.degrade.Degrader`), starting over. No request is dropped silently.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from engine.cache import TierCache
from sim.disagg.poolconfig import DisaggCfg
from sim.disagg.routing import make_router
from sim.disagg.store import KvStore
from sim.serving.link import LinkDown
from sim.serving.metrics import EV_ARRIVE
from sim.serving.placement import Placement, Scheduler

if TYPE_CHECKING:
    from sim.serving.context import SimContext
    from sim.serving.replica import ComputeNode


class Disagg:
    """See the module docstring. ``prefill`` / ``decode``: the pools' replicas
    (:class:`sim.serving.replica.ComputeNode` with ``role`` set); ``blocks``: each request's prefix
    block ids (``[]`` when unknown); ``gpus``: GPUs of both pools."""

    def __init__(
        self,
        ctx: SimContext,
        cfg: DisaggCfg,
        prefill: list[ComputeNode],
        decode: list[ComputeNode],
        store: KvStore | None,
        blocks: list[list[int]],
        gpus: int,
    ) -> None:
        self.ctx, self.cfg, self.env = ctx, cfg, ctx.env
        self.prefill, self.decode, self.store, self.blocks = prefill, decode, store, blocks
        self.gpus = gpus
        #: each pool's replica factory (set by :func:`sim.disagg.build.build_pools`)
        self.factories: dict[str, Any] = {}
        self.n_layers = [max(m.n_layers, 1) for m in ctx.models]
        n = len(blocks)
        self.inp: list[int] = prefill[0].inp if prefill else []
        self.sched: DisaggScheduler | None = None
        #: per request: KV bytes of the transfer that landed, prompt tokens the store saved,
        #: seconds from the hand-off to the KV landing (NaN: not handed off)
        self.bytes_moved = np.zeros(n)
        self.skipped = np.zeros(n, dtype=np.int64)
        self.wait = np.full(n, np.nan)
        self.handoff = np.full(n, np.nan)  # when the prefill replica handed it over
        self.router_p = make_router(cfg.prefill_routing)
        self.router_d = make_router(cfg.decode_routing)
        bt = cfg.store.block_tokens
        self.block_tokens = bt
        #: per decode replica: the prefix blocks its KV holds (an LRU index, KV-sized)
        self.held: dict[int, TierCache] = {
            d.idx: TierCache(capacity=max(d.kv.capacity, 1), policy="lru", name=f"held{d.idx}")
            for d in decode
        }
        self.incoming: dict[int, int] = {d.idx: 0 for d in decode}
        self._early: dict[int, tuple[ComputeNode, simpy.Event, int]] = {}
        self.transfers = self.retries = self.rerouted = self.nvlink = self.rdma = 0
        #: transfers that waited for a live decode replica the prefill replica reaches
        self.blocked = 0
        for node in prefill:
            node.role = "prefill"
            node.on_prefilled = self.on_prefilled
            if cfg.overlap:
                node.on_prefill_iter = self.on_prefill_iter
        for node in decode:
            node.role = "decode"

    # -- measures for the routers ----------------------------------------------------------
    def _prefill_load(self, node: ComputeNode) -> float:
        if self.cfg.prefill_routing != "kv-aware":
            return float(node.qlen + node.running)
        left = sum(p.num_tokens_left for pf in node.sched.prefilling for p in pf)
        skip = node.prefix_skip
        for per in node.sched.waiting:
            for q in per:
                left += sum(self.inp[r] - skip.get(r, 0) for r in q)
        return float(left)

    def _held_blocks(self, node: ComputeNode, m: int, rid: int) -> int:
        idx = self.held.get(node.idx)
        if idx is None:
            return 0
        k = 0
        for h in self.blocks[rid]:
            if KvStore.key(m, h) not in idx:
                break
            k += 1
        return k

    def choose_prefill(self, nodes: Sequence[ComputeNode]) -> ComputeNode:
        node: ComputeNode = self.router_p.choose(nodes, self._prefill_load, lambda n: 0.0)
        return node

    def _reach(self, src: ComputeNode, dst: ComputeNode) -> bool:
        """Whether ``src`` and ``dst`` reach each other (no partition between them)."""
        reach = getattr(getattr(self.ctx.directory, "meta", None), "reach", None)
        return reach is None or (reach.ok(src.name, dst.name) and reach.ok(dst.name, src.name))

    def choose_decode(self, m: int, rid: int, src: ComputeNode) -> ComputeNode | None:
        live = [d for d in self.decode if d.up and self._reach(src, d)]
        if not live:
            return None
        node: ComputeNode = self.router_d.choose(
            live,
            lambda n: float(n.qlen + n.running + self.incoming[n.idx]),
            lambda n: float(self._held_blocks(n, m, rid)),
        )
        return node

    # -- the prefill hop -------------------------------------------------------------------
    def place_prefill(self, rid: int, node: ComputeNode, m: int) -> None:
        """Send ``rid`` to prefill replica ``node`` (after reading its store hits)."""
        if m < 0:
            m = int(node.model_of[rid])
        delay, skip = 0.0, 0
        blocks = self.blocks[rid]
        if self.store is not None and blocks:
            found = self.store.lookup(m, blocks, self.env.now)
            hit = sum(found)
            if hit:
                skip = min(hit * self.block_tokens, self.inp[rid] - 1)
                bb = self.block_tokens * self.ctx.models[m].kv_bytes_per_token
                delay = self.store.load_seconds(found, bb)
        self.skipped[rid] = skip
        if skip > 0:
            node.prefix_skip[rid] = skip
        if delay > 0:
            ev = self.env.timeout(delay)
            ev.callbacks.append(lambda _e: self._submit(rid, node, m))
        else:
            node.submit(rid, m)

    def _submit(self, rid: int, node: ComputeNode, m: int) -> None:
        if node.up:
            node.submit(rid, m)
            return
        node.prefix_skip.pop(rid, None)  # the replica died while the store was read
        assert self.sched is not None
        self.sched.replace(rid)

    # -- node hooks ------------------------------------------------------------------------
    def on_prefill_iter(self, node: ComputeNode, rids: list[int], seconds: float) -> None:
        """Overlap: an iteration ending prompts ``rids`` starts on ``node``; send the KV of
        every layer but the last as it computes (one flow each)."""
        for rid in rids:
            old = self._early.pop(rid, None)  # a flow of an earlier life (preempted, killed)
            if old is not None:
                self.incoming[old[0].idx] -= 1
            m = int(node.model_of[rid])
            dst = self.choose_decode(m, rid, node)
            if dst is None:
                continue
            kv_tok = self.inp[rid] + node.sched.generated.get(rid, 0)
            total = self._bytes(dst, m, rid, kv_tok)
            early = total * (self.n_layers[m] - 1) // self.n_layers[m]
            ev = self.ctx.network.transfer(self._path(node, dst), early)
            ev.callbacks.append(_defuse)
            self.incoming[dst.idx] += 1
            self._early[rid] = (dst, ev, early)

    def on_prefilled(
        self, node: ComputeNode, m: int, rid: int, kv_tokens: int, generated: int
    ) -> None:
        """``node`` finished ``rid``'s prompt: keep its blocks in the store, move its KV."""
        now = self.env.now
        if self.store is not None and self.blocks[rid]:
            bb = self.block_tokens * self.ctx.models[m].kv_bytes_per_token
            self.store.admit(m, self.blocks[rid], bb, now)
        self.env.process(self._move(node, m, rid, kv_tokens, generated, now))

    # -- the transfer ----------------------------------------------------------------------
    def _bytes(self, dst: ComputeNode, m: int, rid: int, kv_tokens: int) -> int:
        held = min(self._held_blocks(dst, m, rid) * self.block_tokens, kv_tokens)
        return int((kv_tokens - held) * self.ctx.models[m].kv_bytes_per_token)

    @staticmethod
    def _path(src: ComputeNode, dst: ComputeNode) -> list[Any]:
        kind = "nvlink" if src.server == dst.server else "nic"
        return [src.ws.links[kind], dst.ws.links[kind]]

    def _await_early(self, rid: int) -> Generator[simpy.Event, Any, tuple[ComputeNode | None, int]]:
        """Wait for the layer-by-layer transfer started during ``rid``'s prefill, if any:
        ``(its destination, bytes it delivered)``, 0 bytes when it failed (a retry);
        ``(None, 0)`` when none was started."""
        early = self._early.pop(rid, None)
        if early is None:
            return None, 0
        dst, ev, nb = early
        sent = 0
        if not ev.triggered or ev.ok:
            try:
                yield ev
                sent = nb
            except LinkDown:
                self.retries += 1
        else:
            self.retries += 1
        self.incoming[dst.idx] -= 1
        return dst, sent

    def _move(
        self, src: ComputeNode, m: int, rid: int, kv_tokens: int, gen: int, t0: float
    ) -> Generator[simpy.Event, Any, None]:
        env, net = self.env, self.ctx.network
        blocked = False
        self.handoff[rid] = t0
        dst, sent = yield from self._await_early(rid)
        while True:
            if dst is None or not dst.up or not self._reach(src, dst):
                if dst is not None:
                    self.rerouted += 1
                    sent = 0
                dst = self.choose_decode(m, rid, src)
                if dst is None:  # no live decode replica: wait for one
                    if not blocked:
                        blocked = True
                        self.blocked += 1
                    yield env.timeout(self.cfg.retry)
                    continue
            total = self._bytes(dst, m, rid, kv_tokens)
            self.incoming[dst.idx] += 1
            ok = True
            try:
                yield net.transfer(self._path(src, dst), max(total - sent, 0))
            except LinkDown:
                ok = False
            self.incoming[dst.idx] -= 1
            ok = ok and self._reach(src, dst)  # a partition cut the flow before it landed
            if ok and dst.up:
                break
            if not ok:
                self.retries += 1
                sent = 0
                yield env.timeout(self.cfg.retry)
        now = env.now
        self.transfers += 1
        if src.server == dst.server:
            self.nvlink += 1
        else:
            self.rdma += 1
        self.bytes_moved[rid] = total
        self.wait[rid] = now - t0
        bb = self.block_tokens * self.ctx.models[m].kv_bytes_per_token
        idx = self.held[dst.idx]
        if bb <= idx.capacity:
            for h in self.blocks[rid]:
                idx.access(KvStore.key(m, h), bb, now)
        dst.accept_kv(rid, m, kv_tokens, gen)

    # -- results ---------------------------------------------------------------------------
    def summary(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """The ``disaggregation`` section of the summary (docs/disaggregation.md)."""
        moved = self.bytes_moved[~np.isnan(self.wait)]
        waits = self.wait[~np.isnan(self.wait)]
        prompt = float(sum(self.inp)) if self.inp else 0.0

        def pool(nodes: list[ComputeNode]) -> dict[str, int]:
            tp = nodes[0].tp if nodes else 0
            return {"replicas": len(nodes), "tp": tp, "gpus": len(nodes) * tp}

        out: dict[str, Any] = {
            "prefill": pool(self.prefill),
            "decode": pool(self.decode),
            "gpus": self.gpus,
            "kv_transfers": self.transfers,
            "kv_bytes_moved": float(moved.sum()),
            "kv_bytes_per_request": float(moved.mean()) if moved.size else None,
            "kv_transfer_s": {
                "p50": float(np.percentile(waits, 50)) if waits.size else None,
                "p99": float(np.percentile(waits, 99)) if waits.size else None,
                "mean": float(waits.mean()) if waits.size else None,
            },
            "nvlink_transfers": self.nvlink,
            "rdma_transfers": self.rdma,
            "transfer_retries": self.retries,
            "rerouted": self.rerouted,
            "blocked": self.blocked,
            "prefill_tokens_skipped": int(self.skipped.sum()),
            "skipped_share": float(self.skipped.sum()) / prompt if prompt else 0.0,
        }
        if self.store is not None:
            out["store"] = {
                "accesses": self.store.accesses,
                "hits": dict(self.store.hits),
                "hit_rate": self.store.hit_rates(),
            }
        return out


def _defuse(ev: simpy.Event) -> None:
    """A failed early flow nobody waits for any more must not crash the run."""
    if not ev.ok:
        ev.defused = True


class _PrefillPlacement(Placement):
    """The scheduler's placement policy on the prefill hop: the coordinator's router."""

    def __init__(self, ctx: SimContext, rng: np.random.Generator, co: Disagg) -> None:
        super().__init__(ctx, rng)
        self.co = co

    def choose(self, model: int, nodes: list[ComputeNode], now: float) -> ComputeNode:
        return self.co.choose_prefill(nodes)


class DisaggScheduler(Scheduler):
    """The front door of a disaggregated cluster: arrivals (and requests a killed replica
    held) go to the prefill pool; degradation applies as in :class:`Scheduler`."""

    def __init__(self, ctx: SimContext, rng: np.random.Generator, co: Disagg) -> None:
        super().__init__(ctx, rng)
        self.co = co
        self.policy = _PrefillPlacement(ctx, rng, co)
        co.sched = self

    def live_nodes(self) -> list[ComputeNode]:
        """The prefill replicas that are up (cached until one's ``up`` changes)."""
        live = self._live
        if live is None:
            live = self._live = [n for n in self.co.prefill if n.up]
        return live

    def _place(self, rid: int, node: ComputeNode, now: float, m: int = -1) -> None:
        ctx = self.ctx
        ctx.metrics.node[rid] = node.idx
        ctx.trace.rec(now, EV_ARRIVE, rid, node.idx)
        self.co.place_prefill(rid, node, m)

    def replace(self, rid: int) -> None:
        """Place ``rid`` again on a live prefill replica (waiting ``retry`` while none is)."""
        live = self.live_nodes()
        if live:
            self._place(rid, self.policy.choose(-1, live, self.ctx.env.now), self.ctx.env.now)
            return
        ev = self.ctx.env.timeout(self.co.cfg.retry)
        ev.callbacks.append(lambda _e: self.replace(rid))
