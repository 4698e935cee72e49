"""Each model's decoding requests on one replica, advanced in O(1) per step.

:class:`DecodeBatches` is the part of :class:`engine.sched.scheduler.Scheduler` that holds the
decoding requests of every model: a request that starts decoding at step ``a`` holding ``K``
KV tokens has the context base ``K + 1 - a`` (at step ``s`` it holds ``base + s - 1`` tokens),
and a model's batch keeps only the count (``num_decoding``), the steps run (``steps``), the
sum of the bases (``context_base``: the batch's context at step ``s`` is ``context_base +
num_decoding * s``), a min-heap of finishing steps (``finish_heap``; entries of an older
``life`` are skipped) and, per residue of the step mod ``block_tokens``, the requests whose
next KV block is due at those steps (``block_due``), so a step's blocks are one bucket,
taken in one bulk call to :class:`engine.kv.admission.KvAdmission`.

Invariant: a decoding request has a ``base_of`` entry and a ``life``, and, if its model has
KV, sits in exactly one ``block_due`` bucket.
"""

from __future__ import annotations

import heapq

from engine.kv.admission import KvAdmission

__all__ = ["DecodeBatches"]


class DecodeBatches:
    """The decoding requests of ``len(kv_bytes_per_token)`` models whose KV is in ``kv``;
    see the module docstring."""

    def __init__(self, kv: KvAdmission, kv_bytes_per_token: list[int]) -> None:
        nm = len(kv_bytes_per_token)
        bt = kv.block_tokens
        self.kv = kv
        self.kv_bytes_per_token = kv_bytes_per_token
        self.num_decoding = [0] * nm
        self.steps = [0] * nm
        self.context_base = [0.0] * nm
        self.finish_heap: list[list[tuple[int, int, int]]] = [[] for _ in range(nm)]
        self.block_due: list[list[dict[int, None]]] = [[{} for _ in range(bt)] for _ in range(nm)]
        #: per model: (rid, life, step) owing the block of a step already granted to the rest
        #: (a swap-in at a step of its residue)
        self.owed_blocks: list[list[tuple[int, int, int]]] = [[] for _ in range(nm)]
        #: per decoding rid: its context base
        self.base_of: dict[int, int] = {}
        #: per running rid: its life (heap entries of an older life are skipped)
        self.life: dict[int, int] = {}

    def others_decoding(self, m: int) -> bool:
        """Whether a model other than ``m`` has decoding requests."""
        nd = self.num_decoding
        return len(nd) > 1 and any(b for i, b in enumerate(nd) if i != m)

    def steps_to_next_finish(self, m: int) -> int:
        """Decode steps until model ``m``'s next completion is due (some decode runs)."""
        return self.finish_heap[m][0][0] - self.steps[m]

    def fit_steps(self, m: int, k: int) -> int:
        """How many of the next ``k`` decode-only steps of model ``m`` (the first one's blocks
        already taken by :meth:`schedule`) the free KV blocks cover; reads only."""
        kv = self.kv
        bt = kv.block_tokens
        bpt = self.kv_bytes_per_token[m]
        if bpt == 0 or k <= 1:
            return k
        room = kv.free_blocks(bpt)
        if self.num_decoding[m] * (-(-(k - 1) // bt)) <= room:  # an upper bound fits: no walk
            return k
        due = self.block_due[m]
        off = self.steps[m]
        for s in range(off + 1, off + k):
            room -= len(due[s % bt])
            if room < 0:
                return s - off
        return k

    def _grow_step(self, m: int, off: int) -> bool:
        """Take the blocks the decoding requests need for step ``off`` (those owing one for
        an earlier step first), all or none; False when they do not fit."""
        bucket = self.block_due[m][off % self.kv.block_tokens]
        owed = self.owed_blocks[m]
        if not bucket and not owed:
            return True
        kv = self.kv
        bpt = self.kv_bytes_per_token[m]
        if owed:
            life = self.life
            owed[:] = [e for e in owed if life.get(e[0]) == e[1]]
        if not kv.can_grow(len(bucket) + len(owed), bpt):
            return False
        if owed:
            base_of = self.base_of
            kv.grow(m, [(rid, base_of[rid] + s, s) for rid, _, s in owed], bpt)
            owed.clear()
        if bucket:
            kv.grow_at(m, bucket, self.base_of, off, bpt)
        return True

    def _grow_steps(self, m: int, lo: int, hi: int) -> None:
        """Take the blocks of steps ``lo .. hi - 1`` (checked by :meth:`fit_steps`)."""
        bpt = self.kv_bytes_per_token[m]
        if hi <= lo or not bpt:
            return
        kv = self.kv
        due, bt, base_of = self.block_due[m], kv.block_tokens, self.base_of
        if hi - lo == 1:  # one step (most segments): one bucket
            bucket = due[lo % bt]
            if bucket:
                kv.grow_at(m, bucket, base_of, lo, bpt)
            return
        # residue s's crossings in [lo, hi): steps s, s + bt, ...
        items = [
            (rid, base_of[rid] + t, t)
            for s in range(lo, min(hi, lo + bt))
            if (bucket := due[s % bt])
            for t in range(s, hi, bt)
            for rid in bucket
        ]
        if items:
            kv.grow(m, items, bpt)

    def _start_decoding(
        self, m: int, rid: int, off: int, kv_tokens: int, steps_left: int, granted: bool = False
    ) -> None:
        """Running ``rid`` (holding ``kv_tokens`` of KV) decodes from step ``off`` on and
        finishes after ``steps_left`` steps. ``granted``: step ``off``'s blocks were already
        taken for the others (it owes its own until the next step is scheduled)."""
        base = kv_tokens + 1 - off
        self.base_of[rid] = base
        self.context_base[m] += base
        self.num_decoding[m] += 1
        life = self.life[rid]
        heapq.heappush(self.finish_heap[m], (off + steps_left, rid, life))
        if self.kv_bytes_per_token[m]:
            # its blocks are exact (num_blocks(kv_tokens)), so its first new block is due at
            # the first step >= off of its residue
            bt = self.kv.block_tokens
            q = (1 - base) % bt
            self.block_due[m][q][rid] = None
            if granted and off % bt == q:
                self.owed_blocks[m].append((rid, life, off))

    def _finish_decodes(self, m: int, off: int) -> None:
        """Finish every decoding request of model ``m`` whose last step is ``off`` or earlier
        (heap entries of an older life, i.e. preempted since, are skipped)."""
        heap = self.finish_heap[m]
        if not heap or heap[0][0] > off:
            return
        life = self.life
        due, bt = self.block_due[m], self.kv.block_tokens
        while heap and heap[0][0] <= off:
            _, rid, seq = heapq.heappop(heap)
            if life.get(rid) != seq:
                continue  # preempted since: an entry of an older life
            self.num_decoding[m] -= 1
            base = self.base_of.pop(rid)
            self.context_base[m] -= base
            due[(1 - base) % bt].pop(rid, None)
            self._finish(m, rid)
        if self.num_decoding[m] == 0:
            self.context_base[m] = 0.0

    def _stop_decoding(self, m: int, rid: int) -> int:
        """Take decoding ``rid`` out of model ``m``'s batch (a preemption); returns its
        context base."""
        base = self.base_of.pop(rid)
        self.num_decoding[m] -= 1
        self.context_base[m] -= base
        self.block_due[m][(1 - base) % self.kv.block_tokens].pop(rid, None)
        if self.num_decoding[m] == 0:
            self.context_base[m] = 0.0
        return base

    def _finish(self, m: int, rid: int) -> None:
        """``rid``'s last step ran (it is out of the decoding batch): the subclass ends it."""
        raise NotImplementedError
