"""One iteration of a model whose routed experts are parameter chunks (``experts.enabled``).

:func:`run_expert_layers` replaces :func:`sim.serving.fetchpath.run_layers` for such a model;
the replica's turn (:mod:`sim.serving.turn`) sends every iteration of it here. An iteration:

1. asks the replica's router (:class:`ExpertState`) which experts its tokens route to, per
   expert layer (:mod:`sim.serving.expertroute`);
2. runs layer by layer: a layer needs its dense chunks and the chunks of the experts it
   activated; the resident ones are pinned (an expert found resident is one HBM hit and one
   lookup at that moment, which is what LRU / LRU-K see), the missing ones come as one
   aggregated transfer per source (:meth:`sim.serving.paramstore.WeightStore.fetch`, pinned
   as they land) and the layer computes once all are in HBM -- the iteration waits for a
   routing miss on the link model before the layer's grouped GEMM;
3. with ``experts.prefetch``, while a layer computes, the next expert layer's likely experts
   (active in at least ``experts.prefetch_share`` of the replica's iterations so far,
   :class:`sim.serving.expertroute.Popularity`) start moving unless resident or in flight;
4. after a layer computes its experts are unpinned; its dense chunks keep one pin for good
   (``ExpertState.sticky``): the HBM cache's evictable content is the experts, so the
   budget is an expert cache next to resident dense weights.

Recency: iteration ends are not recorded for this model (:meth:`WeightStore.touch` would
refresh every resident expert); an expert's uses are its own lookups. The layer prefetch of
``prefetch.window`` does not apply to such a model (it would fetch every expert of a layer).

Accounting: each needed chunk counts one access (:attr:`Metrics.accesses`, an HBM hit when
resident), as for dense layers; :class:`ExpertState` counts expert accesses, hits, demand
fetches, prefetches and the expert bytes moved.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from sim.serving.expertroute import Popularity, Router, TraceRouter, ZipfRouter, read_routing_trace
from sim.serving.fetchpath import FETCH_RETRY_S, make_charge
from sim.serving.workload import trace_path
from sim.simenv import SimTimeout

if TYPE_CHECKING:
    from sim.serving.context import SimContext
    from sim.serving.expertlayout import ExpertTable
    from sim.serving.replica import ComputeNode


class ExpertState:
    """One replica's routing of one model and its expert counters."""

    def __init__(
        self, table: ExpertTable, router: Router, prefetch: bool, prefetch_share: float = 0.5
    ) -> None:
        self.table = table
        self.router = router
        self.prefetch = prefetch
        self.prefetch_share = prefetch_share
        self.popularity = Popularity(len(table.layers), max(table.n_experts))
        #: the model's iterations on this replica so far (the routing step)
        self.step = 0
        #: dense chunk keys holding their permanent pin
        self.sticky: set[int] = set()
        self.accesses = 0
        self.hits = 0
        self.demand_fetched = 0
        self.prefetched = 0
        self.bytes_moved = 0
        #: most distinct experts one expert layer activated in one iteration, and the
        #: tokens of that iteration
        self.max_active = 0
        self.max_active_tokens = 0

    def route(self, tokens: int) -> list[np.ndarray]:
        """The experts this iteration's ``tokens`` tokens activate, per expert layer; advances
        the step and records the activations in the popularity counts."""
        routes = self.router.route(self.step, tokens)
        self.step += 1
        for j, experts in enumerate(routes):
            self.popularity.record(j, experts)
            if len(experts) > self.max_active:
                self.max_active, self.max_active_tokens = len(experts), tokens
        return routes

    def summary(self) -> dict[str, float | int | None]:
        """The counters, with ``hit_rate`` = hits / accesses (None without an access)."""
        return {
            "accesses": self.accesses,
            "hits": self.hits,
            "hit_rate": self.hits / self.accesses if self.accesses else None,
            "demand_fetched": self.demand_fetched,
            "prefetched": self.prefetched,
            "bytes_moved": self.bytes_moved,
            "max_active_per_layer": self.max_active,
        }


def merge_summaries(states: list[ExpertState]) -> dict[str, float | int | None]:
    """The counters of ``states`` added up (``hit_rate`` over all of them)."""
    keys = ("accesses", "hits", "demand_fetched", "prefetched", "bytes_moved")
    out: dict[str, float | int | None] = {k: sum(int(getattr(s, k)) for s in states) for k in keys}
    acc, hits = int(out["accesses"] or 0), int(out["hits"] or 0)
    out["hit_rate"] = hits / acc if acc else None
    out["max_active_per_layer"] = max((s.max_active for s in states), default=0)
    return out


def run_expert_layers(
    node: ComputeNode, m: int, t_total: float, nb: int, tokens: int
) -> Generator[simpy.Event, Any, None]:
    """One iteration of model ``m`` (``t_total`` seconds of compute split over the layers by
    ``layer_frac``) for a batch of ``nb`` requests and ``tokens`` tokens (module docstring)."""
    env, mr = node.env, node.ctx.models[m]
    st = node.experts[m]
    tab = mr.experts
    assert st is not None and tab is not None, f"model {m} has no expert state"
    met = node.ctx.metrics
    charge = make_charge(node, m, nb)
    routes = st.route(tokens)
    t_start, lent = env.now, node.lent
    wait = 0.0
    n_exp = len(tab.layers)
    for layer in range(mr.n_layers):
        dt = t_total * float(mr.layer_frac[layer])
        lo, hi = int(mr.layer_start[layer]), int(mr.layer_start[layer + 1])
        if lo < hi:
            j = tab.of_layer[layer]
            first = tab.first[j] if j >= 0 else hi
            experts = [first + int(e) for e in routes[j]] if j >= 0 else []
            needed = [*range(lo, first), *experts]
            _count_uses(node, m, st, range(lo, first), experts)
            held: list[int] = []
            wait += yield from _demand(node, m, layer, needed, held, st, charge)
            if st.prefetch and j >= 0 and n_exp > 1:
                _prefetch(node, m, st, (j + 1) % n_exp, charge)
        if dt > 0:
            yield SimTimeout(env, dt)
        if lo < hi:
            _release(node, st, held, first)
    spent = env.now - t_start - (node.lent - lent)
    node.busy += spent
    met.busy += spent
    met.param_wait += wait
    node.cum[m][0] += wait


