"""Stream isolation on a multi-model replica (R13, ``cluster.replica.streams: isolated``).

The models of protected classes (``degradation.protected``, a deployment's ``cls``) run on a
priority stream (0), the rest on stream 1. A replica is still one SimPy process
(:class:`sim.serving.replica.ComputeNode`); its turn selection becomes :meth:`Streams.pick` and :meth:`Streams.turn`:

* **no waiting for turns**: each stream with runnable work competes by *virtual time* (the GPU
  seconds it used divided by its share, ``stream_share`` for stream 0, the rest for stream 1);
  the smaller runs. While the other stream has work a turn is one iteration (a fast decode
  segment is capped at one step), so neither stream waits for more than one iteration of the
  other, and while both compute each gets its share of the GPU time: an iteration-grained
  approximation of two CUDA streams sharing the SMs. A stream without work banks no credit
  (its virtual time is lifted to the other's).
* **no waiting for another model's weights**: while a stream-1 iteration waits for weight
  chunks (copies run on the copy engines, not the SMs), the priority stream runs its runnable
  iterations (:meth:`Streams.lend`); the waiting iteration does not count that time as
  its own (busy time, token budget, virtual time): ``ComputeNode.lent`` accumulates it.

Within a stream, models take turns as on a shared replica (``max_steps_per_turn`` each).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

if TYPE_CHECKING:
    from sim.serving.replica import ComputeNode


class Streams:
    """The two streams of one replica: per model its stream (``stream_of``), per stream its
    virtual time (GPU seconds used / its ``share``), last model and quantum used."""

    def __init__(self, node: ComputeNode, stream_of: list[int], share: float) -> None:
        self.node = node
        self.stream_of = stream_of
        self.share: tuple[float, float] = (share, 1.0 - share)
        self.vtime: list[float] = [0.0, 0.0]
        self.last: list[int] = [-1, -1]
        self.quantum: list[int] = [0, 0]

    def next_model(self, s: int) -> int:
        """Stream ``s``'s next model (no side effects): the replica's pick rule over its
        models."""
        node = self.node
        cur = self.last[s]
        if cur >= 0 and self.quantum[s] < node.max_steps and node.runnable(cur):
            return cur
        nm = len(node.sched.num_decoding)
        for i in range(1, nm + 1):
            m = (cur + i) % nm
            if self.stream_of[m] == s and node.runnable(m):
                return m
        return -1

    def pick(self) -> int:
        """The model to run next. Each stream with runnable work competes by virtual time
        (GPU seconds it used / its share); the smaller runs, ties to the priority stream 0.
        A stream without runnable work banks no credit: its virtual time is lifted to the
        other's. So neither stream waits for more than one iteration of the other, and while
        both have work each gets its share of the GPU time (an iteration-grained
        approximation of two streams sharing the GPU)."""
        ready = (self.next_model(0), self.next_model(1))
        vt = self.vtime
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
        if m != self.last[s] or self.quantum[s] >= self.node.max_steps:
            self.quantum[s] = 0
        self.last[s] = self.node.cur = m
        return m

    def turn(self, m: int) -> Generator[simpy.Event, Any, None]:
        """One turn of ``m`` on its stream: at most one decode step while the other stream
        has work (a fast segment is capped by the quantum left), its GPU time charged to the
        stream's virtual time."""
        node = self.node
        s = self.stream_of[m]
        q0 = self.quantum[s]
        node.quantum = qb = max(q0, node.max_steps - 1) if self.next_model(1 - s) >= 0 else q0
        t0, lent = node.env.now, node.lent
        yield from node.turn(m)
        self.quantum[s] = q0 + node.quantum - qb
        self.vtime[s] += (node.env.now - t0 - (node.lent - lent)) / self.share[s]

    def lend(self, ev: simpy.Event) -> Generator[simpy.Event, Any, None]:
        """While a non-priority iteration waits for weights ``ev`` (copies run on the copy
        engines, not the SMs), the priority stream runs its runnable iterations until ``ev``
        fires; their time goes to the node's ``lent``, which the waiting iteration does not
        count as its own (busy time, token budget, virtual time)."""
        node = self.node
        saved = (node.cur, node.quantum)
        t0 = node.env.now
        while not ev.triggered:
            p = self.next_model(0)
            if p < 0:
                break
            if p != self.last[0] or self.quantum[0] >= node.max_steps:
                self.quantum[0] = 0
            self.last[0] = p
            yield from self.turn(p)
        node.lent += node.env.now - t0
        node.cur, node.quantum = saved
