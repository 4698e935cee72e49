"""sim.serving.prefixcache.PrefixCache over engine/kv's allocator: shared blocks are reserved once and freed
only when their last holder leaves, and a Hypothesis state machine checks it against a plain
reference model of a vLLM-style prefix cache (keys named by content, LRU of freed blocks).

The reference model never calls engine.kv.prefix: a prompt of chain ``c`` and ``n`` tokens has
content "the first ``n`` tokens of chain ``c``", where every chain shares its first trace block
and differs after it, so the content of a replica block ending at token ``e`` is named by
``(c if e > T else None, e)``. The trace ids the cache sees are the Mooncake kind: trace block
0 is id 0 for every chain, block ``t >= 1`` of chain ``c`` is id ``1000 * c + t``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv import KVBlockAllocator
from engine.sched.scheduler import Prefill
from sim.serving.prefixcache import PrefixCache
from sim.serving.replica import KvAccount

T = 64  # trace block tokens (512 in Mooncake; smaller here so prompts stay small)
B = 16  # replica block tokens
BPT = 2  # KV bytes per token
CHAINS = 3


def chain_ids(c: int, n: int) -> list[int]:
    return [0 if t == 0 else 1000 * c + t for t in range(-(-n // T))]


class FakeWorkload:
    """The two Workload members PrefixCache reads, for hand-made requests."""

    hash_block_tokens = T

    def __init__(self) -> None:
        self.ids: dict[int, list[int]] = {}

    def block_hash_ids(self, i: int) -> np.ndarray:
        return np.asarray(self.ids[i], dtype=np.int64)


def make(cap_blocks: int, models: int = 1) -> tuple[KvAccount, PrefixCache, FakeWorkload]:
    allocs = [
        KVBlockAllocator(block_tokens=B, bytes_per_token=BPT, max_bytes=cap_blocks * B * BPT)
        for _ in range(models)
    ]
    kv = KvAccount(cap_blocks * B * BPT, B, allocs)
    wl = FakeWorkload()
    prompt: list[int] = [0] * 1000
    pc = PrefixCache(kv, allocs, wl, prompt)  # type: ignore[arg-type]
    kv.prefix = pc
    return kv, pc, wl


def add(pc: PrefixCache, wl: FakeWorkload, rid: int, c: int, n: int) -> None:
    wl.ids[rid] = chain_ids(c, n)
    pc.prompt[rid] = n


def prefill_all(pc: PrefixCache, rid: int, skip: int, n: int) -> None:
    pc.computed(0, [(Prefill(rid, 0, n), n - skip)])


def test_shared_blocks_are_reserved_once_and_freed_only_when_both_holders_finish() -> None:
    kv, pc, wl = make(64)
    (a,) = kv.allocators  # type: ignore[misc]
    add(pc, wl, 1, 0, 200)  # 3 full trace blocks + 8 tokens: 12 full replica blocks keyed
    add(pc, wl, 2, 1, 150)  # shares trace block 0 (4 replica blocks) with request 1
    assert kv.take(1, 0, 200, BPT) == 0
    prefill_all(pc, 1, 0, 200)
    assert kv.take(2, 0, 150, BPT) == 4 * B  # its first trace block is reused
    shared = a.block_table(1)[:4]
    assert a.block_table(2)[:4] == shared
    assert [a.refcount(b) for b in shared] == [2] * 4
    # 13 blocks for request 1, 10 for request 2 of which 4 are request 1's: 19 used, once each
    assert a.num_used_blocks == 19 and kv.reserved == 19 * B * BPT
    assert kv.needed == (200 + 150 - 4 * B) * BPT
    a.check_invariants()
    kv.give(1, BPT)
    assert [a.refcount(b) for b in shared] == [1] * 4  # still held by request 2
    assert a.num_used_blocks == 10 and kv.reserved == 10 * B * BPT
    assert kv.needed == 150 * BPT
    # request 1's other 8 keyed blocks are cached, its partial tail block is free
    assert a.num_cached_blocks == 8
    a.check_invariants()
    kv.give(2, BPT)
    assert [a.refcount(b) for b in shared] == [0] * 4 and all(a.is_cached(b) for b in shared)
    assert kv.reserved == 0 and kv.needed == 0 and a.num_used_blocks == 0
    assert a.num_used_blocks + a.num_free_blocks + a.num_cached_blocks == a.pool_blocks
    a.check_invariants()


def test_blocks_not_yet_computed_are_shared_but_prefilled_again() -> None:
    kv, pc, wl = make(64)
    add(pc, wl, 1, 0, 128)
    add(pc, wl, 2, 0, 128)
    assert kv.take(1, 0, 128, BPT) == 0
    assert kv.take(2, 0, 128, BPT) == 0  # request 1 has computed nothing yet
    pc.computed(0, [(Prefill(1, 64, 64), 64)])  # request 1's first 64 tokens are done
    add(pc, wl, 3, 0, 128)
    assert kv.take(3, 0, 128, BPT) == 64
    # a whole cached prompt still prefills its last block (logits of the last token)
    pc.computed(0, [(Prefill(1, 0, 128), 64)])
    add(pc, wl, 4, 0, 128)
    assert kv.take(4, 0, 128, BPT) == 128 - B
    assert pc.hit_tokens == 64 + 112 and pc.query_tokens == 4 * 128


def test_need_counts_only_blocks_no_running_sequence_holds() -> None:
    kv, pc, wl = make(64)
    add(pc, wl, 1, 0, 128)
    add(pc, wl, 2, 0, 100)
    kv.take(1, 0, 128, BPT)
    # 100 tokens = 7 blocks, the first 6 full ones are request 1's
    assert pc.need(2, 0, 100, BPT) == 1 * B * BPT
    kv.give(1, BPT)  # now cached: taking them moves them back into `reserved`
    assert pc.need(2, 0, 100, BPT) == 7 * B * BPT


def test_swapped_in_sequences_share_blocks_but_reuse_nothing() -> None:
    kv, pc, wl = make(64)
    add(pc, wl, 1, 0, 128)
    kv.take(1, 0, 128, BPT)
    prefill_all(pc, 1, 0, 128)
    kv.give(1, BPT)
    assert kv.take(1, 0, 140, BPT, prefill=False) == 0  # swap-in: KV copied back
    assert pc.query_tokens == 128 and pc.hit_tokens == 0
    add(pc, wl, 2, 0, 128)
    assert kv.take(2, 0, 128, BPT) == 128 - B  # the swapped-in blocks are ready


def test_two_models_trim_each_others_cached_blocks_to_the_capacity() -> None:
    kv, pc, wl = make(16, models=2)
    a0, a1 = kv.allocators  # type: ignore[misc]
    add(pc, wl, 1, 0, 192)  # 12 blocks
    kv.take(1, 0, 192, BPT)
    prefill_all(pc, 1, 0, 192)
    kv.give(1, BPT)
    assert a0.num_cached_blocks == 12 and kv.reserved == 0
    add(pc, wl, 2, 1, 128)  # model 1 takes 8 blocks: 4 of model 0's cached ones must go
    kv.take(2, 1, 128, BPT)
    assert a1.num_used_blocks == 8 and a0.num_cached_blocks == 8
    assert kv.reserved + (a0.num_cached_blocks + a1.num_cached_blocks) * B * BPT <= kv.capacity


# -- the state machine ------------------------------------------------------------------------
CAP = 24  # replica blocks


def ref_keys(c: int, n: int) -> list[tuple[int | None, int]]:
    """Content names of the full replica blocks of chain ``c``'s first ``n`` tokens."""
    return [(c if e > T else None, e) for e in range(B, n + 1, B)]


