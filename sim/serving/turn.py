"""One turn of a replica's model: batch formation and the timing of its iteration(s).

Functions over a :class:`sim.serving.replica.ComputeNode`; :func:`turn` is the node's ``_turn``. A turn of
model ``m``:

1. takes the KV blocks the decoding sequences need for the next step, preempting the newest
   sequence while none is free (:mod:`sim.serving.replicakv`);
2. admits queued requests within ``max_num_seqs`` and the token budget, and moves swapped-in
   (or handed-in, :mod:`sim.disagg`) sequences straight to decoding;
3. runs either ONE **iteration** of at most ``max_num_batched_tokens`` tokens -- one per
   decoding sequence, then prefill chunks of the prompts in admission order, in ONE pass over
   the weights (:meth:`sim.serving.context.ModelRt.iter_cost`) -- or, when nothing is prefilling,
   nothing was admitted and every weight of the model is resident, a fast **decode segment**;
4. finishes the sequences whose last step ran (:func:`sim.serving.replicakv.complete`).

A prompt whose last chunk runs samples its first token at the end of that iteration (TTFT);
it then decodes, finishes (one output token) or, on a disaggregated prefill replica, is handed
off (``on_prefilled``).

Decode state is O(1) to advance: ``node.b_off[m]`` counts the model's iterations; a sequence
that started decoding at ``a`` finishes at ``a + out - 1`` (a min-heap of those targets), and
the decoding sequences' total context is ``base + n * off``. In a decode segment nothing can
change until the next completion, KV block boundary or arrival, so the replica runs ``k``
decode steps as ONE timeout (capped by ``max_steps_per_turn`` when other models wait, and by
the free KV blocks, :func:`sim.serving.replicakv.fit_steps`); an arrival that could join cuts
it short (:meth:`sim.serving.replica.ComputeNode.submit`, :class:`sim.serving.segcut.SegmentCut`:
the process wakes now, as an interrupt would), the step in progress finishes and the replica
re-plans (the rest of that step is carried into the next iteration, ``node._carry``).

Warm-up cost (off unless the cost model sets it, e.g. a calibrated engine's): the first
iteration after an idle spell pays :attr:`sim.serving.context.ModelRt.wake_s` (a decode segment
spreads it evenly over its steps).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from engine.kv.admission import iteration_kind
from sim.serving.fetchpath import execute
from sim.serving.replicakv import (
    admit,
    complete,
    finish,
    fit_steps,
    grow_step,
    grow_steps,
    preempt,
    release,
    start_decoding,
)
from sim.serving.segcut import CUT
from sim.simenv import SimTimeout

if TYPE_CHECKING:
    from sim.serving.context import ModelRt
    from sim.serving.replica import ComputeNode

#: a prefilling sequence: ``[rid, tokens left, tokens done]``
Prompt = list[int]


def turn(node: ComputeNode, m: int) -> Generator[simpy.Event, Any, None]:
    """Turns of model ``m`` (see the module docstring), one after another for as long as the
    replica's process would pick ``m`` again at once (no stream isolation, ``m`` still the
    current model, its quantum not used up, work left): the same turns as one call each,
    without returning to the process loop in between. Sets ``node.kind`` before each
    iteration's compute starts."""
    mr, ws, met = node.ctx.models[m], node.ws, node.ctx.metrics
    pf = node.pf[m]
    while True:
        off = node.b_off[m]
        extra = 0.0
        # 1. the decoding sequences' next block (preempting the newest while none is free)
        while node.b_n[m] and not grow_step(node, m, off):
            extra += preempt(node, m, off)
        n = node.b_n[m]
        # 2. prefill chunks of running prompts, then newly admitted ones, within the budget
        left = node.max_tokens - n
        if pf:
            left -= sum(e[1] for e in pf)
        swapped = admit(node, m, left)[1]
        if swapped:
            extra = _swap_in(node, m, off, swapped, extra)
        n = node.b_n[m]
        woke, node._woke = node._woke, False
        used = ws.hbm.used + node.kv.reserved
        if used > met.peak_hbm:
            met.peak_hbm = used
        resident = ws.all_resident(m)  # a pure read; nothing below changes it before a yield
        # 3. one iteration, or a decode segment
        if pf or mr.is_cnn or not resident or extra > 0:
            off = yield from _iterate(node, m, off, n, extra, woke, resident)
        else:
            off = yield from _segment(node, m, off, n, woke)
        # 4. completions
        complete(node, m, off)
        if not node.continues(m):  # else the process loop would pick m again at once
            return


