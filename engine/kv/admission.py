"""Admission and KV reservation, one object for the simulator's replica and the engine.

:class:`KvAdmission` holds the KV blocks of one replica (simulator: :class:`sim.serving.replica.ComputeNode`;
engine: :class:`engine.sched.scheduler.Scheduler`, which both run), in bytes, shared by its models.
The rules (vLLM-like; ``docs/design/admission.md``):

* **Admission looks at the prompt only.** A sequence (re)starts with the blocks of the tokens
  it must hold: its prompt, plus the tokens generated before a recompute preemption (the
  unknown output length is never reserved). It is admitted when those blocks fit and leave
  ``watermark`` of the capacity free (:meth:`fits`; a replica with nothing running admits
  anything that fits at all), within the iteration's token budget (:meth:`budget_allows`).
* **Blocks as a sequence grows.** A decoding sequence takes one more block when its context
  crosses a block boundary (:meth:`grow`, one bulk call for many sequences).
* **Preemption.** When a step's blocks do not fit (:meth:`can_grow` is False) the most recently
  admitted running sequence (:meth:`victim`) is preempted (:meth:`preempt`: its blocks are
  freed and it is counted); the caller re-queues it at the front (recompute) or keeps its KV on
  the host (swap).

With ``allocators`` (one :class:`engine.kv.allocator.KVBlockAllocator` per model, or ``None``
for a model without KV) every block taken here is taken in that allocator too, so the block
tables are the engine's; the engine hands its model's own allocator, the simulator ids only.

Invariant: ``0 <= reserved <= capacity``; ``reserved`` = sum over live sequences of
``blocks * block_tokens * bytes_per_token``; ``needed`` = their token bytes as of their last
block (a decoding sequence's count is brought up to date when it takes a block).

``log`` (a list, off when ``None``): one ``(step, event, seq, value)`` per admission
(``"admit"``, tokens), block taken (``"block"``, context tokens after it), preemption
(``"preempt"``, 0) and completion (``"done"``, 0); ``step`` is the caller's iteration count
(:attr:`step`, or each growth item's own step). Both sides log here, so a differential test
compares the logs.

No clock is read and nothing is iterated in hash order (ARCHITECTURE contracts 1 and 3).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Reversible, Sequence
from typing import TYPE_CHECKING, Any, Literal

from engine.kv.prefix import num_blocks

if TYPE_CHECKING:
    from engine.kv.allocator import KVBlockAllocator

__all__ = ["IterationKind", "KvAdmission", "LogEntry", "iteration_kind"]

IterationKind = Literal["prefill", "decode", "mixed"]
LogEntry = tuple[int, str, int, int]


def iteration_kind(prefill_tokens: int, decodes: int) -> IterationKind:
    """What one iteration runs: ``"prefill"`` (prompt tokens only), ``"decode"`` (decode
    steps only, or nothing) or ``"mixed"`` (both in one pass over the weights)."""
    if prefill_tokens > 0:
        return "mixed" if decodes > 0 else "prefill"
    return "decode"


class KvAdmission:
    """KV blocks of one replica and the admission/growth/preemption rules; see the module
    docstring. The constructor does no I/O.

    ``prefix``: an object that takes over :meth:`take`/:meth:`give` with shared prompt
    blocks (the simulator's ``sim.serving.prefixcache.PrefixCache``), or ``None``.
    """

    __slots__ = (
        "allocators",
        "block_tokens",
        "capacity",
        "log",
        "needed",
        "preemptions",
        "prefix",
        "reserved",
        "seqs",
        "step",
        "watermark",
    )

    def __init__(
        self,
        capacity: int,
        block_tokens: int,
        allocators: Sequence[KVBlockAllocator | None] | None = None,
        watermark: float = 0.0,
        log: list[LogEntry] | None = None,
    ) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.capacity = capacity
        self.block_tokens = block_tokens
        self.allocators: Any = allocators
        self.watermark = watermark
        self.reserved = 0
        self.needed = 0
        #: per live sequence: [model, tokens, blocks]
        self.seqs: dict[int, list[int]] = {}
        self.prefix: Any = None
        self.preemptions = 0
        self.log = log
        #: the caller's iteration count, stamped on admissions, preemptions and completions
        self.step = 0

    # -- sizes and admission tests ------------------------------------------------------------
    def size(self, tokens: int, bytes_per_token: int) -> tuple[int, int]:
        """(bytes in whole blocks, exact bytes) of a ``tokens``-token sequence."""
        bt = self.block_tokens
        return num_blocks(tokens, bt) * bt * bytes_per_token, tokens * bytes_per_token

    def can(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit (no watermark)."""
        return self.reserved + nbytes <= self.capacity

    def fits_alone(self, tokens: int, bytes_per_token: int) -> bool:
        """Whether a ``tokens``-token sequence fits an empty replica (else it can never run)."""
        return self.size(tokens, bytes_per_token)[0] <= self.capacity

    def fits(self, need: int, running: bool) -> bool:
        """Whether a sequence needing ``need`` more bytes may start now: it fits and leaves the
        watermark free, unless nothing runs (then fitting at all is enough)."""
        spare = self.capacity * self.watermark if running else 0.0
        return self.reserved + need + spare <= self.capacity

    def fits_tokens(self, tokens: int, bytes_per_token: int, running: bool) -> bool:
        """``fits(size(tokens, bytes_per_token)[0], running)``: whether a sequence whose
        blocks hold ``tokens`` may start now."""
        bt = self.block_tokens
        return self.fits(num_blocks(tokens, bt) * bt * bytes_per_token, running)

    @staticmethod
    def budget_allows(tokens: int, budget: int, first: bool, chunked: bool) -> bool:
        """Whether a prompt of ``tokens`` may join an iteration with ``budget`` tokens left:
        some budget must be left; unchunked, the whole prompt must fit unless it is the
        iteration's first prompt (which runs whatever its size)."""
        return budget > 0 and (chunked or first or tokens <= budget)

    @staticmethod
    def victim(running: Reversible[int]) -> int:
        """The sequence to preempt: the most recently admitted of ``running`` (admission
        order, a re-admitted sequence counts from its re-admission)."""
        return next(reversed(running))

    # -- reservations -------------------------------------------------------------------------
    def take(
        self, rid: int, m: int, tokens: int, bytes_per_token: int, prefill: bool = True
    ) -> int:
        """Give new sequence ``rid`` (model ``m``) the blocks of ``tokens`` tokens; returns the
        prompt tokens a cached prefix saves from prefill (0 without prefix caching)."""
        if self.log is not None:
            self.log.append((self.step, "admit", rid, tokens))
        if self.prefix is not None:  # shared prompt blocks (sim.serving.prefixcache)
            return int(self.prefix.take(rid, m, tokens, bytes_per_token, prefill))
        blocks = num_blocks(tokens, self.block_tokens)
        allocs = self.allocators
        if allocs is not None and (a := allocs[m]) is not None:
            a.allocate(rid, tokens)
        self.seqs[rid] = [m, tokens, blocks]
        self.reserved += blocks * self.block_tokens * bytes_per_token
        self.needed += tokens * bytes_per_token
        return 0

    def give(self, rid: int, bytes_per_token: int) -> int:
        """Release ``rid``'s blocks; returns its KV bytes (as of its last block)."""
        if self.prefix is not None:
            return int(self.prefix.give(rid, bytes_per_token))
        m, tokens, blocks = self.seqs.pop(rid)
        allocs = self.allocators
        if allocs is not None and (a := allocs[m]) is not None:
            a.free(rid)
        self.reserved -= blocks * self.block_tokens * bytes_per_token
        self.needed -= tokens * bytes_per_token
        return tokens * bytes_per_token

    def finish(self, rid: int, bytes_per_token: int) -> None:
        """``rid`` completed: log it and release its blocks (if it holds any)."""
        if self.log is not None:
            self.log.append((self.step, "done", rid, 0))
        if bytes_per_token and rid in self.seqs:
            self.give(rid, bytes_per_token)

    def preempt(self, rid: int, bytes_per_token: int) -> None:
        """Preempt running ``rid``: count and log it, release its blocks (if it holds any);
        the caller re-queues it (recompute) or moves its KV to the host (swap)."""
        self.preemptions += 1
        if self.log is not None:
            self.log.append((self.step, "preempt", rid, 0))
        if bytes_per_token and rid in self.seqs:
            self.give(rid, bytes_per_token)

    # -- growth -------------------------------------------------------------------------------
    def can_grow(self, blocks: int, bytes_per_token: int) -> bool:
        """Whether ``blocks`` more blocks fit (growth ignores the watermark)."""
        return self.reserved + blocks * self.block_tokens * bytes_per_token <= self.capacity

    def free_blocks(self, bytes_per_token: int) -> int:
        """Whole blocks of ``bytes_per_token`` that still fit."""
        return (self.capacity - self.reserved) // (self.block_tokens * bytes_per_token)

    def grow(self, m: int, items: Sequence[tuple[int, int, int]], bytes_per_token: int) -> None:
        """Each ``(rid, tokens, step)`` of ``items`` takes the one block its context crosses
        into at ``step`` (context ``tokens`` after it), in order; the allocator in one bulk
        call. The caller checked :meth:`can_grow`."""
        seqs = self.seqs
        grown: list[tuple[int, int]] = []
        needed = 0
        for rid, tokens, _ in items:
            st = seqs[rid]
            d = tokens - st[1]
            grown.append((rid, d))
            needed += d
            st[1] = tokens
            st[2] += 1
        self.reserved += len(items) * self.block_tokens * bytes_per_token
        self.needed += needed * bytes_per_token
        allocs = self.allocators
        if allocs is not None and (a := allocs[m]) is not None:
            a.append_many(grown)
        if self.log is not None:
            self.log.extend((s, "block", rid, tokens) for rid, tokens, s in items)

    def grow_at(
        self,
        m: int,
        rids: Collection[int],
        base: Mapping[int, int],
        step: int,
        bytes_per_token: int,
    ) -> None:
        """``grow(m, [(rid, base[rid] + step, step) for rid in rids], bytes_per_token)``: each
        of ``rids`` crosses into one more block at ``step``, its context ``base[rid] + step``
        after it (the simulator's decode step), without building the items. The caller
        checked :meth:`can_grow`."""
        seqs = self.seqs
        needed = 0
        for rid in rids:
            st = seqs[rid]
            tokens = base[rid] + step
            needed += tokens - st[1]
            st[1] = tokens
            st[2] += 1
        self.reserved += len(rids) * self.block_tokens * bytes_per_token
        self.needed += needed * bytes_per_token
        allocs = self.allocators
        if allocs is not None and (a := allocs[m]) is not None:
            a.extend_to(rids, base, step)
        if self.log is not None:
            self.log.extend((step, "block", rid, base[rid] + step) for rid in rids)

    def fragmentation(self) -> float:
        """Internal fragmentation of the reserved blocks (0 when nothing is reserved)."""
        return 1.0 - self.needed / self.reserved if self.reserved else 0.0
