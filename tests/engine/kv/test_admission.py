"""The shared admission object (engine.kv.admission): its bookkeeping matches the engine's
allocator and a per-token reference, and its admission tests are the stated rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.kv.admission import KvAdmission, LogEntry, iteration_kind
from engine.kv.allocator import KVBlockAllocator

BT, BPT = 16, 4


@given(
    prompts=st.lists(st.integers(1, 80), min_size=1, max_size=6),
    steps=st.integers(0, 70),
)
def test_growth_keeps_blocks_equal_to_the_tokens_written(prompts: list[int], steps: int) -> None:
    """Prompts admitted, then ``steps`` decode steps with a block taken exactly when the
    written token starts one: the reservation and the allocator always hold
    ``ceil(tokens / BT)`` blocks per sequence, and the log has one entry per block."""
    alloc = KVBlockAllocator(BT, BPT, initial_blocks=64, max_bytes=1 << 20)
    log: list[LogEntry] = []
    kv = KvAdmission(1 << 20, BT, [alloc], log=log)
    ctx = {}
    for rid, p in enumerate(prompts):
        kv.take(rid, 0, p, BPT)
        ctx[rid] = p
    for s in range(steps):
        items = [(r, ctx[r] + 1, s) for r in ctx if ctx[r] % BT == 0]
        assert kv.can_grow(len(items), BPT)
        kv.grow(0, items, BPT)
        for r in ctx:
            ctx[r] += 1
    blocks = sum(-(-t // BT) for t in ctx.values())
    assert kv.reserved == blocks * BT * BPT
    assert alloc.num_used_blocks == blocks
    assert [len(alloc.block_table(r)) for r in ctx] == [-(-t // BT) for t in ctx.values()]
    assert sum(1 for e in log if e[1] == "block") == blocks - sum(-(-p // BT) for p in prompts)
    for rid in list(ctx):
        kv.finish(rid, BPT)
    assert kv.reserved == 0 and kv.needed == 0 and alloc.num_used_blocks == 0
    assert [e[2] for e in log if e[1] == "done"] == list(range(len(prompts)))


@given(
    tokens=st.integers(1, 500),
    budget=st.integers(-5, 500),
    first=st.booleans(),
    chunked=st.booleans(),
)
def test_budget_rule(tokens: int, budget: int, first: bool, chunked: bool) -> None:
    stop = budget <= 0 or (not chunked and tokens > budget and not first)
    assert KvAdmission.budget_allows(tokens, budget, first, chunked) is (not stop)


def test_watermark_applies_only_while_something_runs() -> None:
    kv = KvAdmission(100 * BT * BPT, BT, watermark=0.1)
    kv.take(0, 0, 80 * BT, BPT)  # 80 of 100 blocks
    need = kv.size(15 * BT, BPT)[0]
    assert kv.can(need) and not kv.fits(need, running=True)  # 95 > 90 blocks
    assert kv.fits(need, running=False)
    assert kv.fits(kv.size(10 * BT, BPT)[0], running=True)  # exactly 90
    assert not kv.fits_alone(100 * BT + 1, BPT) and kv.fits_alone(100 * BT, BPT)


def test_preempt_frees_counts_and_logs_and_the_victim_is_the_newest() -> None:
    log: list[LogEntry] = []
    kv = KvAdmission(10 * BT * BPT, BT, log=log)
    running = {}
    for rid in (4, 2, 7):
        kv.take(rid, 0, BT, BPT)
        running[rid] = None
    assert KvAdmission.victim(running) == 7 and KvAdmission.victim([4, 2]) == 2
    kv.step = 5
    kv.preempt(7, BPT)
    assert kv.preemptions == 1 and 7 not in kv.seqs and kv.reserved == 2 * BT * BPT
    assert log[-1] == (5, "preempt", 7, 0)
    assert log[:3] == [(0, "admit", 4, BT), (0, "admit", 2, BT), (0, "admit", 7, BT)]


def test_iteration_kind() -> None:
    assert iteration_kind(10, 0) == "prefill"
    assert iteration_kind(10, 3) == "mixed"
    assert iteration_kind(0, 3) == "decode"


def test_bad_watermark_is_refused() -> None:
    with pytest.raises(ValueError, match="watermark"):
        KvAdmission(100, BT, watermark=1.0)


@given(
    prompts=st.lists(st.integers(1, 80), min_size=1, max_size=8),
    steps=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    logged=st.booleans(),
)
def test_grow_at_is_grow_with_the_items_built(
    prompts: list[int], steps: list[int], logged: bool
) -> None:
    """``grow_at(m, rids, base, step)`` leaves the admission object, its log and the
    allocator exactly as ``grow`` with ``(rid, base[rid] + step, step)`` items does."""
    sides = []
    for _ in range(2):
        alloc = KVBlockAllocator(BT, BPT, initial_blocks=4, max_bytes=1 << 20)
        kv = KvAdmission(1 << 20, BT, [alloc], log=[] if logged else None)
        for rid, p in enumerate(prompts):
            kv.take(rid, 0, p, BPT)
        sides.append((kv, alloc))
    base = dict(enumerate(prompts))
    for i in range(len(steps)):
        rids = [r for r in base if (r + i) % 3 != 0]  # some of them, in order
        at = 1 + sum(steps[: i + 1]) + i  # increasing: every sequence's context grows
        sides[0][0].grow(0, [(r, base[r] + at, at) for r in rids], BPT)
        sides[1][0].grow_at(0, rids, base, at, BPT)
    (a, fa), (b, fb) = sides
    assert (a.reserved, a.needed, a.seqs, a.log) == (b.reserved, b.needed, b.seqs, b.log)
    assert [fa.block_table(r) for r in base] == [fb.block_table(r) for r in base]
    assert [fa.num_tokens(r) for r in base] == [fb.num_tokens(r) for r in base]
    assert fa.num_free_blocks == fb.num_free_blocks and fa.pool_blocks == fb.pool_blocks


@given(
    st.integers(0, 10_000),
    st.integers(1, 4096),
    st.integers(0, 50_000_000),
    st.booleans(),
    st.sampled_from([8, 16, 32]),
    st.floats(0.0, 0.5),
)
def test_fits_tokens_is_fits_of_the_block_size(
    tokens: int, bpt: int, reserved: int, running: bool, bt: int, watermark: float
) -> None:
    """The one-call test gives exactly what ``fits(size(tokens)[0])`` gives."""
    kv = KvAdmission(40_000_000, bt, None, watermark)
    kv.reserved = reserved
    assert kv.fits_tokens(tokens, bpt, running) == kv.fits(kv.size(tokens, bpt)[0], running)
