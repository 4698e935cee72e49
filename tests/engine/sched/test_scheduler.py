"""The replica scheduler (:class:`engine.sched.scheduler.Scheduler`) against what it promises:
continuous-batching admission, KV growth and preemption checked against a plain reference
model of the rules (the shared :class:`engine.kv.admission.KvAdmission`), chunked prefill,
and the engine's construction checks."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.admission import KvAdmission
from engine.kv.allocator import KVBlockAllocator
from engine.sched.scheduler import Scheduler

BT, KVB = 16, 8


class Reference:
    """The rules written out plainly, in blocks: prompt-only admission under a token budget
    and a watermark, one block per sequence whose next token starts a block, and preemption
    of the most recently admitted while the step's blocks do not fit."""

    def __init__(self, cap_blocks: int, max_batch: int, max_tokens: int, wm: float) -> None:
        self.cap, self.max_batch, self.max_tokens, self.wm = cap_blocks, max_batch, max_tokens, wm
        self.queue: deque[int] = deque()
        self.running: list[int] = []
        self.ctx: dict[int, int] = {}
        self.blocks: dict[int, int] = {}

    def grow(self) -> list[int]:
        out: list[int] = []
        while self.running:
            need = sum(1 for r in self.running if self.ctx[r] % BT == 0)
            if sum(self.blocks.values()) + need <= self.cap:
                for r in self.running:
                    if self.ctx[r] % BT == 0:
                        self.blocks[r] += 1
                return out
            r = self.running.pop()
            del self.ctx[r], self.blocks[r]
            self.queue.appendleft(r)
            out.append(r)
        return out

    def admit(self, tokens: list[int]) -> list[int]:
        new: list[int] = []
        budget = self.max_tokens - len(self.running)
        cap_bytes = self.cap * BT * KVB
        while self.queue and len(self.running) < self.max_batch:
            r = self.queue[0]
            t = tokens[r]
            if budget <= 0 or (new and t > budget):
                break
            nb = -(-t // BT)
            spare = cap_bytes * self.wm if self.running else 0.0
            if (sum(self.blocks.values()) + nb) * BT * KVB + spare > cap_bytes:
                break
            self.queue.popleft()
            self.running.append(r)
            self.ctx[r], self.blocks[r] = t, nb
            budget -= t
            new.append(r)
        return new


class Finished:
    """Hooks that record completions (the rest is ignored)."""

    def __init__(self) -> None:
        self.done: list[int] = []
        self.first: list[int] = []

    def on_admit(self, m: int, rid: int) -> None:
        pass

    def on_preempt(self, m: int, rid: int) -> None:
        pass

    def on_first_token(self, rid: int) -> None:
        self.first.append(rid)

    def on_finish(self, m: int, rid: int) -> None:
        self.done.append(rid)

    def hands_off(self) -> bool:
        return False

    def on_handoff(self, m: int, rid: int, kv_tokens: int, generated: int) -> None:
        raise AssertionError("no hand-off here")


def single(max_batch: int, max_tokens: int, cap_blocks: int, wm: float = 0.0) -> Scheduler:
    return Scheduler.single(max_batch, max_tokens, cap_blocks * BT * KVB, KVB, BT, watermark=wm)


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 70), min_size=1, max_size=14),
    outs=st.lists(st.integers(1, 50), min_size=14, max_size=14),
    max_batch=st.integers(1, 6),
    max_tokens=st.integers(4, 200),
    cap_blocks=st.integers(8, 24),
    wm=st.sampled_from([0.0, 0.01, 0.2]),
)
def test_admission_growth_preemption_match_reference_and_lose_nothing(
    prompts: list[int],
    outs: list[int],
    max_batch: int,
    max_tokens: int,
    cap_blocks: int,
    wm: float,
) -> None:
    n = len(prompts)
    s = single(max_batch, max_tokens, cap_blocks, wm)
    s.set_requests(prompts, outs[:n], [0] * n)
    hooks = Finished()
    s.hooks = hooks
    alloc = KVBlockAllocator(BT, KVB, initial_blocks=cap_blocks, max_bytes=cap_blocks * BT * KVB)
    s.bind(alloc)
    ref = Reference(cap_blocks, max_batch, max_tokens, wm)
    ok = [r for r in range(n) if s.fits_alone(prompts[r] + outs[r])]
    for r in ok:
        s.add_request(r)
        ref.queue.append(r)
    tokens = list(prompts)
    gen = [0] * n
    finished: list[int] = []
    for _ in range(2000):
        if not s.num_waiting and not s.num_running:
            break
        pre = ref.grow()
        for r in pre:
            tokens[r] = prompts[r] + gen[r]
        decoding = list(ref.running)
        new = ref.admit(tokens)
        batch = s.schedule(0)
        assert batch.preempted == pre
        assert batch.admitted == new
        assert [p.request_id for p, _ in batch.chunks] == new  # unchunked: whole prompts
        assert all(c == tokens[p.request_id] for p, c in batch.chunks)
        assert batch.num_decodes == len(decoding) and s.decoding(0) == decoding
        assert [s.num_computed_tokens(0, r) for r in decoding] == [ref.ctx[r] for r in decoding]
        assert 0 <= s.kv.reserved <= s.kv.capacity
        assert s.kv.reserved == sum(ref.blocks.values()) * BT * KVB
        assert alloc.num_used_blocks == sum(ref.blocks.values())
        hooks.done.clear()
        s.complete(batch)
        for r in decoding + new:
            gen[r] += 1
        for r in decoding:
            ref.ctx[r] += 1
        due = [r for r in new + decoding if gen[r] >= outs[r]]
        assert sorted(hooks.done) == sorted(due)
        finished += hooks.done
        for r in due:
            ref.running.remove(r)
            del ref.ctx[r], ref.blocks[r]
    assert sorted(finished) == ok, "every request that fits alone completes"
    assert s.kv.reserved == 0 and alloc.num_used_blocks == 0 and s.num_running == 0


