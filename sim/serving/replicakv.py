"""KV accounting of a replica: admission, block growth, preemption and completion.

Functions over a :class:`sim.serving.replica.ComputeNode`'s batch state (the node owns the state; besides
these, only a crash, :meth:`sim.serving.replica.ComputeNode.abort_all`, and a turn's swap-in,
:mod:`sim.serving.turn`, change its KV side). The blocks themselves are held by
:class:`engine.kv.admission.KvAdmission` (the engine's admission object, over the engine's
:class:`engine.kv.allocator.KVBlockAllocator`; the rules: ``docs/design/admission.md``), so the
simulator and the engine admit, grow and preempt by one set of rules.

* **Admission** (:func:`admit`) reserves the blocks of the prompt only (never the unknown
  output length) and leaves ``admission_watermark`` of the blocks free; a replica with nothing
  running admits anything that fits at all. Queued requests are admitted in class order, head
  of line first: a request that does not fit stops admission (no lower class overtakes).
* **Growth**: a decoding sequence takes a new block when its context crosses a block boundary,
  i.e. once every ``block_tokens`` steps, at the steps of one residue. Sequences are bucketed by
  that residue (``node._res``), so a step's blocks are one bucket, taken in one bulk allocator
  call (:func:`grow_step`). A multi-step segment is checked to fit before it starts
  (:func:`fit_steps`, reads only) and takes the blocks of the steps that ran when it ends
  (:func:`grow_steps`).
* **Preemption** (:func:`preempt`): when blocks run out, the most recently admitted sequence of
  the model goes back to the front of its queue: ``recompute`` frees its blocks (it prefills
  prompt + generated tokens again), ``swap`` copies its KV to host swap space over PCIe (the
  seconds are charged to the iteration) and back when it resumes. Nothing is lost.
* **Completion** (:func:`complete`, :func:`finish`, :func:`release`): a finished or handed-off
  sequence gives its blocks back and closes its per-request counters.

Invariants: a rid is in ``node._order[m]`` and ``node._life`` exactly while it runs (prefilling
or decoding); a decoding rid has a ``node._base_of`` entry and, if its model has KV, sits in
exactly one residue bucket; ``node.running`` counts the running rids of all models. With
prefix caching a :class:`sim.serving.prefixcache.PrefixCache` does the admission object's take/give with
shared prompt blocks; its hooks are marked ``[prefix caching]``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from engine.kv.admission import KvAdmission
from sim.serving.metrics import DONE, EV_ADMIT, EV_DONE, EV_PREEMPT

if TYPE_CHECKING:
    from sim.serving.replica import ComputeNode


# -- admission -----------------------------------------------------------------------------------
def start_tokens(node: ComputeNode, rid: int) -> int:
    """KV tokens ``rid`` needs to (re)start: its prompt plus tokens generated earlier (a
    swapped-out or handed-in sequence: the KV it holds)."""
    sw = node._swapped.get(rid)
    if sw is not None:
        return sw[0]
    return node._inp[rid] + node._gen.get(rid, 0)


def fits(node: ComputeNode, rid: int, m: int, tokens: int = -1) -> bool:
    """Whether ``rid``'s blocks fit now, leaving the admission watermark free (a replica
    with nothing running admits anything that fits at all); ``tokens``: its
    :func:`start_tokens` when the caller has them (-1: computed here)."""
    bpt = node.ctx.models[m].kv_bytes_per_token
    if bpt == 0:
        return True
    if tokens < 0:
        tokens = start_tokens(node, rid)
    kv = node.kv
    if node.prefix is None:
        return kv.fits_tokens(tokens, bpt, node.running > 0)
    # [prefix caching] blocks running sequences already hold cost nothing
    return kv.fits(node.prefix.need(rid, m, tokens, bpt), node.running > 0)


def admit(node: ComputeNode, m: int, budget: int) -> tuple[list[int], list[int]]:
    """Admit queued requests of model ``m`` (class order, head of line first) while slots,
    token ``budget`` and KV blocks allow. Returns (admitted rids, swapped-in rids); the
    admitted ones are appended to ``node.pf[m]`` as ``[rid, tokens left, tokens done]``."""
    new: list[int] = []
    swapped: list[int] = []
    if not node.qlen:
        return new, swapped
    now = node.env.now
    ctx = node.ctx
    met, cum = ctx.metrics, node.cum[m]
    mr = ctx.models[m]
    bpt = mr.kv_bytes_per_token
    pf, order = node.pf[m], node._order[m]
    room = node.max_seqs - node.b_n[m] - len(pf)
    first_prompt = not pf  # unchunked: the iteration's first prompt runs whatever its size
    allows = KvAdmission.budget_allows
    node.kv.step = node.b_off[m]
    for c in ctx.class_order:
        q = node.queues[m][c]
        while q and room > 0:
            rid = q[0]
            sw = node._swapped.get(rid)
            tokens = start_tokens(node, rid)
            if (
                sw is None
                and not mr.is_cnn
                and not allows(tokens, budget, first_prompt, node.chunked)
            ):
                return new, swapped
            if not fits(node, rid, m, tokens):
                return new, swapped  # head-of-line: never let a lower class overtake
            q.popleft()
            node.qlen -= 1
            node.running += 1
            room -= 1
            order[rid] = None
            node._seqno += 1
            node._life[rid] = node._seqno
            skip = node.kv.take(rid, m, tokens, bpt, sw is None) if bpt else 0
            v = met.start[rid]
            if v != v:  # NaN: never started before (a float test, no numpy call)
                met.start[rid] = now
            row = met.acc[rid]  # a view: subtract in place
            row -= cum
            ctx.trace.rec(now, EV_ADMIT, rid, node.idx)
            if sw is not None:
                swapped.append(rid)
                continue
            if node.prefix_skip:  # a prefix read from the KV store (sim.disagg)
                skip = max(skip, node.prefix_skip.pop(rid, 0))
            pf.append([rid, tokens - skip, skip])  # skip: a reused cached prefix
            new.append(rid)
            budget -= tokens - skip
            first_prompt = False
    return new, swapped


# -- preemption ----------------------------------------------------------------------------------
def preempt(node: ComputeNode, m: int, off: int) -> float:
    """Preempt the most recently admitted sequence of model ``m`` (at step ``off``) and queue
    it at the front of its class; returns the seconds its swap-out adds to the iteration (0 for
    recompute)."""
    order = node._order[m]
    rid = KvAdmission.victim(order)
    del order[rid]
    mr = node.ctx.models[m]
    bpt = mr.kv_bytes_per_token
    met = node.ctx.metrics
    node.preemptions += 1
    node.running -= 1
    del node._life[rid]
    cost = 0.0
    pf = node.pf[m]
    for i, ent in enumerate(pf):
        if ent[0] == rid:  # still prefilling: its chunks are lost
            del pf[i]
            break
    else:
        base = node._base_of.pop(rid)
        node.b_n[m] -= 1
        node.b_base[m] -= base
        node._res[m][(1 - base) % node.kv.block_tokens].pop(rid, None)
        gen = base + off - node._inp[rid]  # tokens generated so far
        kv_tok = base + off - 1  # KV written so far (the allocator may lag behind)
        nbytes = kv_tok * bpt
        if node.swap and bpt and node.swap_used + nbytes <= node.swap_cap:
            node.swap_used += nbytes
            node.swap_moved += nbytes
            node._swapped[rid] = (kv_tok, gen)
            cost = nbytes / node.ws.links["pcie"].bandwidth
        else:
            node._gen[rid] = gen
    node.kv.step = off
    node.kv.preempt(rid, bpt)
    met.acc[rid] += node.cum[m]
    met.n_preempted += 1
    node.ctx.trace.rec(node.env.now, EV_PREEMPT, rid, node.idx)
    node.queues[m][node._cls[rid]].appendleft(rid)
    node.qlen += 1
    if node.b_n[m] == 0:
        node.b_base[m] = 0.0
    return cost


# -- growth of decoding sequences ----------------------------------------------------------------
def grow_step(node: ComputeNode, m: int, off: int) -> bool:
    """Take the KV blocks the decoding sequences need for step ``off`` (those owing one
    for an earlier step first), all or none; False when they do not fit."""
    bucket = node._res[m][off % node.kv.block_tokens]
    lag = node._lag[m]
    if not bucket and not lag:
        return True
    kv = node.kv
    bpt = node.ctx.models[m].kv_bytes_per_token
    if lag:
        life = node._life
        lag[:] = [e for e in lag if life.get(e[0]) == e[1]]
    if not kv.can_grow(len(bucket) + len(lag), bpt):
        return False
    if lag:
        take_blocks(node, m, [(rid, s) for rid, _, s in lag])
        lag.clear()
    if bucket:
        kv.grow_at(m, bucket, node._base_of, off, bpt)
    return True


def fit_steps(node: ComputeNode, m: int, off: int, k: int) -> int:
    """How many of steps ``off .. off + k - 1`` (step ``off``'s blocks already taken) the
    free KV blocks cover; reads only. Every decoding sequence needs one block per
    ``block_tokens`` steps, at the steps of its residue."""
    kv = node.kv
    bt = kv.block_tokens
    block = bt * node.ctx.models[m].kv_bytes_per_token
    if block == 0 or k <= 1:
        return k
    room = kv.free_blocks(node.ctx.models[m].kv_bytes_per_token)
    if node.b_n[m] * (-(-(k - 1) // bt)) <= room:  # an upper bound fits: no walk
        return k
    res = node._res[m]
    for s in range(off + 1, off + k):
        room -= len(res[s % bt])
        if room < 0:
            return s - off
    return k


def grow_steps(node: ComputeNode, m: int, lo: int, hi: int) -> None:
    """Take the blocks of steps ``lo .. hi - 1`` (checked by :func:`fit_steps`)."""
    if hi <= lo or not node.ctx.models[m].kv_bytes_per_token:
        return
    kv = node.kv
    res, bt, base_of = node._res[m], kv.block_tokens, node._base_of
    if hi - lo == 1:  # one step (most segments): one bucket
        bucket = res[lo % bt]
        if bucket:
            kv.grow_at(m, bucket, base_of, lo, node.ctx.models[m].kv_bytes_per_token)
        return
    # residue s's crossings in [lo, hi): steps s, s + bt, ...
    items = [
        (rid, base_of[rid] + t, t)
        for s in range(lo, min(hi, lo + bt))
        if (bucket := res[s % bt])
        for t in range(s, hi, bt)
        for rid in bucket
    ]
    if items:
        kv.grow(m, items, node.ctx.models[m].kv_bytes_per_token)


def take_blocks(node: ComputeNode, m: int, items: list[tuple[int, int]]) -> None:
    """Give each ``(rid, step)`` the one block its context crosses into at that step
    (:meth:`engine.kv.admission.KvAdmission.grow`, one bulk call)."""
    base_of = node._base_of
    node.kv.grow(
        m,
        [(rid, base_of[rid] + s, s) for rid, s in items],
        node.ctx.models[m].kv_bytes_per_token,
    )


def start_decoding(
    node: ComputeNode, m: int, rid: int, off: int, kv_tokens: int, gen: int, granted: bool = False
) -> None:
    """``rid`` (holding ``kv_tokens`` of KV, ``gen`` tokens generated) decodes from step
    ``off`` on; it finishes after ``out - gen`` more steps. ``granted``: step ``off``'s
    blocks were already taken for the others (it then owes its own until the next turn)."""
    base = kv_tokens + 1 - off
    node._base_of[rid] = base
    node.b_base[m] += base
    node.b_n[m] += 1
    seq = node._life[rid]
    heapq.heappush(node.b_heap[m], (off + node._out[rid] - gen, rid, seq))
    bt = node.kv.block_tokens
    if node.ctx.models[m].kv_bytes_per_token:
        # its blocks are exact (num_blocks(kv_tokens)), so its first new block is due at
        # the first step >= off of its residue
        q = (1 - base) % bt
        node._res[m][q][rid] = None
        if granted and off % bt == q:
            node._lag[m].append((rid, seq, off))


# -- completion ----------------------------------------------------------------------------------
def release(node: ComputeNode, m: int, rid: int) -> None:
    """Drop running sequence ``rid`` (not decoding) without finishing it: free its blocks
    and close its per-request counters (a prefill replica handing it off)."""
    bpt = node.ctx.models[m].kv_bytes_per_token
    if bpt and rid in node.kv.seqs:
        node.kv.give(rid, bpt)
    del node._order[m][rid]
    del node._life[rid]
    node.running -= 1
    row = node.ctx.metrics.acc[rid]  # a view: add in place
    row += node.cum[m]


def finish(node: ComputeNode, m: int, rid: int, now: float) -> None:
    """``rid`` is done: release its blocks, close its counters, record it, and tell the
    listeners (``on_unload``, the cluster's ``on_complete``)."""
    ctx = node.ctx
    met = ctx.metrics
    kv = node.kv
    kv.step = node.b_off[m]
    kv.finish(rid, ctx.models[m].kv_bytes_per_token)
    del node._order[m][rid]
    del node._life[rid]
    node.running -= 1
    met.end[rid] = now
    row = met.acc[rid]  # a view: add in place
    row += node.cum[m]
    met.finish(rid, DONE)
    ctx.trace.rec(now, EV_DONE, rid, node.idx)
    if node.on_unload is not None:
        node.on_unload(node)
    if ctx.on_complete is not None:
        ctx.on_complete(rid)


def complete(node: ComputeNode, m: int, off: int) -> None:
    """Finish every decoding sequence of model ``m`` whose last step is ``off`` or earlier
    (heap entries of an older life, i.e. preempted since, are skipped)."""
    heap = node.b_heap[m]
    if not heap or heap[0][0] > off:
        return
    now = node.env.now
    life = node._life
    res, bt = node._res[m], node.kv.block_tokens
    while heap and heap[0][0] <= off:
        _, rid, seq = heapq.heappop(heap)
        if life.get(rid) != seq:
            continue  # preempted since: an entry of an older life
        node.b_n[m] -= 1
        base = node._base_of.pop(rid)
        node.b_base[m] -= base
        res[(1 - base) % bt].pop(rid, None)
        finish(node, m, rid, now)
    if node.b_n[m] == 0:
        node.b_base[m] = 0.0