def others_running(node: ComputeNode, m: int) -> bool:
    """Whether a model other than ``m`` has decoding sequences on the replica."""
    b_n = node.b_n
    return len(b_n) > 1 and any(b for i, b in enumerate(b_n) if i != m)


def form_batch(
    node: ComputeNode, mr: ModelRt, pf: list[Prompt], left: int
) -> tuple[int, float, list[Prompt], list[tuple[Prompt, int]]]:
    """The prefill part of an iteration with ``left`` tokens of budget: a chunk of each
    prompt in admission order while budget is left (whole prompts when unchunked or a CNN;
    unchunked, a prompt that does not fit waits unless it is the first). Returns (prefill
    tokens, the sum of squared chunk lengths plus twice length x prior context, the prompts
    that end, the ``(prompt, chunk)`` pairs)."""
    ptok = 0
    sq = 0.0
    ends: list[Prompt] = []
    chunks: list[tuple[Prompt, int]] = []
    for ent in pf:
        if left <= 0:
            break
        c = ent[1] if (mr.is_cnn or not node.chunked) else min(ent[1], left)
        if not node.chunked and chunks and c > left:
            break
        p = ent[2]
        ptok += c
        sq += c * c + 2.0 * c * p
        left -= c
        chunks.append((ent, c))
        if c == ent[1]:
            ends.append(ent)
    return ptok, sq, ends, chunks


def _swap_in(node: ComputeNode, m: int, off: int, swapped: list[int], extra: float) -> float:
    """Start decoding the admitted ``swapped`` sequences at step ``off``: a handed-in one
    (disaggregation) at no cost, a swapped-out one after its KV comes back over PCIe. Returns
    ``extra`` plus the seconds of those copies (added one by one)."""
    mr = node.ctx.models[m]
    for rid in swapped:
        kv_tok, gen = node._swapped.pop(rid)
        if rid in node._handed:  # KV moved in from a prefill replica (sim.disagg)
            node._handed.discard(rid)
            start_decoding(node, m, rid, off, kv_tok, gen)
            continue
        node.swap_used -= kv_tok * mr.kv_bytes_per_token
        node.swap_moved += kv_tok * mr.kv_bytes_per_token
        bw = node.ws.links["pcie"].bandwidth
        extra += kv_tok * mr.kv_bytes_per_token / bw
        start_decoding(node, m, rid, off, kv_tok, gen, granted=True)
    return extra


def _iterate(
    node: ComputeNode, m: int, off: int, n: int, extra: float, woke: bool, resident: bool
) -> Generator[simpy.Event, Any, int]:
    """One iteration of ``n`` decodes and the prefill chunks that fit, plus ``extra``
    seconds (swap copies); returns the model's step count after it."""
    env, mr, ws, met = node.env, node.ctx.models[m], node.ws, node.ctx.metrics
    pf = node.pf[m]
    ptok, sq, ends, chunks = form_batch(node, mr, pf, node.max_tokens - n)
    ctx_tok = node.b_base[m] + n * off
    t, fl, by = mr.pricer.iter_cost(ptok, sq, len(ends), n, ctx_tok)
    node.kind = iteration_kind(ptok, n)
    t += extra
    if woke and mr.warm_on:  # the first iteration after an idle spell
        t += mr.wake_s
    carry, node._carry = node._carry, 0.0
    if ends and node.on_prefill_iter is not None:
        node.on_prefill_iter(node, [e[0] for e in ends], carry + t)
    if resident:  # execute's all-resident case, inline (hot path)
        yield SimTimeout(env, carry + t)
        node.busy += t
        met.busy += t
        c = mr.n_chunks
        node._hits_mv[0] += c
        node._cum_mv[m][1] += c
        met.accesses += c
        ws.touch(m, env.now)
        spent = t
    else:
        t0, lent = env.now, node._lent
        yield from execute(node, m, t, n + len(chunks), carry)
        spent = env.now - t0 - (node._lent - lent)  # [streams] less the time lent
    node.tok_s += (ptok + n) * spent
    node.flops += fl
    node.hbm_read += by
    node.iterations += 1
    node._quantum += 1
    off += 1
    node.b_off[m] = off
    for ent, c in chunks:
        ent[1] -= c
        ent[2] += c
    if node.prefix is not None and chunks:  # [prefix caching] computed blocks
        node.prefix.computed(m, chunks)
    _end_prompts(node, m, off, ends, env.now)
    return off


