"""Stream isolation on a multi-model replica (R13, ``cluster.replica.streams: isolated``).

The models of protected classes (``degradation.protected``, a deployment's ``cls``) run on a
priority stream (0), the rest on stream 1. A replica is still one SimPy process
(:class:`sim.serving.replica.ComputeNode`); its turn selection becomes :func:`pick_streams` and :func:`stream_turn`:

* **no waiting for turns**: each stream with runnable work competes by *virtual time* (the GPU
  seconds it used divided by its share, ``stream_share`` for stream 0, the rest for stream 1);
  the smaller runs. While the other stream has work a turn is one iteration (a fast decode
  segment is capped at one step), so neither stream waits for more than one iteration of the
  other, and while both compute each gets its share of the GPU time: an iteration-grained
  approximation of two CUDA streams sharing the SMs. A stream without work banks no credit
  (its virtual time is lifted to the other's).
* **no waiting for another model's weights**: while a stream-1 iteration waits for weight
  chunks (copies run on the copy engines, not the SMs), the priority stream runs its runnable
  iterations (:func:`lend`); the waiting iteration does not count that time as
  its own (busy time, token budget, virtual time): ``ComputeNode._lent`` accumulates it.

Within a stream, models take turns as on a shared replica (``max_steps_per_turn`` each).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

if TYPE_CHECKING:
    from sim.serving.replica import ComputeNode


def stream_pick(node: ComputeNode, s: int) -> int:
    """Stream ``s``'s next model (no side effects): _pick's rule over its models."""
    assert node._stream is not None
    cur = node._s_last[s]
    if cur >= 0 and node._s_quant[s] < node.max_steps and node._runnable(cur):
        return cur
    nm = len(node.b_n)
    for i in range(1, nm + 1):
        m = (cur + i) % nm
        if node._stream[m] == s and node._runnable(m):
            return m
    return -1


def pick_streams(node: ComputeNode) -> int:
    """Stream isolation: the model to run next. Each stream with runnable work competes
    by virtual time (GPU seconds it used / its share); the smaller runs, ties to the
    priority stream 0. A stream without runnable work banks no credit: its virtual time
    is lifted to the other's. So neither stream waits for more than one iteration of the
    other, and while both have work each gets its share of the GPU time (an
    iteration-grained approximation of two streams sharing the GPU)."""
    ready = (stream_pick(node, 0), stream_pick(node, 1))
    vt = node._vt
    for s in (0, 1):
        if ready[s] < 0:
            vt[s] = max(vt[s], vt[1 - s])
    if ready[0] >= 0 and (ready[1] < 0 or vt[0] <= vt[1]):
        s = 0
    elif ready[1] >= 0:
        s = 1
    else:
        return -1
    m = ready[s]
    if m != node._s_last[s] or node._s_quant[s] >= node.max_steps:
        node._s_quant[s] = 0
    node._s_last[s] = node._cur = m
    return m


def stream_turn(node: ComputeNode, m: int) -> Generator[simpy.Event, Any, None]:
    """One turn of ``m`` on its stream: at most one decode step while the other stream has
    work (a fast segment is capped by the quantum left), its GPU time charged to the
    stream's virtual time."""
    assert node._stream is not None
    s = node._stream[m]
    q0 = node._s_quant[s]
    node._quantum = qb = max(q0, node.max_steps - 1) if stream_pick(node, 1 - s) >= 0 else q0
    t0, lent = node.env.now, node._lent
    yield from node._turn(m)
    node._s_quant[s] = q0 + node._quantum - qb
    node._vt[s] += (node.env.now - t0 - (node._lent - lent)) / node._share[s]


def lend(node: ComputeNode, ev: simpy.Event) -> Generator[simpy.Event, Any, None]:
    """Stream isolation: while a non-priority iteration waits for weights ``ev`` (copies
    run on the copy engines, not the SMs), the priority stream runs its runnable
    iterations until ``ev`` fires; their time goes to ``_lent``, which the waiting
    iteration does not count as its own (busy time, token budget, virtual time)."""
    assert node._stream is not None
    saved = (node._cur, node._quantum)
    t0 = node.env.now
    while not ev.triggered:
        p = stream_pick(node, 0)
        if p < 0:
            break
        if p != node._s_last[0] or node._s_quant[0] >= node.max_steps:
            node._s_quant[0] = 0
        node._s_last[0] = p
        yield from stream_turn(node, p)
    node._lent += node.env.now - t0
    node._cur, node._quantum = saved