def test_prompt_only_admission_and_preemption_of_the_newest() -> None:
    """Two 15-token prompts fill 2 of 3 blocks (outputs are not reserved); the 16th token
    fits, the 17th needs a block for each: the newer one is preempted, re-queued at the head."""
    s = single(4, 100, 3)
    s.set_requests([15, 15, 40], [50, 50, 50], [0, 0, 0])
    for r in range(3):
        s.add_request(r)
    b = s.schedule(0)
    assert b.admitted == [0, 1]  # request 2 needs 3 blocks: head-of-line stop
    s.complete(b)
    b = s.schedule(0)
    assert b.preempted == [] and b.num_decodes == 2
    s.complete(b)
    b = s.schedule(0)
    assert b.preempted == [1] and list(s.waiting[0][0]) == [1, 2]
    assert s.decoding(0) == [0] and s.kv.preemptions == 1
    assert s.generated == {1: 2}  # it recomputes its prompt and the two tokens it sampled
    assert s.start_tokens(1) == 17


def test_head_of_line_and_first_prompt_over_the_token_budget() -> None:
    s = Scheduler.single(4, 10, 10**9, 1, BT)
    s.set_requests([50, 2, 2], [5, 5, 5], [0, 0, 0])
    for r in range(3):
        s.add_request(r)
    b = s.schedule(0)
    assert b.admitted == [0] and b.prefill_tokens == 50  # alone over the limit: still runs
    s.complete(b)
    b = s.schedule(0)
    assert b.admitted == [1, 2] and b.num_decodes == 1  # budget 10 - 1 decoding
    assert not s.fits_alone(10**10)