def _end_prompts(node: ComputeNode, m: int, off: int, ends: list[Prompt], now: float) -> None:
    """The prompts whose last chunk ran sample a token at ``now`` (their first, unless
    recomputed after a preemption), then finish, are handed off (a prefill replica) or
    decode from step ``off``."""
    pf = node.pf[m]
    first = node.ctx.metrics.first
    for ent in ends:
        rid = ent[0]
        pf.remove(ent)
        v = first[rid]
        if v != v:  # NaN: no first token yet
            first[rid] = now
        # the prefill samples one token (a CNN: its first pass; it then runs one pass
        # per step for its remaining `output_tokens`, as the model has always charged)
        gen = node._gen.pop(rid, 0) + 1
        if gen >= node._out[rid]:
            finish(node, m, rid, now)
            continue
        if node.role == "prefill" and node.on_prefilled is not None:
            release(node, m, rid)
            node.on_prefilled(node, m, rid, ent[2], gen)
            continue
        start_decoding(node, m, rid, off, ent[2], gen)


def _segment(
    node: ComputeNode, m: int, off: int, n: int, woke: bool
) -> Generator[simpy.Event, Any, int]:
    """A decode segment of ``n`` sequences from step ``off``: ``k`` steps as one timeout
    (see the module docstring), cut short by an arrival that could join; returns the model's
    step count after the steps that ran, whose KV blocks it takes."""
    env, mr, ws, met = node.env, node.ctx.models[m], node.ws, node.ctx.metrics
    # invariant: a model is picked only with work that can run (_runnable), and the
    # one whose blocks the first step needed was preempted only for a fitting restart
    assert n > 0, f"replica {node.idx}: model {m} picked with nothing to run"
    k = node.b_heap[m][0][0] - off
    if node.qlen or others_running(node, m):
        k = min(k, max(node.max_steps - node._quantum, 1))
    k = fit_steps(node, m, off, k)
    node.kind = iteration_kind(0, n)
    t_step, fl, by = mr.pricer.iter_cost(0, 0.0, 0, n, node.b_base[m] + n * (off + (k - 1) / 2.0))
    if woke and mr.warm_on:  # spread over the k steps (an interrupted segment pays its share)
        t_step += mr.wake_s / k
    if node._carry > 0:  # the interrupted step still has to finish
        carry, node._carry = node._carry, 0.0
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
            node._carry = rest
    else:
        steps = k
    node.seg_model = -1
    node.seg_ev = None
    grow_steps(node, m, off + 1, off + steps)  # the blocks of the steps that ran
    node._quantum += steps
    node.b_off[m] = off = off + steps
    node.busy += steps * t_step
    met.busy += steps * t_step
    node.tok_s += n * steps * t_step
    node.flops += fl * steps
    node.hbm_read += by * steps
    node.iterations += steps
    c = mr.n_chunks * steps
    node._hits_mv[0] += c
    node._cum_mv[m][1] += c
    met.accesses += c
    ws.touch(m, env.now)
    return off
