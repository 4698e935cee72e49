"""Continuous batching for the engine: admission, KV growth and preemption.

The rules are the simulator node's (:mod:`sim.serving.replica`), taken from the object both use,
:class:`engine.kv.admission.KvAdmission` (``docs/design/admission.md``), so the engine and the
simulator form the same batches, take the same blocks and preempt the same sequences for the
same arrivals. Per iteration the engine calls, in the order of a simulator turn:

1. :meth:`BatchScheduler.grow`: the running (decoding) sequences take the blocks this step
   writes into; while they do not fit, the most recently admitted one is preempted
   (recompute: its blocks are freed and it goes back to the head of the queue, to prefill its
   prompt and the tokens it generated again).
2. :meth:`BatchScheduler.admit`: requests from the head of the queue in order (head-of-line:
   one that does not fit stops admission), at most ``max_batch`` running; the prompts share
   the iteration's token budget, ``max_batch_tokens`` less one token per running sequence
   (unchunked prefill: the iteration's first prompt runs whatever its size); a prompt's
   blocks (never its output's) must fit leaving ``watermark`` of the KV capacity free.
3. :meth:`BatchScheduler.advance` after the iteration (every running sequence wrote one more
   token), then :meth:`BatchScheduler.finish` for each completed request.

Invariant: ``0 <= reserved <= kv_capacity``; ``ctx[rid]`` = KV tokens running ``rid`` has
written; its blocks cover them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kv.admission import KvAdmission, LogEntry

if TYPE_CHECKING:
    from engine.kv.allocator import KVBlockAllocator

__all__ = ["DEFAULT_WATERMARK", "BatchScheduler"]

#: the share of KV capacity admission leaves free (the scenario's ``kv.admission_watermark``
#: default)
DEFAULT_WATERMARK = 0.01


@dataclass
class BatchScheduler:
    """Admission, growth and preemption state of one engine; see the module docstring.

    ``log``: the admission object's event log (``None``: off). ``kv``: the admission object
    (block tables in the model's allocator once :meth:`bind` gave it one).
    """

    max_batch: int
    max_batch_tokens: int
    kv_capacity: int
    kv_bytes_per_token: int
    block_tokens: int
    watermark: float = DEFAULT_WATERMARK
    log: list[LogEntry] | None = None
    queue: deque[int] = field(default_factory=deque)
    #: running sequences in admission order (the preemption victim is the last)
    running: list[int] = field(default_factory=list)
    #: per running sequence: KV tokens written so far
    ctx: dict[int, int] = field(default_factory=dict)
    #: iterations run (the admission object's step)
    step: int = 0
    preempted: int = 0

    def __post_init__(self) -> None:
        self.kv = KvAdmission(
            self.kv_capacity, self.block_tokens, None, self.watermark, log=self.log
        )

    @property
    def reserved(self) -> int:
        """KV bytes held by running sequences (whole blocks)."""
        return self.kv.reserved

    def bind(self, allocator: KVBlockAllocator) -> None:
        """Take blocks in ``allocator`` (the model's, whose block ids index its KV storage);
        the KV capacity is capped at the allocator's pool. Call before the first request."""
        if allocator.block_tokens != self.block_tokens:
            raise ValueError(
                f"allocator blocks of {allocator.block_tokens} tokens, scheduler "
                f"{self.block_tokens}: they must be equal"
            )
        if allocator.bytes_per_token != self.kv_bytes_per_token:
            raise ValueError(
                f"allocator {allocator.bytes_per_token} KV bytes/token, scheduler "
                f"{self.kv_bytes_per_token}: they must be equal"
            )
        pool = allocator.cap_blocks * allocator.block_bytes
        if pool < self.kv.capacity:
            self.kv.capacity = pool
        self.kv.allocators = [allocator]

    def kv_need(self, tokens: int) -> int:
        """Bytes reserved for a ``tokens``-token sequence (whole blocks)."""
        return self.kv.size(tokens, self.kv_bytes_per_token)[0]

    def fits_alone(self, tokens: int) -> bool:
        """Whether a sequence of ``tokens`` (prompt + output) could ever run (else reject it)."""
        return self.kv.fits_alone(tokens, self.kv_bytes_per_token)

    def submit(self, rid: int) -> None:
        self.queue.append(rid)

    def grow(self) -> list[int]:
        """Take this step's blocks for the running sequences (one each whose next token
        starts a block, in admission order), preempting the most recently admitted while they
        do not fit; returns the preempted ids (now at the head of the queue), in order."""
        kv, bpt, bt = self.kv, self.kv_bytes_per_token, self.block_tokens
        kv.step = self.step
        out: list[int] = []
        if not bpt:
            return out
        ctx = self.ctx
        while self.running:
            items = [(r, ctx[r] + 1, self.step) for r in self.running if ctx[r] % bt == 0]
            if kv.can_grow(len(items), bpt):
                if items:
                    kv.grow(0, items, bpt)
                break
            rid = kv.victim(self.running)
            self.running.pop()
            del ctx[rid]
            kv.preempt(rid, bpt)
            self.queue.appendleft(rid)
            self.preempted += 1
            out.append(rid)
        return out

    def admit(self, tokens: Sequence[int], budget_free: bool = False) -> list[int]:
        """Admit from the queue; ``tokens[rid]`` = the KV tokens ``rid`` (re)starts with (its
        prompt plus the tokens it generated before a preemption). ``budget_free``: no token
        budget (a dense model's one pass per request). Returns the admitted ids, in order."""
        kv, bpt = self.kv, self.kv_bytes_per_token
        kv.step = self.step
        new: list[int] = []
        budget = self.max_batch_tokens - len(self.running)
        q = self.queue
        while q and len(self.running) < self.max_batch:
            rid = q[0]
            t = tokens[rid]
            if not budget_free and not kv.budget_allows(t, budget, not new, False):
                break
            if bpt and not kv.fits(self.kv_need(t), bool(self.running)):
                break
            q.popleft()
            if bpt:
                kv.take(rid, 0, t, bpt)
            self.ctx[rid] = t
            self.running.append(rid)
            budget -= t
            new.append(rid)
        return new

    def advance(self, decoded: Sequence[int]) -> None:
        """An iteration ran: each of ``decoded`` wrote one more KV token."""
        ctx = self.ctx
        for rid in decoded:
            ctx[rid] += 1
        self.step += 1

    def finish(self, rid: int) -> None:
        """``rid`` completed: release its blocks and batch slot."""
        self.kv.step = self.step
        self.kv.finish(rid, self.kv_bytes_per_token)
        del self.ctx[rid]
        self.running.remove(rid)
