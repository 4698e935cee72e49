"""Chunked long-context layout (R12) and the attention working-memory model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.kv import (
    AttentionMemoryModel,
    chunk_spans,
    max_context_tokens,
    split_chunks,
    validate_chunk_tokens,
)


@given(
    n_blocks=st.integers(0, 100),
    bt=st.sampled_from([8, 64, 512]),
    per=st.integers(1, 8),
)
def test_chunks_are_whole_and_concatenate_to_the_table(n_blocks: int, bt: int, per: int) -> None:
    table = list(range(1000, 1000 + n_blocks))
    chunks = split_chunks(table, bt, per * bt)
    assert [b for c in chunks for b in c] == table
    assert all(len(c) == per for c in chunks[:-1])
    assert len(chunks) == -(-n_blocks // per)


@pytest.mark.parametrize("chunk", [0, -512, 100, 96, 32, 512.0, True])
def test_chunk_must_be_a_whole_number_of_blocks(chunk: object) -> None:
    with pytest.raises(InputError, match="chunk_tokens"):
        validate_chunk_tokens(chunk, 64)  # type: ignore[arg-type]


def test_chunk_spans_cover_the_sequence() -> None:
    assert chunk_spans(1100, 512) == [(0, 512), (512, 1024), (1024, 1100)]
    assert chunk_spans(0, 512) == []


def brute_max_context(m: AttentionMemoryModel, budget: int, chunked: bool, decode: bool) -> int:
    best = 0
    for n in range(1, budget + 2):  # peak >= n bytes, so nothing longer fits
        if m.peak_bytes(n, chunked, decode) <= budget:
            best = n
    return best


@given(
    kv=st.integers(1, 64),
    gather=st.integers(0, 32),
    score=st.integers(0, 8),
    budget=st.integers(0, 4_000),
    chunked=st.booleans(),
    decode=st.booleans(),
)
def test_max_context_is_the_largest_fitting_context(
    kv: int, gather: int, score: int, budget: int, chunked: bool, decode: bool
) -> None:
    m = AttentionMemoryModel(kv, gather, score, block_tokens=8, chunk_tokens=32)
    got = m.max_context(budget, chunked, decode)
    assert got == brute_max_context(m, budget, chunked, decode)
    # chunked never needs more scratch than unchunked
    assert m.max_context(budget, True, decode) >= m.max_context(budget, False, decode)


def test_working_memory_is_o_chunk_when_chunked() -> None:
    m = AttentionMemoryModel(100, 10, 4, block_tokens=64, chunk_tokens=512)
    assert m.working_bytes(16384, chunked=True) == m.working_bytes(512, chunked=True)
    assert m.working_bytes(16384, chunked=False) == 16384 * 10 + 16384**2 * 4
    assert m.working_bytes(16384, chunked=True, decode=True) == 512 * 10 + 512 * 4
    assert m.kv_bytes(65) == 128 * 100  # whole blocks


def test_chunking_lifts_a_2k_class_limit_to_16k_and_beyond() -> None:
    # A 7B-class model: 32 layers, 32 heads of 128, fp16 KV -> 512 KiB per token; fp32
    # scores for 32 heads; fp32 gather of one layer's K and V.
    m = AttentionMemoryModel(
        kv_bytes_per_token=32 * 2 * 32 * 128 * 2,
        gather_bytes_per_token=2 * 32 * 128 * 4,
        score_bytes_per_pair=32 * 4,
        block_tokens=64,
    )
    budget = 10 * 2**30
    unchunked = max_context_tokens(budget, m, chunked=False)
    chunked = max_context_tokens(budget, m, chunked=True)
    assert 2048 <= unchunked < 8192
    assert chunked >= 16384
    assert m.peak_bytes(chunked, True) <= budget < m.peak_bytes(chunked + 64, True)
