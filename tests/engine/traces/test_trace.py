"""The Trace model: dense ids, working-set size, colours, head."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.traces import NO_COLOR, Trace, dense_ids


def reference_dense(keys: list[object]) -> list[int]:
    ids: dict[object, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


@given(st.lists(st.integers(-(2**62), 2**62) | st.sampled_from([3, 5, 7])))
def test_dense_ids_of_ints_are_first_seen_order(keys: list[int]) -> None:
    arr = np.asarray(keys, dtype=np.int64)
    assert dense_ids(arr).tolist() == reference_dense(list(keys))


@given(st.lists(st.sampled_from(["x", "y", "zz", "w"])))
def test_dense_ids_of_strings(keys: list[str]) -> None:
    assert dense_ids(keys).tolist() == reference_dense(list(keys))


def make(n: int = 4) -> Trace:
    return Trace(
        time=np.arange(n, dtype=np.float64),
        key=np.array([0, 1, 0, 2][:n], dtype=np.int64),
        size=np.array([10, 20, 99, 5][:n], dtype=np.int64),
        color=np.array([0, NO_COLOR, 1, 0][:n], dtype=np.int32),
        color_names=("a", "b"),
    )


def test_unique_bytes_counts_each_key_once_at_its_first_size() -> None:
    assert make().unique_bytes() == 10 + 20 + 5
    assert make().n_objects == 3


def test_colors_and_head() -> None:
    tr = make()
    assert tr.colors() == ["a", None, "b", "a"]
    h = tr.head(2)
    assert len(h) == 2 and h.colors() == ["a", None] and h.size.tolist() == [10, 20]
    assert tr.head(10) is tr


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="size"):
        Trace(time=np.zeros(3), key=np.zeros(3, dtype=np.int64), size=np.zeros(2, dtype=np.int64))
