"""Content keys of KV blocks: chained, deterministic, equal exactly for equal prefixes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.kv import ROOT, id_block_keys, num_blocks, token_block_keys

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