def test_chunked_prefill_splits_a_prompt_over_iterations_within_the_budget() -> None:
    kv = KvAdmission(10**9, BT)
    s = Scheduler(
        kv,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        chunked_prefill=True,
        kv_bytes_per_token=[KVB],
        dense=[False],
    )
    s.set_requests([70, 10], [3, 3], [0, 0])
    s.add_request(0)
    s.add_request(1)
    sizes = []
    while s.prefilling[0] or s.num_waiting:
        b = s.schedule(0)
        assert b.prefill_tokens + b.num_decodes <= 32
        sizes.append([(p.request_id, c) for p, c in b.chunks])
        s.complete(b)
    # 70 tokens in chunks of the budget; request 1 takes what is left of the third
    assert sizes == [[(0, 32)], [(0, 32)], [(0, 6), (1, 10)]]
    assert s.num_computed_tokens(0, 0) == 70 and s.decoding(0) == [0, 1]


def test_bind_checks_the_allocator_and_caps_capacity() -> None:
    s = Scheduler.single(4, 10, 10**9, KVB, BT)
    with pytest.raises(ValueError, match="tokens"):
        s.bind(KVBlockAllocator(32, KVB, max_bytes=64 * 32 * KVB))
    with pytest.raises(ValueError, match="bytes/token"):
        s.bind(KVBlockAllocator(BT, 2 * KVB, max_bytes=64 * BT * KVB))
    s.bind(KVBlockAllocator(BT, KVB, initial_blocks=4, max_bytes=4 * BT * KVB))
    assert s.kv.capacity == 4 * BT * KVB


def _swapping(cap_blocks: int, swap_capacity: int) -> Scheduler:
    return Scheduler(
        KvAdmission(cap_blocks * BT * KVB, BT),
        max_num_seqs=4,
        max_num_batched_tokens=100,
        chunked_prefill=False,
        kv_bytes_per_token=[KVB],
        dense=[False],
        swap_capacity=swap_capacity,
    )


def test_swap_preemption_keeps_the_kv_and_resumes_decoding_without_prefill() -> None:
    """Two 15-token prompts in 3 blocks: at step 2 both cross into a second block and only one
    is free. The newer request's 16 KV tokens go to host swap space; the block that frees lets
    it back in at once (its KV copied back, the step's block owed). At step 3 the owed block
    does not fit: out again (17 tokens now), back when the older request has finished. Never
    a prefill again, and every token is decoded exactly once."""
    s = _swapping(3, swap_capacity=10**6)
    s.set_requests([15, 15], [4, 6], [0, 0])
    hooks = Finished()
    s.hooks = hooks
    s.add_request(0)
    s.add_request(1)
    log = []
    while s.num_running or s.num_waiting:
        b = s.schedule(0)
        log.append((b.step, b.admitted, b.preempted, b.swap_bytes, len(b.chunks), b.num_decodes))
        s.complete(b)
    assert log == [
        (0, [0, 1], [], [], 2, 0),
        (1, [], [], [], 0, 2),
        (2, [1], [1], [16 * KVB, 16 * KVB], 0, 2),  # out and straight back in
        (3, [], [1], [17 * KVB], 0, 1),  # its owed block does not fit: out again
        (4, [1], [], [17 * KVB], 0, 1),  # request 0 finished at step 3: back in
        (5, [], [], [], 0, 1),
        (6, [], [], [], 0, 1),
    ]
    # request 0: 1 token from its prefill + 3 decodes; request 1: 1 + 5 (steps 1, 2, 4, 5, 6)
    assert hooks.done == [0, 1] and hooks.first == [0, 1]
    assert s.kv.preemptions == 2 and s.swap_moved == (16 + 16 + 17 + 17) * KVB
    assert s.swap_used == 0 and not s.swapped and s.kv.reserved == 0


def test_without_swap_space_a_swap_preemption_recomputes() -> None:
    s = _swapping(3, swap_capacity=8 * KVB)  # too small for 16 tokens
    s.set_requests([15, 15], [4, 6], [0, 0])
    s.add_request(0)
    s.add_request(1)
    for _ in range(3):
        b = s.schedule(0)
        s.complete(b)
    assert b.preempted == [1] and b.swap_bytes == []
    assert s.generated == {1: 2} and s.start_tokens(1) == 17


