"""Stateful Hypothesis tests of KVBlockAllocator against a reference model of its sequences.

The model keeps, per live sequence in start order, its full token list (prompt tokens from a
tiny alphabet so prefixes are shared often; decoded tokens are unique per sequence). After
every step the allocator must agree with the model and keep its invariants:

* a block is held twice only when it is a shared prefix block: same position in both tables
  and the same tokens up to where both fill it;
* refcount(b) == number of sequences whose table contains b; used + free + cached == pool;
* the pool never exceeds its cap;
* a failed allocation changes nothing; preemption takes the most recently started sequences.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv import KVBlockAllocator, KVOutOfBlocks, make_offload_tiers

BT = 8  # tokens per block
BPT = 4  # bytes per token
CAP_BLOCKS = 12
# Three base prompts; a sequence takes a prefix of one and adds a short tail from {0, 1}.
BASES = [[0] * 40, [1, 0] * 20, [i % 3 for i in range(40)]]


def full_state(a: KVBlockAllocator) -> tuple[Any, ...]:
    """Everything observable about the allocator, for 'state unchanged' checks."""
    tiers = ()
    if a._offload is not None:
        tiers = tuple((t.name, tuple(t), t.used) for t in a._offload.tiers)
    return (
        {s: list(t) for s, t in a._tables.items()},
        dict(a._ntok),
        list(a._ref),
        list(a._free),
        list(a._bkey),
        dict(a._kblock),
        list(a._policy),
        a.pool_blocks,
        asdict(a.stats),
        tiers,
        list(a._copies),
        list(a._transfers),
    )


class AllocatorMachine(RuleBasedStateMachine):
    on_full = "fail"
    offload = False

    def __init__(self) -> None:
        super().__init__()
        tiers = make_offload_tiers(3 * BT * BPT, 4 * BT * BPT) if self.offload else None
        self.a = KVBlockAllocator(
            block_tokens=BT,
            bytes_per_token=BPT,
            initial_blocks=2,
            growth=1.5,
            max_bytes=CAP_BLOCKS * BT * BPT,
            on_full=self.on_full,  # type: ignore[arg-type]
            offload_tiers=tiers,
            chunk_tokens=2 * BT,
            record_moves=True,
        )
        self.model: dict[int, list[int]] = {}  # live sequences in start order -> tokens
        self.prompts: dict[int, tuple[int, ...]] = {}
        self.next_id = 0

    # -- helpers ---------------------------------------------------------------------------
    def _pick(self, i: int) -> int:
        return list(self.model)[i % len(self.model)]

    def _drop_preempted(self, preempted: tuple[Any, ...]) -> None:
        newest_first = list(reversed(self.model))
        assert list(preempted) == newest_first[: len(preempted)], "preempted not newest first"
        for s in preempted:
            del self.model[s]

    # -- rules -----------------------------------------------------------------------------
    @rule(
        base=st.integers(0, len(BASES) - 1),
        cut=st.integers(0, 40),
        tail=st.lists(st.integers(0, 1), max_size=12),
    )
    def allocate(self, base: int, cut: int, tail: list[int]) -> None:
        self._allocate(BASES[base][:cut] + tail)

    @rule(n=st.integers(0, 3 * BT))
    def allocate_count(self, n: int) -> None:
        """A prompt given by its length only: no keys, so nothing is shared (while no block
        has a key, the allocator's fast paths leave refcounts to be recounted when read)."""
        self._allocate_n(n)

    def _allocate_n(self, n: int) -> None:
        sid = self.next_id
        self.next_id += 1
        before = full_state(self.a)
        try:
            res = self.a.allocate(sid, n, now=float(sid))
        except KVOutOfBlocks:
            assert full_state(self.a) == before, "failed allocation changed state"
            return
        assert res.hit_tokens == res.loaded_tokens == 0
        self._drop_preempted(res.preempted)
        self.model[sid] = [0] * n
        self.prompts[sid] = (0,) * n  # a fork of it shares by content keys

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 1000))
    def fork(self, i: int) -> None:
        """A new sequence with exactly another one's prompt (shares its partial last block)."""
        self._allocate(list(self.prompts[self._pick(i)]))

    def _allocate(self, tokens: list[int]) -> None:
        sid = self.next_id
        self.next_id += 1
        before = full_state(self.a)
        try:
            res = self.a.allocate(sid, tokens, now=float(sid))
        except KVOutOfBlocks as err:
            assert err.needed > err.available
            if self.on_full == "preempt":  # only refused when the prompt alone exceeds the cap
                assert -(-len(tokens) // BT) > CAP_BLOCKS
            assert full_state(self.a) == before, "failed allocation changed state"
            event("allocate refused")
            return
        assert self.on_full == "preempt" or not res.preempted
        self._drop_preempted(res.preempted)
        assert 0 <= res.hit_tokens + res.loaded_tokens <= len(tokens)
        for what, happened in (
            ("prefix hit", res.hit_tokens),
            ("load-back", res.loaded_tokens),
            ("preempted on allocate", res.preempted),
        ):
            if happened:
                event(what)
        self.model[sid] = list(tokens)
        self.prompts[sid] = tuple(tokens)

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 1000), n=st.integers(0, 12))
    def append(self, i: int, n: int) -> None:
        sid = self._pick(i)
        before = full_state(self.a)
        try:
            preempted = self.a.append(sid, n, now=float(self.next_id))
        except KVOutOfBlocks as err:
            assert self.on_full == "fail" and err.needed > err.available
            assert full_state(self.a) == before, "failed append changed state"
            event("append refused")
            return
        if preempted:
            event("preempted on append")
        if self.a.take_copies():
            event("copy-on-write")
        self._drop_preempted(preempted)
        if sid in self.model:
            start = len(self.model[sid])
            self.model[sid].extend(-(sid * 1000 + start + k + 1) for k in range(n))
        else:
            assert sid in preempted

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 1000))
    def free(self, i: int) -> None:
        sid = self._pick(i)
        table = self.a.block_table(sid)
        others = {b for s in self.model if s != sid for b in self.a.block_table(s)}
        self.a.free(sid, now=float(self.next_id))
        del self.model[sid]
        for b in table:
            if b in others:  # a shared block is released only by its last holder
                assert self.a.refcount(b) > 0
                assert b not in self.a._free and not self.a.is_cached(b)
            else:
                assert self.a.refcount(b) == 0

    @rule()
    def grow(self) -> None:
        before = self.a.pool_blocks
        added = self.a.grow()
        assert self.a.pool_blocks == before + added <= CAP_BLOCKS
        assert (added == 0) == (before == CAP_BLOCKS)

    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        cached = self.a.num_cached_blocks
        done = self.a.evict_cached(n, now=float(self.next_id))
        assert done == min(n, cached)
        assert self.a.num_cached_blocks == cached - done

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def allocator_invariants(self) -> None:
        self.a.check_invariants()
        assert self.a.pool_blocks <= CAP_BLOCKS

    @invariant()
    def agrees_with_model(self) -> None:
        a = self.a
        assert a.sequences() == list(self.model)
        holders: dict[int, list[tuple[int, int]]] = {}
        for sid, tokens in self.model.items():
            assert a.num_tokens(sid) == len(tokens)
            table = a.block_table(sid)
            assert len(table) == -(-len(tokens) // BT)
            for i, b in enumerate(table):
                holders.setdefault(b, []).append((sid, i))
        for b in range(a.pool_blocks):  # held or not (a free block counts 0)
            assert a.refcount(b) == len(holders.get(b, ()))
        for b, hs in holders.items():
            if len(hs) > 1:  # only shared prefix blocks: same place, same content so far
                assert a.key_of(b) is not None
                (s0, i0) = hs[0]
                for s, i in hs[1:]:
                    assert i == i0
                    fill = min(len(self.model[s]), len(self.model[s0])) - i * BT
                    end = i * BT + min(BT, fill)
                    assert self.model[s][:end] == self.model[s0][:end]

    @invariant()
    def chunks_cover_table(self) -> None:
        for sid in self.model:
            chunks = self.a.chunks(sid)
            assert [b for c in chunks for b in c] == self.a.block_table(sid)
            assert all(len(c) == 2 for c in chunks[:-1])


class PreemptMachine(AllocatorMachine):
    on_full = "preempt"
    offload = True


class FailOffloadMachine(AllocatorMachine):
    offload = True


TestFail = AllocatorMachine.TestCase
TestPreemptOffload = PreemptMachine.TestCase
TestFailOffload = FailOffloadMachine.TestCase
TestFail.settings = settings(settings.default, stateful_step_count=40)
TestPreemptOffload.settings = settings(settings.default, stateful_step_count=40)
TestFailOffload.settings = settings(settings.default, max_examples=25, stateful_step_count=40)


@pytest.mark.slow
class TestPreemptOffloadLong(PreemptMachine.TestCase):  # type: ignore[misc,valid-type]
    settings = settings(settings.default, max_examples=400, stateful_step_count=120)


@pytest.mark.slow
class TestFailLong(AllocatorMachine.TestCase):  # type: ignore[misc,valid-type]
    settings = settings(settings.default, max_examples=400, stateful_step_count=120)
