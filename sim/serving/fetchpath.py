"""The node's fetch path: one iteration of a replica whose model is not all resident in HBM.

Functions over a :class:`sim.serving.replica.ComputeNode`. An iteration whose model is not fully resident
runs layer by layer (:func:`run_layers`): a layer computes only once all its chunks are in HBM
(pinned while it computes), missing chunks come as one aggregated transfer per source
(:meth:`sim.serving.paramstore.WeightStore.fetch`), and the next ``window`` layers are prefetched while
it computes (:func:`prefetch`, the engine's :class:`engine.prefetch.PrefetchPlanner`;
R7/R21/R27). With ``prefetch.order: after-pin`` (``node.hold_pins``, the real engine's order)
a layer is fetched and pinned before its prefetch is planned, and stays pinned until that
prefetch has landed.

Accounting: each chunk access (a layer's chunk when the layer computes) is counted once, an
HBM hit if it was resident then; the bytes a fetch moves are charged to the tier they came
from, per request in proportion to its share of the batch. The seconds an iteration waits for
weights are its ``param_wait``; its busy time is the wall time of the layers, less the time the
priority stream ran in its place while it waited (stream isolation, :meth:`sim.serving.streams.Streams.lend`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import simpy

from sim.serving.metrics import TIERS
from sim.simenv import SimTimeout

if TYPE_CHECKING:
    from sim.serving.replica import ComputeNode

_NT = len(TIERS)
#: wait before re-requesting chunks whose transfer failed (a dropped link; faults)
FETCH_RETRY_S = 1e-3

#: ``charge(tier, chunks, bytes)``: accounts a fetch's traffic (:meth:`WeightStore.fetch`)
Charge = Callable[[int, int, int], None]


def execute(
    node: ComputeNode, m: int, t: float, nb: int, carry: float = 0.0
) -> Generator[simpy.Event, Any, None]:
    """One iteration of model ``m``, compute ``t`` seconds, for a batch of ``nb``, after
    ``carry`` seconds that finish an interrupted decode step (already accounted as busy)."""
    if node.ws.all_resident(m):
        yield SimTimeout(node.env, carry + t)
        node.busy += t
        met = node.ctx.metrics
        met.busy += t
        c = node.ctx.models[m].n_chunks
        node.hits_view[0] += c
        node.cum_view[m][1] += c
        met.accesses += c
        node.ws.touch(m, node.env.now)
    else:
        if carry > 0:
            yield SimTimeout(node.env, carry)
        yield from run_layers(node, m, t, nb)


def make_charge(node: ComputeNode, m: int, nb: int) -> Charge:
    """The :data:`Charge` of an iteration of model ``m`` for a batch of ``nb``: a fetch's
    chunks and bytes go to the run's per-tier counters and, split evenly, to the batch's
    requests (``node.cum[m]``)."""
    met = node.ctx.metrics
    cum = node.cum[m]
    share = 1.0 / max(nb, 1)

    def charge(tier: int, count: int, nbytes: int) -> None:
        met.tier_hits[tier] += count
        met.tier_bytes[tier] += nbytes
        cum[1 + tier] += count
        cum[1 + _NT + tier] += nbytes * share

    return charge


def run_layers(
    node: ComputeNode, m: int, t_total: float, nb: int
) -> Generator[simpy.Event, Any, None]:
    """Run one iteration of model ``m`` (``t_total`` seconds of compute, split over the layers
    by ``layer_frac``) layer by layer, fetching what is missing and prefetching ahead (see the
    module docstring); a batch of ``nb`` shares the bytes moved."""
    env, ws, mr = node.env, node.ws, node.ctx.models[m]
    met = node.ctx.metrics
    cum = node.cum[m]
    charge = make_charge(node, m, nb)
    t_start, lent = env.now, node.lent
    wait = 0.0
    log = met.layer_log
    per_byte = mr.prefetch_s_per_byte_at(ws.hbm.capacity)
    counts = ws.counts[m]
    for layer in range(mr.n_layers):
        dt = t_total * float(mr.layer_frac[layer])
        nch = mr.layer_chunks[layer]
        if nch:
            # each chunk of the layer is accessed once, now: a hit if resident in HBM
            hit = counts[layer]
            met.tier_hits[0] += hit
            cum[1] += hit
            met.accesses += nch
            # hold_pins (the real engine's order): fetch the layer, pin it, then plan the
            # prefetch, so the prefetch overlaps the compute only; else plan first
            early = node.window and not node.hold_pins
            pf, pf_bytes = prefetch(node, m, layer, charge) if early else ([], 0)
            # the engine's rule: resident chunks pinned first, demand chunks as they land
            held: list[int] = []
            ws.pin_resident(m, layer, held)
            while len(held) < nch:
                ev = ws.fetch(m, layer, ws.missing(m, layer), 0, charge, pin_into=held)
                if ev is None:  # cannot happen: a missing chunk is in HBM or in flight
                    raise AssertionError(
                        f"layer {layer} of model {m} neither resident nor in flight"
                    )
                if node.streams is not None and node.streams.stream_of[m]:  # [streams]
                    yield from node.streams.lend(ev)  # lend the SMs
                t0 = env.now
                ok = yield ev
                if ok is False:  # a link on the path dropped: back off, then retry
                    met.fetch_retries += 1
                    yield SimTimeout(env, FETCH_RETRY_S)
                wait += env.now - t0
                ws.pin_resident(m, layer, held)  # chunks an earlier prefetch brought
            if log is not None:
                _log_layer(node, m, layer, log)
            if node.window:
                lo, hi = int(mr.layer_start[layer]), int(mr.layer_start[layer + 1])
                node.heat.record([mr.base | c for c in range(lo, hi)], env.now)
            if node.window and node.hold_pins:
                pf, pf_bytes = prefetch(node, m, layer, charge)
            # a calibrated engine's compute loses time to the copies it overlaps
            yield SimTimeout(env, dt + per_byte * pf_bytes if pf_bytes else dt)
            if node.hold_pins and pf:  # the real engine's rule (engine.runtime, hold_pins)
                t0 = env.now
                yield simpy.AllOf(env, pf)
                wait += env.now - t0
            ws.unpin(held)
        elif dt > 0:
            yield SimTimeout(env, dt)
    ws.touch(m, env.now)
    spent = env.now - t_start - (node.lent - lent)
    node.busy += spent
    met.busy += spent
    met.param_wait += wait
    cum[0] += wait


def _log_layer(
    node: ComputeNode, m: int, layer: int, log: list[tuple[float, int, int, int, float]]
) -> None:
    """Append ``(now, replica, model, layer, when its last chunk arrived)`` to the layer log
    (-1.0 when none of its chunks has an arrival time recorded)."""
    mr = node.ctx.models[m]
    arrived = max(
        (
            node.ws.arrived_at.get(mr.base | c, -1.0)
            for c in range(int(mr.layer_start[layer]), int(mr.layer_start[layer + 1]))
        ),
        default=-1.0,
    )
    log.append((node.env.now, node.idx, m, layer, arrived))


def prefetch(
    node: ComputeNode, m: int, layer: int, charge: Charge
) -> tuple[list[simpy.Event], int]:
    """Plan the next ``window`` layers after ``layer`` (wrapping into the next iteration) with
    the shared :class:`engine.prefetch.PrefetchPlanner` and start one fetch per planned layer,
    nearest first (priority = distance in layers; R7/R27), each moving after the model's
    ``prefetch_handoff_s``. Returns the fetches started and the bytes they move."""
    ws, mr = node.ws, node.ctx.models[m]
    base, ls, nl = mr.base, mr.layer_start, mr.n_layers
    layers = [(layer + d) % nl for d in range(1, node.window + 1)]
    upcoming = [[base | c for c in range(int(ls[j]), int(ls[j + 1]))] for j in layers]
    plan = node.planner.plan(upcoming, ws.hbm, ws.inflight_keys, node.env.now)
    by_dist: dict[int, list[int]] = {}
    for dist, key in plan:
        by_dist.setdefault(dist, []).append(int(key) & 0xFFFFFFFF)  # type: ignore[call-overload]
    issued: list[simpy.Event] = []
    moved = 0

    def count(tier: int, chunks: int, nbytes: int) -> None:
        nonlocal moved
        moved += nbytes
        charge(tier, chunks, nbytes)

    after = mr.prefetch_handoff_s
    for dist in sorted(by_dist):
        ev = ws.fetch(m, layers[dist], by_dist[dist], dist + 1, count, after=after)
        if ev is not None:
            issued.append(ev)
    return issued, moved
