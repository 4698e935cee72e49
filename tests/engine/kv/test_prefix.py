"""Content keys of KV blocks: chained, deterministic, equal exactly for equal prefixes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.kv import (
    ROOT,
    KVBlockAllocator,
    id_block_keys,
    num_blocks,
    token_block_keys,
    trace_block_keys,
)

token_lists = st.lists(st.integers(0, 2), max_size=40)


@given(a=token_lists, b=token_lists, bt=st.sampled_from([1, 2, 4, 8]))
def test_block_keys_are_equal_iff_the_covered_prefixes_are_equal(
    a: list[int], b: list[int], bt: int
) -> None:
    ka, kb = token_block_keys(a, bt), token_block_keys(b, bt)
    assert len(ka) == num_blocks(len(a), bt) and len(kb) == num_blocks(len(b), bt)
    for i in range(min(len(ka), len(kb))):
        end_a, end_b = min((i + 1) * bt, len(a)), min((i + 1) * bt, len(b))
        same = end_a == end_b and a[:end_a] == b[:end_b]
        assert (ka[i] == kb[i]) == same


def test_keys_are_stable_across_processes_and_input_types() -> None:
    toks = list(range(10))
    expected = ["7a7b90df657bf3dca0cd74896b6752f8", "e943ab8544b4dcedc86dc933e60634a1"]
    assert [k.hex() for k in token_block_keys(toks, 8)] == expected
    assert [k.hex() for k in token_block_keys(np.arange(10, dtype=np.int32), 8)] == expected
    code = (
        "from engine.kv import token_block_keys;"
        "print(','.join(k.hex() for k in token_block_keys(list(range(10)), 8)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().split(",") == expected


def test_parent_changes_every_key() -> None:
    toks = list(range(16))
    assert set(token_block_keys(toks, 8)).isdisjoint(token_block_keys(toks, 8, parent=b"x" * 16))
    assert token_block_keys(toks, 8, parent=ROOT) == token_block_keys(toks, 8)


def test_id_keys_use_ids_for_full_blocks_and_tag_the_partial_last_block() -> None:
    assert id_block_keys([5, 6, 7], 20, 8) == [5, 6, (7, 4)]
    assert id_block_keys([5, 6], 16, 8) == [5, 6]
    assert id_block_keys([5], 20, 8) == [5]  # ids for a prefix only


def test_chained_id_keys_depend_on_the_whole_chain() -> None:
    a = id_block_keys([1, 2, 3], 24, 8, chained=True)
    b = id_block_keys([9, 2, 3], 24, 8, chained=True)
    c = id_block_keys([1, 2, 3], 24, 8, chained=True)
    assert a == c and all(x != y for x, y in zip(a, b, strict=True))


def test_more_ids_than_blocks_is_an_input_error_naming_the_source() -> None:
    with pytest.raises(InputError) as err:
        id_block_keys([1, 2, 3], 16, 8, source="trace.jsonl:12")
    msg = str(err.value)
    assert "trace.jsonl:12" in msg and "hash_ids" in msg and "at most one hash id per block" in msg


# -- trace block ids mapped onto another block size ------------------------------------------
def mooncake_ids(tokens: list[int], tb: int, ids: dict[tuple[int, ...], int]) -> list[int]:
    """Prefix-unique ids as Mooncake assigns them: one per started trace block, naming the whole
    prefix up to that block's end (a partial last block names a shorter prefix)."""
    return [
        ids.setdefault(tuple(tokens[: min((t + 1) * tb, len(tokens))]), len(ids))
        for t in range(num_blocks(len(tokens), tb))
    ]


@given(
    a=st.lists(st.integers(0, 1), max_size=48),
    b=st.lists(st.integers(0, 1), max_size=48),
    bt=st.sampled_from([2, 4, 8, 16]),
    tb=st.sampled_from([4, 8]),
)
def test_trace_keys_name_prefix_content(a: list[int], b: list[int], bt: int, tb: int) -> None:
    ids: dict[tuple[int, ...], int] = {}
    ka = trace_block_keys(mooncake_ids(a, tb, ids), len(a), bt, tb)
    kb = trace_block_keys(mooncake_ids(b, tb, ids), len(b), bt, tb)
    assert len(ka) == len(a) // bt and len(kb) == len(b) // bt  # full blocks only
    for k in range(min(len(ka), len(kb))):
        end = (k + 1) * bt
        t = (end - 1) // tb
        same = a[:end] == b[:end]
        if ka[k] == kb[k]:
            assert same  # sound: equal keys only for equal prefixes
        # complete where the trace block holding the end is named the same way in both
        full = min(len(a), (t + 1) * tb) == min(len(b), (t + 1) * tb)
        if same and full and a[: (t + 1) * tb] == b[: (t + 1) * tb]:
            assert ka[k] == kb[k]


def test_trace_keys_for_smaller_equal_and_larger_blocks() -> None:
    assert trace_block_keys([5, 6, 7], 1100, 256, 512) == [(5, 256), (5, 512), (6, 256), (6, 512)]
    assert trace_block_keys([5, 6], 1024, 512, 512) == [(5, 512), (6, 512)]
    assert trace_block_keys([5, 6, 7, 8], 1100, 512, 256) == [(6, 256), (8, 256)]
    assert trace_block_keys([5], 1100, 16, 512) == [(5, e) for e in range(16, 513, 16)]
    assert trace_block_keys([], 1100, 16, 512) == []
    with pytest.raises(InputError, match="at most one hash id per trace block"):
        trace_block_keys([1, 2, 3], 1024, 16, 512, source="t.jsonl:3")


def test_shared_prefix_is_what_allocate_then_shares() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=4)
    a.allocate("x", 40, hash_ids=[1, 2, 3, 4, 5])
    assert a.shared_prefix(24, [1, 2, 9]) == a.block_table("x")[:2]
    a.free("x")  # cached blocks are shared too
    before = a.shared_prefix(40, [1, 2, 3, 4])
    a.allocate("y", 40, hash_ids=[1, 2, 3, 4])
    assert before == a.block_table("y")[:4] and a.refcount(before[0]) == 1
