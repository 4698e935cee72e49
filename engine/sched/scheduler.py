"""One replica's scheduler: the batch it runs next, for the engine and the simulator alike.

:class:`Scheduler` owns a replica's requests from arrival to completion, vLLM v1 style: the
``waiting`` queues (per model and class), the running requests (``prefilling`` ones with their
``num_computed_tokens``, and each model's decoding batch), the token budget with chunked
prefill, the KV blocks (through :class:`engine.kv.admission.KvAdmission`, the rules of
``docs/design/admission.md``), preemption by recompute or swap, and prefix-cache hits. A
caller runs ``schedule(m) -> Batch``, executes the batch, then ``complete(batch)``; a decode-only
stretch of several steps is :meth:`Scheduler.fit_steps` then :meth:`Scheduler.advance_decode`.
The engine's runtime (:mod:`engine.runtime.engine`) runs each batch on real arrays; the
simulator's replica (:mod:`sim.serving.turn`) prices it and advances simulated time.
``docs/design/replica-scheduler.md`` has the picture.

The decoding requests of each model advance in O(1) per step (:class:`Scheduler` extends
:class:`engine.sched.decode.DecodeBatches`, which holds them and their KV growth); the batch
and hook types are in :mod:`engine.sched.batch`.

Invariants: a request is in ``admitted[m]`` and ``life`` exactly while it runs (prefilling or
decoding), and in ``prefilling[m]`` or the decoding batch, not both; ``num_running`` counts the running requests of all models and
``num_waiting`` the queued ones. Records (metrics, traces, sampled tokens) are the caller's:
:class:`SchedulerHooks` is told of each admission, preemption, first token, completion and
hand-off when it happens. No clock is read and nothing is iterated in hash order.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from engine.kv.admission import KvAdmission
from engine.sched.batch import Batch, BatchRecord, Prefill, SchedulerHooks
from engine.sched.decode import DecodeBatches

if TYPE_CHECKING:
    from engine.kv.allocator import KVBlockAllocator

__all__ = ["DEFAULT_WATERMARK", "Batch", "BatchRecord", "Prefill", "Scheduler", "SchedulerHooks"]

#: the share of KV capacity admission leaves free (the scenario's ``kv.admission_watermark``
#: default)
DEFAULT_WATERMARK = 0.01


class Scheduler(DecodeBatches):
    """The scheduler of one replica serving ``num_models`` models; see the module docstring.

    ``kv``: the replica's KV account. ``kv_bytes_per_token``/``dense``: per model (a dense
    model -- no KV cache -- runs whole inputs, outside the token budget). ``class_order``: the
    classes' admission order. ``swap_capacity``: host swap space in bytes for ``swap``
    preemption (0: recompute). Request lengths (``prompt_lens``, ``output_lens``) and classes
    are indexed by request id (:meth:`set_requests`). The constructor does no I/O.
    """

    def __init__(
        self,
        kv: KvAdmission,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
        kv_bytes_per_token: list[int],
        dense: list[bool],
        class_order: list[int] | None = None,
        num_classes: int = 1,
        swap_capacity: int = 0,
        hooks: SchedulerHooks | None = None,
    ) -> None:
        super().__init__(kv, kv_bytes_per_token)
        nm = len(kv_bytes_per_token)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.dense = dense
        self.class_order: list[int] = (
            list(range(num_classes)) if class_order is None else class_order
        )
        self.swap_capacity = swap_capacity
        self.swap_used = 0
        #: KV bytes copied over PCIe by swap-outs and swap-ins
        self.swap_moved = 0
        self.hooks: SchedulerHooks | None = hooks
        self.prompt_lens: list[int] = []
        self.output_lens: list[int] = []
        self.classes: list[int] = []
        #: per model, per class: queued request ids
        self.waiting: list[list[deque[int]]] = [
            [deque() for _ in range(num_classes)] for _ in range(nm)
        ]
        self.num_waiting = 0
        self.num_running = 0
        #: per model: prefilling requests in admission order
        self.prefilling: list[list[Prefill]] = [[] for _ in range(nm)]
        #: per model: running requests in admission order (the preemption victim is the last)
        self.admitted: list[dict[int, None]] = [{} for _ in range(nm)]
        self._lives = 0
        #: tokens generated before a recompute preemption
        self.generated: dict[int, int] = {}
        #: per rid holding KV outside the pool: (KV tokens, tokens generated); swapped out, or
        #: handed in by a prefill replica (``handed_in``)
        self.swapped: dict[int, tuple[int, int]] = {}
        self.handed_in: set[int] = set()
        #: per queued rid: leading prompt tokens whose KV was read from a store (not prefilled)
        self.external_computed_tokens: dict[int, int] = {}
        #: when a list: every batch's :meth:`Batch.record`, a decode-only stretch of
        #: :meth:`advance_decode` as one decode-only batch per step (None: off)
        self.batch_log: list[BatchRecord] | None = None

    @classmethod
    def single(
        cls,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_capacity: int,
        kv_bytes_per_token: int,
        block_tokens: int,
        *,
        watermark: float = DEFAULT_WATERMARK,
        dense: bool = False,
        log: list[tuple[int, str, int, int]] | None = None,
    ) -> Scheduler:
        """A one-model, one-class scheduler without chunked prefill or swap (the engine's):
        ``kv_capacity`` bytes of blocks of ``block_tokens``; ``log``: the KV event log."""
        kv = KvAdmission(kv_capacity, block_tokens, None, watermark, log=log)
        return cls(
            kv,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            chunked_prefill=False,
            kv_bytes_per_token=[kv_bytes_per_token],
            dense=[dense],
        )

    def set_requests(
        self, prompt_lens: list[int], output_lens: list[int], classes: list[int]
    ) -> None:
        """The requests' prompt and output lengths and classes, indexed by request id."""
        self.prompt_lens, self.output_lens, self.classes = prompt_lens, output_lens, classes

    def bind(self, allocator: KVBlockAllocator) -> None:
        """Take model 0's blocks in ``allocator`` (whose block ids index the engine's KV
        storage); the KV capacity is capped at its pool. Call before the first request."""
        bpt = self.kv_bytes_per_token[0]
        if allocator.block_tokens != self.kv.block_tokens:
            raise ValueError(
                f"allocator blocks of {allocator.block_tokens} tokens, scheduler "
                f"{self.kv.block_tokens}: they must be equal"
            )
        if allocator.bytes_per_token != bpt:
            raise ValueError(
                f"allocator {allocator.bytes_per_token} KV bytes/token, scheduler "
                f"{bpt}: they must be equal"
            )
        pool = allocator.cap_blocks * allocator.block_bytes
        if pool < self.kv.capacity:
            self.kv.capacity = pool
        self.kv.allocators = [allocator]

    # -- queries ----------------------------------------------------------------------------
    def fits_alone(self, tokens: int, m: int = 0) -> bool:
        """Whether a ``tokens``-token sequence of model ``m`` fits an empty replica."""
        return self.kv.fits_alone(tokens, self.kv_bytes_per_token[m])

    def head(self, m: int) -> int:
        """Model ``m``'s next request to admit (class order), or -1."""
        for c in self.class_order:
            q = self.waiting[m][c]
            if q:
                return q[0]
        return -1

    def can_run(self, m: int) -> bool:
        """Whether model ``m`` has work that can run now: running requests, or a queued head
        whose blocks fit."""
        if self.num_decoding[m] or self.prefilling[m]:
            return True
        h = self.head(m)
        return h >= 0 and self.fits(h, m)

    def decoding(self, m: int) -> list[int]:
        """Model ``m``'s decoding requests, in admission order."""
        base_of = self.base_of
        return [r for r in self.admitted[m] if r in base_of]

    def num_computed_tokens(self, m: int, rid: int) -> int:
        """KV tokens running ``rid`` (model ``m``) has written."""
        base = self.base_of.get(rid)
        if base is not None:
            return base + self.steps[m] - 1
        for p in self.prefilling[m]:
            if p.request_id == rid:
                return p.num_computed_tokens
        raise KeyError(rid)

    def start_tokens(self, rid: int) -> int:
        """KV tokens ``rid`` needs to (re)start: its prompt plus tokens generated earlier (a
        swapped-out or handed-in request: the KV it holds)."""
        sw = self.swapped.get(rid)
        if sw is not None:
            return sw[0]
        return self.prompt_lens[rid] + self.generated.get(rid, 0)

    def fits(self, rid: int, m: int, tokens: int = -1) -> bool:
        """Whether ``rid``'s blocks fit now, leaving the admission watermark free (nothing
        running: fitting at all is enough); ``tokens``: its :meth:`start_tokens` (-1: computed
        here)."""
        bpt = self.kv_bytes_per_token[m]
        if bpt == 0:
            return True
        if tokens < 0:
            tokens = self.start_tokens(rid)
        kv = self.kv
        if kv.prefix is None:
            return kv.fits_tokens(tokens, bpt, self.num_running > 0)
        # [prefix caching] blocks running requests already hold cost nothing
        return kv.fits(kv.prefix.need(rid, m, tokens, bpt), self.num_running > 0)

    # -- arrivals ---------------------------------------------------------------------------
    def add_request(self, rid: int, m: int = 0) -> None:
        """Queue ``rid`` (model ``m``) at the back of its class."""
        self.waiting[m][self.classes[rid]].append(rid)
        self.num_waiting += 1

    def add_handed_in(self, rid: int, m: int, kv_tokens: int, generated: int) -> None:
        """Queue ``rid`` whose ``kv_tokens`` of KV arrived from a prefill replica
        (``generated`` tokens sampled there): admitted like a swapped-in request, without
        a PCIe copy, it decodes from the step it is admitted at."""
        self.swapped[rid] = (kv_tokens, generated)
        self.handed_in.add(rid)
        self.add_request(rid, m)

    # -- one iteration ----------------------------------------------------------------------
    def schedule(self, m: int) -> Batch:
        """Model ``m``'s next batch: the decoding requests' blocks for the step (preempting the
        most recently admitted while they do not fit), admissions within ``max_num_seqs``, the
        token budget and the KV watermark (swapped-in requests decode at once), and the
        prefill chunks that fit what is left of the budget."""
        off = self.steps[m]
        batch = Batch(m, off)
        while self.num_decoding[m] and not self._grow_step(m, off):
            self._preempt(m, off, batch)
        pf = self.prefilling[m]
        left = self.max_num_batched_tokens - self.num_decoding[m]
        if pf:
            left -= sum(p.num_tokens_left for p in pf)
        swapped = self._admit(m, left, batch)
        if swapped:
            self._swap_in(m, off, swapped, batch)
        n = self.num_decoding[m]
        batch.num_decodes = n
        if pf:
            self._chunks(m, pf, self.max_num_batched_tokens - n, batch)
        if self.batch_log is not None:
            self.batch_log.append(batch.record())
        return batch

    def complete(self, batch: Batch) -> None:
        """``batch`` ran: its prefill chunks are computed, prompts whose last chunk ran sample
        a token (then finish, leave or decode), decoding requests whose last step ran finish."""
        m = batch.model
        off = batch.step + 1
        self.steps[m] = off
        chunks = batch.chunks
        for p, c in chunks:
            p.num_tokens_left -= c
            p.num_computed_tokens += c
        prefix = self.kv.prefix
        if prefix is not None and chunks:  # [prefix caching] computed blocks
            prefix.computed(m, chunks)
        if batch.ends:
            self._end_prompts(m, off, batch.ends)
        self._finish_decodes(m, off)

    def advance_decode(self, m: int, steps: int) -> None:
        """``steps`` decode-only steps of model ``m`` ran (the first scheduled, the rest
        checked by :meth:`fit_steps`): take the later steps' blocks and finish the requests
        whose last step ran."""
        off = self.steps[m]
        self._grow_steps(m, off + 1, off + steps)
        log = self.batch_log
        if log is not None:
            n = self.num_decoding[m]
            log.extend((s, (), (), (), n) for s in range(off + 1, off + steps))
        off += steps
        self.steps[m] = off
        self._finish_decodes(m, off)

    # -- admission ----------------------------------------------------------------------------
    def _admit(self, m: int, budget: int, batch: Batch) -> list[int]:
        """Admit queued requests of model ``m`` (class order, head of line first) while
        slots, token ``budget`` and KV blocks allow; new prompts join ``prefilling[m]``.
        Returns the swapped-in (or handed-in) requests admitted."""
        swapped: list[int] = []
        if not self.num_waiting:
            return swapped
        bpt = self.kv_bytes_per_token[m]
        dense = self.dense[m]
        chunked = self.chunked_prefill
        pf, order, hooks = self.prefilling[m], self.admitted[m], self.hooks
        room = self.max_num_seqs - self.num_decoding[m] - len(pf)
        first_prompt = not pf  # unchunked: the iteration's first prompt runs whatever its size
        allows = KvAdmission.budget_allows
        kv = self.kv
        kv.step = self.steps[m]
        external = self.external_computed_tokens
        for c in self.class_order:
            q = self.waiting[m][c]
            while q and room > 0:
                rid = q[0]
                sw = self.swapped.get(rid)
                tokens = self.start_tokens(rid)
                if sw is None and not dense and not allows(tokens, budget, first_prompt, chunked):
                    return swapped
                if not self.fits(rid, m, tokens):
                    return swapped  # head-of-line: never let a lower class overtake
                q.popleft()
                self.num_waiting -= 1
                self.num_running += 1
                room -= 1
                order[rid] = None
                self._lives += 1
                self.life[rid] = self._lives
                skip = kv.take(rid, m, tokens, bpt, sw is None) if bpt else 0
                batch.admitted.append(rid)
                if hooks is not None:
                    hooks.on_admit(m, rid)
                if sw is not None:
                    swapped.append(rid)
                    continue
                if external:  # a prefix read from a KV store
                    skip = max(skip, external.pop(rid, 0))
                pf.append(Prefill(rid, tokens - skip, skip))  # skip: a reused cached prefix
                budget -= tokens - skip
                first_prompt = False
        return swapped

    def _swap_in(self, m: int, off: int, swapped: list[int], batch: Batch) -> None:
        """Start decoding the admitted ``swapped`` requests at step ``off``: a handed-in one
        at no cost, a swapped-out one after its KV comes back (its bytes in the batch)."""
        bpt = self.kv_bytes_per_token[m]
        for rid in swapped:
            kv_tok, gen = self.swapped.pop(rid)
            if rid in self.handed_in:  # KV moved in from a prefill replica
                self.handed_in.discard(rid)
                self._start_decoding(m, rid, off, kv_tok, self.output_lens[rid] - gen)
                continue
            self.swap_used -= kv_tok * bpt
            self.swap_moved += kv_tok * bpt
            batch.swap_bytes.append(kv_tok * bpt)
            self._start_decoding(m, rid, off, kv_tok, self.output_lens[rid] - gen, granted=True)

    def _chunks(self, m: int, pf: list[Prefill], left: int, batch: Batch) -> None:
        """The prefill part of the batch with ``left`` tokens of budget: a chunk of each
        prompt in admission order while budget is left (whole prompts when unchunked or
        dense; unchunked, a prompt that does not fit waits unless it is the first)."""
        whole = self.dense[m] or not self.chunked_prefill
        unchunked = not self.chunked_prefill
        ptok = 0
        sq = 0.0
        ends = batch.ends
        chunks = batch.chunks
        for p in pf:
            if left <= 0:
                break
            todo = p.num_tokens_left
            c = todo if whole else min(todo, left)
            if unchunked and chunks and c > left:
                break
            ptok += c
            sq += c * c + 2.0 * c * p.num_computed_tokens
            left -= c
            chunks.append((p, c))
            if c == todo:
                ends.append(p)
        batch.prefill_tokens = ptok
        batch.prefill_sq = sq

    # -- preemption ---------------------------------------------------------------------------
    def _preempt(self, m: int, off: int, batch: Batch) -> None:
        """Preempt the most recently admitted request of model ``m`` (at step ``off``) and
        queue it at the head of its class: recompute, or swap its KV to host swap space."""
        order = self.admitted[m]
        rid = KvAdmission.victim(order)
        del order[rid]
        bpt = self.kv_bytes_per_token[m]
        self.num_running -= 1
        del self.life[rid]
        pf = self.prefilling[m]
        for i, p in enumerate(pf):
            if p.request_id == rid:  # still prefilling: its chunks are lost
                del pf[i]
                break
        else:
            base = self._stop_decoding(m, rid)
            gen = base + off - self.prompt_lens[rid]  # tokens generated so far
            kv_tok = base + off - 1  # KV written so far (the allocator may lag behind)
            nbytes = kv_tok * bpt
            if self.swap_capacity and bpt and self.swap_used + nbytes <= self.swap_capacity:
                self.swap_used += nbytes
                self.swap_moved += nbytes
                self.swapped[rid] = (kv_tok, gen)
                batch.swap_bytes.append(nbytes)
            else:
                self.generated[rid] = gen
        self.kv.step = off
        self.kv.preempt(rid, bpt)
        batch.preempted.append(rid)
        if self.hooks is not None:
            self.hooks.on_preempt(m, rid)
        self.waiting[m][self.classes[rid]].appendleft(rid)
        self.num_waiting += 1

    # -- completion ---------------------------------------------------------------------------
    def _end_prompts(self, m: int, off: int, ends: list[Prefill]) -> None:
        """The prompts whose last chunk ran sample a token (their first, unless recomputed),
        then finish, leave (a prefill replica) or decode from step ``off``."""
        pf = self.prefilling[m]
        hooks = self.hooks
        out = self.output_lens
        hand_off = hooks is not None and hooks.hands_off()
        for p in ends:
            rid = p.request_id
            pf.remove(p)
            if hooks is not None:
                hooks.on_first_token(rid)
            # the prefill samples one token (a dense model: its first pass; it then runs one
            # pass per step for its remaining output tokens)
            gen = self.generated.pop(rid, 0) + 1
            if gen >= out[rid]:
                self._finish(m, rid)
                continue
            if hand_off:
                assert hooks is not None
                self.release(m, rid)
                hooks.on_handoff(m, rid, p.num_computed_tokens, gen)
                continue
            self._start_decoding(m, rid, off, p.num_computed_tokens, out[rid] - gen)

    def _finish(self, m: int, rid: int) -> None:
        """``rid`` is done: release its blocks and slot, and tell the hooks."""
        kv = self.kv
        kv.step = self.steps[m]
        kv.finish(rid, self.kv_bytes_per_token[m])
        del self.admitted[m][rid]
        del self.life[rid]
        self.num_running -= 1
        if self.hooks is not None:
            self.hooks.on_finish(m, rid)

    def release(self, m: int, rid: int) -> None:
        """Drop running ``rid`` (not decoding) without finishing it: free its blocks and slot
        (a prefill replica handing it off)."""
        bpt = self.kv_bytes_per_token[m]
        if bpt and rid in self.kv.seqs:
            self.kv.give(rid, bpt)
        del self.admitted[m][rid]
        del self.life[rid]
        self.num_running -= 1

    def abort_all(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Drop every request (a crash): release their KV and swap space. Returns the queued
        ids (model by model, class by class) and the running ``(model, id)`` pairs (admission
        order per model)."""
        queued: list[int] = []
        for per in self.waiting:
            for q in per:
                queued.extend(q)
                q.clear()
        self.num_waiting = 0
        running: list[tuple[int, int]] = []
        for m, order in enumerate(self.admitted):
            bpt = self.kv_bytes_per_token[m]
            for rid in order:
                if rid in self.kv.seqs:
                    self.kv.give(rid, bpt)
                running.append((m, rid))
            order.clear()
            self.finish_heap[m].clear()
            for d in self.block_due[m]:
                d.clear()
            self.owed_blocks[m].clear()
            self.prefilling[m].clear()
            self.num_decoding[m] = self.steps[m] = 0
            self.context_base[m] = 0.0
        for rid in queued:
            self._forget(rid)
        for _, rid in running:
            self._forget(rid)
        self.base_of.clear()
        self.life.clear()
        self.swap_used = 0
        self.num_running = 0
        return queued, running

    def _forget(self, rid: int) -> None:
        self.generated.pop(rid, None)
        self.swapped.pop(rid, None)
        self.handed_in.discard(rid)
        self.external_computed_tokens.pop(rid, None)
