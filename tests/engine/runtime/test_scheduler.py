"""Continuous-batching admission: the simulator node's rules, checked against a model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.runtime.scheduler import BatchScheduler


def _model_admit(
    queue: list[int],
    running: int,
    reserved: int,
    prompts: list[int],
    seqs: list[int],
    max_batch: int,
    max_tokens: int,
    cap: int,
    kvb: int,
    bt: int,
) -> list[int]:
    new: list[int] = []
    tokens = 0
    for rid in queue:
        if running + len(new) >= max_batch:
            break
        need = -(-seqs[rid] // bt) * bt * kvb
        if reserved + need > cap or (new and tokens + prompts[rid] > max_tokens):
            break
        reserved += need
        tokens += prompts[rid]
        new.append(rid)
    return new


@given(
    prompts=st.lists(st.integers(1, 300), min_size=1, max_size=30),
    outs=st.lists(st.integers(1, 40), min_size=30, max_size=30),
    max_batch=st.integers(1, 8),
    max_tokens=st.integers(1, 600),
    cap_blocks=st.integers(1, 200),
    finish=st.lists(st.booleans(), min_size=60, max_size=60),
)
def test_admission_matches_reference_and_keeps_invariants(
    prompts: list[int],
    outs: list[int],
    max_batch: int,
    max_tokens: int,
    cap_blocks: int,
    finish: list[bool],
) -> None:
    bt, kvb = 16, 8
    seqs = [p + o for p, o in zip(prompts, outs, strict=False)]
    s = BatchScheduler(max_batch, max_tokens, cap_blocks * bt * kvb, kvb, bt)
    for rid in range(len(prompts)):
        s.submit(rid)
    flips = iter(finish)
    for _ in range(40):
        expect = _model_admit(
            list(s.queue),
            len(s.running),
            s.reserved,
            prompts,
            seqs,
            max_batch,
            max_tokens,
            s.kv_capacity,
            kvb,
            bt,
        )
        got = s.admit(prompts, seqs)
        assert got == expect
        assert 0 <= s.reserved <= s.kv_capacity
        assert len(s.running) <= max_batch
        assert s.reserved == sum(s.kv_need(seqs[r]) for r in s.running)
        for rid in list(s.running):
            if next(flips, True):
                s.finish(rid)
        if not s.queue and not s.running:
            break


def test_head_of_line_blocks_and_first_prompt_always_fits_token_limit() -> None:
    s = BatchScheduler(
        max_batch=4, max_batch_tokens=10, kv_capacity=10**9, kv_bytes_per_token=1, block_tokens=16
    )
    prompts, seqs = [50, 2, 2], [60, 3, 3]
    for r in range(3):
        s.submit(r)
    assert s.admit(prompts, seqs) == [0]  # alone over the token limit: still admitted
    assert s.admit(prompts, seqs) == [1, 2]
    assert not s.fits_alone(10**10)
