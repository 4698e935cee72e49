"""One turn of a replica's model: the timing of its iteration(s).

Functions over a :class:`sim.serving.replica.ComputeNode`; :func:`turn` is the node's ``turn``.
The batch comes from the replica's :class:`engine.sched.scheduler.Scheduler` (the engine's
scheduler: decodes, prefill chunks and admissions within the token budget, KV blocks and
preemption); this module prices it (:meth:`sim.serving.context.ModelRt.iter_cost`) and
advances simulated time. A turn of model ``m``:

1. ``schedule(m)``: the decoding sequences' blocks for the next step (preempting the newest
   while none is free), admissions, swap-ins, the prefill chunks that fit the budget;
2. runs either ONE **iteration** of at most ``max_num_batched_tokens`` tokens -- one per
   decoding sequence, then the prefill chunks, in ONE pass over the weights -- or, when nothing
   is prefilling, nothing was swapped and every weight of the model is resident, a fast
   **decode segment**;
3. ``complete(batch)`` (or ``advance_decode`` after a segment): prompts whose last chunk ran
   sample their first token (TTFT) and decode, finish or are handed off (``on_prefilled``);
   decoding sequences whose last step ran finish.

A model whose routed experts are chunks (``experts.enabled``) runs every step as an
iteration (:func:`sim.serving.expertpath.run_expert_layers`): each step draws its routing.

In a decode segment nothing can change until the next completion, KV block boundary or
arrival, so the replica runs ``k`` decode steps as ONE timeout (capped by
``max_steps_per_turn`` when other models wait, and by the free KV blocks,
:meth:`engine.sched.scheduler.Scheduler.fit_steps`); an arrival that could join cuts it short
(:meth:`sim.serving.replica.ComputeNode.submit`, :class:`sim.serving.segcut.SegmentCut`: the
process wakes now, as an interrupt would), the step in progress finishes and the replica
re-plans (the rest of that step is carried into the next iteration, ``node.carry``).

A model priced by a recording (``ModelRt.step_by_step``) runs one iteration per step.

Warm-up cost (off unless the cost model sets it, e.g. a calibrated engine's): the first
iteration after an idle spell pays :attr:`sim.serving.context.ModelRt.wake_s` (a decode segment
spreads it evenly over its steps).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from engine.kv.admission import iteration_kind
from sim.serving.expertpath import run_expert_layers
from sim.serving.fetchpath import execute
from sim.serving.segcut import CUT
from sim.simenv import SimTimeout

if TYPE_CHECKING:
    from engine.sched.scheduler import Batch
    from sim.serving.replica import ComputeNode


def turn(node: ComputeNode, m: int) -> Generator[simpy.Event, Any, None]:
    """Turns of model ``m`` (see the module docstring), one after another for as long as the
    replica's process would pick ``m`` again at once (no stream isolation, ``m`` still the
    current model, its quantum not used up, work left): the same turns as one call each,
    without returning to the process loop in between. Sets ``node.kind`` before each
    iteration's compute starts."""
    mr, ws, met, sched = node.ctx.models[m], node.ws, node.ctx.metrics, node.sched
    pf = sched.prefilling[m]
    while True:
        batch = sched.schedule(m)
        extra = 0.0
        if batch.swap_bytes:
            bw = ws.links["pcie"].bandwidth
            for b in batch.swap_bytes:
                extra += b / bw
        woke = node.take_woke()
        used = ws.hbm.used + sched.kv.reserved
        if used > met.peak_hbm:
            met.peak_hbm = used
        resident = ws.all_resident(m)  # a pure read; nothing below changes it before a yield
        # an iteration, or a decode segment
        if (
            pf
            or mr.is_cnn
            or not resident
            or extra > 0
            or mr.experts is not None
            or mr.step_by_step
        ):
            yield from _iterate(node, m, batch, extra, woke, resident)
        else:
            yield from _segment(node, m, batch, woke)
        if not node.continues(m):  # else the process loop would pick m again at once
            return