class HandsOff(Finished):
    def __init__(self) -> None:
        super().__init__()
        self.left: list[tuple[int, int, int]] = []

    def hands_off(self) -> bool:
        return True

    def on_handoff(self, m: int, rid: int, kv_tokens: int, generated: int) -> None:
        self.left.append((rid, kv_tokens, generated))


def test_a_prefill_replica_hands_requests_off_and_a_decode_replica_takes_them_in() -> None:
    pre = _swapping(8, 0)
    pre.set_requests([20, 30], [5, 1], [0, 0])
    hooks = HandsOff()
    pre.hooks = hooks
    pre.add_request(0)
    pre.add_request(1)
    b = pre.schedule(0)
    pre.complete(b)
    assert hooks.left == [(0, 20, 1)]  # request 1 (one output token) just finishes
    assert hooks.done == [1] and pre.num_running == 0 and pre.kv.reserved == 0
    dec = _swapping(8, 0)
    dec.set_requests([20, 30], [5, 1], [0, 0])
    dec.add_handed_in(0, 0, kv_tokens=20, generated=1)
    b = dec.schedule(0)
    assert b.admitted == [0] and b.chunks == [] and b.swap_bytes == [] and b.num_decodes == 1
    assert dec.num_computed_tokens(0, 0) == 20
    steps = 0
    while dec.num_running:
        dec.complete(b)
        steps += 1
        b = dec.schedule(0)
    assert steps == 4  # the 4 tokens it still owes


def test_abort_all_releases_swap_space_and_blocks() -> None:
    """The swap case above stopped after step 3 (request 1 swapped out with 17 KV tokens,
    request 0 finished at that step): a crash drops it, and its host swap space is free."""
    s = _swapping(3, swap_capacity=10**6)
    s.set_requests([15, 15], [4, 6], [0, 0])
    s.add_request(0)
    s.add_request(1)
    for _ in range(4):
        s.complete(s.schedule(0))
    assert s.swap_used == 17 * KVB and list(s.swapped) == [1]
    queued, running = s.abort_all()
    assert queued == [1] and running == []
    assert s.swap_used == 0 and not s.swapped and s.kv.reserved == 0
    assert s.num_running == s.num_waiting == 0


def test_a_queued_head_that_does_not_fit_holds_back_lower_classes() -> None:
    """4 blocks: class 0's first 40-token prompt takes 3, its second (3 more) does not fit,
    and class 1's 10-token prompt (1 block, it would fit) must wait behind it: no class
    overtakes a higher class's head of line."""
    s = Scheduler(
        KvAdmission(4 * BT * KVB, BT),
        max_num_seqs=4,
        max_num_batched_tokens=1000,
        chunked_prefill=False,
        kv_bytes_per_token=[KVB],
        dense=[False],
        num_classes=2,
    )
    s.set_requests([40, 40, 10], [3, 3, 3], [0, 0, 1])
    for rid in range(3):
        s.add_request(rid)
    b = s.schedule(0)
    assert b.admitted == [0] and s.num_waiting == 2 and s.head(0) == 1


def test_admission_budget_counts_the_prompt_tokens_still_to_prefill() -> None:
    """Chunked prefill, budget 64: a 200-token prompt prefills 64 tokens a step (64, 64, 64,
    8). A second prompt is admitted only in the step where the first's remaining tokens leave
    budget over (step 3: 64 - 8 = 56), not while the first still needs the whole budget."""
    s = Scheduler(
        KvAdmission(10**6, BT),
        max_num_seqs=4,
        max_num_batched_tokens=64,
        chunked_prefill=True,
        kv_bytes_per_token=[KVB],
        dense=[False],
    )
    s.set_requests([200, 30], [2, 2], [0, 0])
    s.add_request(0)
    s.add_request(1)
    log = []
    for _ in range(4):
        b = s.schedule(0)
        log.append((b.admitted, [(p.request_id, c) for p, c in b.chunks]))
        s.complete(b)
    assert log == [
        ([0], [(0, 64)]),
        ([], [(0, 64)]),
        ([], [(0, 64)]),
        ([1], [(0, 8), (1, 30)]),
    ]