class PrefixMachine(RuleBasedStateMachine):
    """Random admissions, prefill progress and finishes against the reference model."""

    def __init__(self) -> None:
        super().__init__()
        self.kv, self.pc, self.wl = make(CAP)
        (self.a,) = self.kv.allocators  # type: ignore[misc]
        self.next_rid = 0
        # reference: live sequences (rid -> [content keys, tokens, blocks, tokens computed])
        self.live: dict[int, list[Any]] = {}
        self.ref: dict[Any, int] = {}  # content key -> sequences holding its block
        self.cached: OrderedDict[Any, None] = OrderedDict()  # LRU: first evicted first
        self.ready: set[Any] = set()
        self.unkeyed = 0  # used blocks without a key (partial tails)

    def free_blocks(self) -> int:
        return CAP - len(self.ref) - len(self.cached) - self.unkeyed

    @rule(c=st.integers(0, CHAINS - 1), n=st.integers(1, 150))
    def admit(self, c: int, n: int) -> None:
        rid = self.next_rid
        self.next_rid += 1
        add(self.pc, self.wl, rid, c, n)
        keys = ref_keys(c, n)
        nb = -(-n // B)
        shared = 0
        while shared < len(keys) and (keys[shared] in self.ref or keys[shared] in self.cached):
            shared += 1
        on_used = sum(1 for k in keys[:shared] if k in self.ref)
        assert self.pc.need(rid, 0, n, BPT) == (nb - on_used) * B * BPT
        if self.kv.reserved + (nb - on_used) * B * BPT > self.kv.capacity:
            return  # the replica would not admit it (KvAccount's check)
        r = 0
        while r < min(shared, (n - 1) // B) and keys[r] in self.ready:
            r += 1
        for k in keys[:shared]:
            self.cached.pop(k, None)
            self.ref[k] = self.ref.get(k, 0) + 1
        fresh = nb - shared
        while fresh > self.free_blocks():
            victim, _ = self.cached.popitem(last=False)
            self.ready.discard(victim)
        for k in keys[shared:]:
            self.ref[k] = 1
            self.ready.discard(k)
        self.unkeyed += nb - len(keys)
        assert self.kv.take(rid, 0, n, BPT) == r * B
        self.live[rid] = [keys, n, nb, r * B]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), step=st.integers(1, 80))
    def prefill(self, data: st.DataObject, step: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        keys, n, _, done = self.live[rid]
        c = min(step, n - done)
        if c <= 0:
            return
        done += c
        self.live[rid][3] = done
        self.pc.computed(0, [(Prefill(rid, n - done, done), c)])
        self.ready.update(keys[: done // B])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        keys, _n, nb, _ = self.live.pop(rid)
        self.kv.give(rid, BPT)
        self.unkeyed -= nb - len(keys)
        for k in reversed(keys):  # tail first, as vLLM frees a request's blocks
            self.ref[k] -= 1
            if self.ref[k] == 0:
                del self.ref[k]
                self.cached[k] = None

    @invariant()
    def agrees_with_the_reference(self) -> None:
        a, kv = self.a, self.kv
        a.check_invariants()
        assert a.num_used_blocks + a.num_free_blocks + a.num_cached_blocks == a.pool_blocks
        assert a.num_used_blocks == len(self.ref) + self.unkeyed
        assert a.num_cached_blocks == len(self.cached)
        assert kv.reserved == a.num_used_blocks * B * BPT <= kv.capacity
        for rid, (keys, _n, _, _) in self.live.items():
            table = a.block_table(rid)
            for i, k in enumerate(keys):
                assert a.refcount(table[i]) == self.ref[k]
            for other, (okeys, _, _, _) in self.live.items():
                if other < rid:  # same block exactly where the content is the same
                    otable = a.block_table(other)
                    for i in range(min(len(keys), len(okeys))):
                        assert (table[i] == otable[i]) == (keys[i] == okeys[i])


TestPrefixMachine = PrefixMachine.TestCase
TestPrefixMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@pytest.mark.slow
def test_prefix_machine_long_runs() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        PrefixMachine, settings=settings(max_examples=400, stateful_step_count=80, deadline=None)
    )