def _count_uses(
    node: ComputeNode, m: int, st: ExpertState, dense: range, experts: list[int]
) -> None:
    """Count one access per needed chunk (an HBM hit when resident) and look each resident
    expert up now (its recency for LRU / LRU-K)."""
    hbm, base, now = node.ws.hbm, node.ctx.models[m].base, node.env.now
    hit = 0
    for cid in dense:
        hit += (base | cid) in hbm
    for cid in experts:
        if (base | cid) in hbm:
            hbm.lookup(base | cid, now)
            hit += 1
            st.hits += 1
    st.accesses += len(experts)
    met = node.ctx.metrics
    met.tier_hits[0] += hit
    node.cum[m][1] += hit
    met.accesses += len(dense) + len(experts)


def _demand(
    node: ComputeNode,
    m: int,
    layer: int,
    needed: list[int],
    held: list[int],
    st: ExpertState,
    charge: Any,
) -> Generator[simpy.Event, Any, float]:
    """Pin the resident chunks of ``needed`` and fetch the missing ones (pinned as they
    land) until all are held; returns the seconds waited."""
    env, ws, tab = node.env, node.ws, st.table
    j = tab.of_layer[layer]
    first = tab.first[j] if j >= 0 else 1 << 62
    wait = 0.0
    ws.pin_chunks(m, needed, held)
    while len(held) < len(needed):
        miss = ws.missing_of(m, needed)
        for cid in miss:
            if cid >= first:
                st.demand_fetched += 1
                st.bytes_moved += tab.expert_bytes[j]
        ev = ws.fetch(m, layer, miss, 0, charge, pin_into=held)
        if ev is None:  # cannot happen: a missing chunk is in HBM or in flight
            raise AssertionError(f"layer {layer} of model {m} neither resident nor in flight")
        if node.streams is not None and node.streams.stream_of[m]:  # [streams]
            yield from node.streams.lend(ev)
        t0 = env.now
        ok = yield ev
        if ok is False:  # a link on the path dropped: back off, then retry
            node.ctx.metrics.fetch_retries += 1
            yield SimTimeout(env, FETCH_RETRY_S)
        wait += env.now - t0
        ws.pin_chunks(m, needed, held)
    return wait


def _release(node: ComputeNode, st: ExpertState, held: list[int], first: int) -> None:
    """After a layer computed: unpin its experts; a dense chunk (id below ``first``) pinned
    for the first time keeps that pin for good (``st.sticky``)."""
    hbm, sticky = node.ws.hbm, st.sticky
    for key in held:
        if (key & 0xFFFFFFFF) < first and key not in sticky:
            sticky.add(key)
        else:
            hbm.unpin(key)


def _prefetch(node: ComputeNode, m: int, st: ExpertState, j: int, charge: Any) -> None:
    """Start moving the likely experts of expert layer ``j`` (``st.prefetch_share``) that
    are neither resident nor in flight (one aggregated transfer per source, priority 1)."""
    ws, mr, tab = node.ws, node.ctx.models[m], st.table
    first = tab.first[j]
    cids = ws.missing_of(m, [first + e for e in st.popularity.likely(j, st.prefetch_share)])
    if not cids:
        return
    st.prefetched += len(cids)
    st.bytes_moved += len(cids) * tab.expert_bytes[j]
    ws.fetch(m, tab.layers[j], cids, 1, charge, after=mr.prefetch_handoff_s)


def attach_experts(ctx: SimContext, base_dir: Path | None) -> None:
    """Give every replica an :class:`ExpertState` per model whose experts are chunks: the
    routing trace (``experts.trace``, read once, relative to ``base_dir``) or a Zipf router
    on the random stream ``experts.<replica>.<model>``. :class:`InputError` for a bad
    trace."""
    cfg = ctx.sc.experts
    traces: dict[int, TraceRouter] = {}
    for mr in ctx.models:
        tab = mr.experts
        if tab is not None and cfg.routing == "trace":
            assert cfg.trace is not None  # the section's validator
            path = trace_path(cfg.trace, base_dir)
            traces[mr.idx] = read_routing_trace(path, tab.blocks, tab.n_experts)
    for node in ctx.nodes:
        for mr in ctx.models:
            tab = mr.experts
            if tab is None:
                continue
            router: Router = traces.get(mr.idx) or ZipfRouter(
                len(tab.layers),
                max(tab.n_experts),
                tab.top_k,
                cfg.zipf,
                ctx.rngs.get(f"experts.{node.idx}.{mr.idx}"),
            )
            node.experts[mr.idx] = ExpertState(tab, router, cfg.prefetch, cfg.prefetch_share)