def _iterate(
    node: ComputeNode, m: int, batch: Batch, extra: float, woke: bool, resident: bool
) -> Generator[simpy.Event, Any, None]:
    """One iteration of ``batch`` plus ``extra`` seconds (swap copies), then its completion."""
    env, mr, ws, met = node.env, node.ctx.models[m], node.ws, node.ctx.metrics
    n = batch.num_decodes
    ptok = batch.prefill_tokens
    ends = batch.ends
    ctx_tok = node.sched.context_base[m] + n * batch.step
    t, fl, by = mr.pricer.iter_cost(ptok, batch.prefill_sq, len(ends), n, ctx_tok)
    node.kind = iteration_kind(ptok, n)
    t += extra
    if woke and mr.warm_on:  # the first iteration after an idle spell
        t += mr.wake_s
    carry, node.carry = node.carry, 0.0
    if ends and node.on_prefill_iter is not None:
        node.on_prefill_iter(node, [p.request_id for p in ends], carry + t)
    if mr.experts is not None:  # routed experts as chunks: every iteration draws its routing
        t0, lent = env.now, node.lent
        if carry > 0:
            yield SimTimeout(env, carry)
        yield from run_expert_layers(node, m, t, n + len(batch.chunks), ptok + n)
        spent = env.now - t0 - (node.lent - lent)
    elif resident:  # execute's all-resident case, inline (hot path)
        yield SimTimeout(env, carry + t)
        node.busy += t
        met.busy += t
        c = mr.n_chunks
        node.hits_view[0] += c
        node.cum_view[m][1] += c
        met.accesses += c
        ws.touch(m, env.now)
        spent = t
    else:
        t0, lent = env.now, node.lent
        yield from execute(node, m, t, n + len(batch.chunks), carry)
        spent = env.now - t0 - (node.lent - lent)  # [streams] less the time lent
    node.tok_s += (ptok + n) * spent
    node.flops += fl
    node.hbm_read += by
    node.iterations += 1
    node.quantum += 1
    node.sched.complete(batch)


def _segment(
    node: ComputeNode, m: int, batch: Batch, woke: bool
) -> Generator[simpy.Event, Any, None]:
    """A decode segment of ``batch``'s decodes: ``k`` steps as one timeout (see the module
    docstring), cut short by an arrival that could join; the steps that ran then advance
    the scheduler (their blocks, the completions)."""
    env, mr, ws, met, sched = node.env, node.ctx.models[m], node.ws, node.ctx.metrics, node.sched
    n, off = batch.num_decodes, batch.step
    # invariant: a model is picked only with work that can run (Scheduler.can_run), and the
    # one whose blocks the first step needed was preempted only for a fitting restart
    assert n > 0, f"replica {node.idx}: model {m} picked with nothing to run"
    k = sched.steps_to_next_finish(m)
    if sched.num_waiting or sched.others_decoding(m):
        k = min(k, max(node.max_steps - node.quantum, 1))
    k = sched.fit_steps(m, k)
    node.kind = iteration_kind(0, n)
    t_step, fl, by = mr.pricer.iter_cost(
        0, 0.0, 0, n, sched.context_base[m] + n * (off + (k - 1) / 2.0)
    )
    if woke and mr.warm_on:  # spread over the k steps (an interrupted segment pays its share)
        t_step += mr.wake_s / k
    if node.carry > 0:  # the interrupted step still has to finish
        carry, node.carry = node.carry, 0.0
        yield SimTimeout(env, carry)
    t0 = env.now
    node.seg_model = m
    seg = node.seg_ev = SimTimeout(env, k * t_step)
    if (yield seg) is CUT:  # an arrival that could join cut it short (sim.serving.segcut)
        steps = min(k, int((env.now - t0) / t_step) + 1)
        rest = max(t0 + steps * t_step - env.now, 0.0)
        if steps == k:  # completions are due at that boundary: wait for it here
            yield SimTimeout(env, rest)
        else:  # nothing completes: the next iteration starts after `rest` (one event)
            node.carry = rest
    else:
        steps = k
    node.seg_model = -1
    node.seg_ev = None
    node.quantum += steps
    node.busy += steps * t_step
    met.busy += steps * t_step
    node.tok_s += n * steps * t_step
    node.flops += fl * steps
    node.hbm_read += by * steps
    node.iterations += steps
    c = mr.n_chunks * steps
    node.hits_view[0] += c
    node.cum_view[m][1] += c
    met.accesses += c
    ws.touch(m, env.now)
    sched.advance_decode(m, steps)
