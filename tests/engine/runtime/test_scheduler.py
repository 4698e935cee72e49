"""Continuous-batching admission, KV growth and preemption: the simulator node's rules (the
shared :class:`engine.kv.admission.KvAdmission`), checked against a plain reference model."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.allocator import KVBlockAllocator
from engine.runtime.scheduler import BatchScheduler

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
    s = BatchScheduler(max_batch, max_tokens, cap_blocks * BT * KVB, KVB, BT, watermark=wm)
    alloc = KVBlockAllocator(BT, KVB, initial_blocks=cap_blocks, max_bytes=cap_blocks * BT * KVB)
    s.bind(alloc)
    ref = Reference(cap_blocks, max_batch, max_tokens, wm)
    ok = [r for r in range(n) if s.fits_alone(prompts[r] + outs[r])]
    for r in ok:
        s.submit(r)
        ref.queue.append(r)
    tokens = list(prompts)
    gen = [0] * n
    done: list[int] = []
    for _ in range(2000):
        if not s.queue and not s.running:
            break
        pre = s.grow()
        assert pre == ref.grow()
        for r in pre:
            tokens[r] = prompts[r] + gen[r]
        decoding = list(s.running)
        new = s.admit(tokens)
        assert new == ref.admit(tokens)
        assert 0 <= s.reserved <= s.kv.capacity
        assert s.reserved == sum(ref.blocks.values()) * BT * KVB
        assert alloc.num_used_blocks == sum(ref.blocks.values())
        for r in decoding + new:
            gen[r] += 1
        s.advance(decoding)
        for r in decoding:
            ref.ctx[r] += 1
        for r in decoding + new:
            if gen[r] >= outs[r]:
                s.finish(r)
                ref.running.remove(r)
                del ref.ctx[r], ref.blocks[r]
                done.append(r)
    assert sorted(done) == ok, "every request that fits alone completes"
    assert s.reserved == 0 and alloc.num_used_blocks == 0
    assert s.kv.preemptions == s.preempted


def test_prompt_only_admission_and_preemption_of_the_newest() -> None:
    """Two 15-token prompts fill 2 of 3 blocks (outputs are not reserved); the 16th token
    fits, the 17th needs a block for each: the newer one is preempted, re-queued at the head."""
    s = BatchScheduler(4, 100, 3 * BT * KVB, KVB, BT, watermark=0.0)
    for r in range(3):
        s.submit(r)
    assert s.admit([15, 15, 40]) == [0, 1]  # request 2 needs 3 blocks: head-of-line stop
    assert s.grow() == []
    s.advance(list(s.running))
    assert s.grow() == [1]
    assert list(s.queue) == [1, 2] and s.running == [0] and s.kv.preemptions == 1


def test_head_of_line_and_first_prompt_over_the_token_budget() -> None:
    s = BatchScheduler(4, 10, 10**9, 1, BT)
    for r in range(3):
        s.submit(r)
    assert s.admit([50, 2, 2]) == [0]  # alone over the token limit: still admitted
    assert s.admit([50, 2, 2]) == [1, 2]  # budget 10 - 1 running
    assert not s.fits_alone(10**10)


def test_bind_checks_the_allocator_and_caps_capacity() -> None:
    s = BatchScheduler(4, 10, 10**9, KVB, BT)
    with pytest.raises(ValueError, match="tokens"):
        s.bind(KVBlockAllocator(32, KVB, max_bytes=64 * 32 * KVB))
    s.bind(KVBlockAllocator(BT, KVB, initial_blocks=4, max_bytes=4 * BT * KVB))
    assert s.kv.capacity == 4 * BT * KVB
