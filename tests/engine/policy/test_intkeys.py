"""``int_key_range``: which key batches index state directly, against a plain-Python model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.policy.intkeys import int_key_range

values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.text(max_size=2),
    st.floats(allow_nan=False),
    st.tuples(st.integers(0, 3)),
)


@given(keys=st.lists(values, max_size=30))
def test_lists_qualify_when_every_key_is_a_plain_int(keys: list[Any]) -> None:
    got = int_key_range(keys)
    if any(type(k) is not int for k in keys):
        assert got is None
        return
    assert got is not None
    seq, lo, hi = got
    assert list(seq) == keys
    assert (lo, hi) == ((min(keys), max(keys)) if keys else (0, -1))


def test_iterators_are_read_once_into_a_sequence() -> None:
    got = int_key_range(iter([3, 1, 2]))
    assert got is not None and list(got[0]) == [3, 1, 2] and got[1:] == (1, 3)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", ">i8", "uint64"])
@pytest.mark.parametrize("as_view", [False, True])
@given(data=st.lists(st.integers(0, 120), max_size=20))
def test_integer_arrays_and_views_yield_python_ints(
    dtype: str, as_view: bool, data: list[int]
) -> None:
    arr = np.array(data, dtype=dtype)
    got = int_key_range(arr.data if as_view else arr)
    assert got is not None
    seq, lo, hi = got
    assert [type(k) for k in seq] == [int] * len(data)
    assert list(seq) == data
    assert (lo, hi) == ((min(data), max(data)) if data else (0, -1))


@pytest.mark.parametrize(
    "keys",
    [
        np.array([1.0, 2.0]),
        np.array([True, False]),
        np.zeros((2, 2), dtype=np.int64),
        np.array([1.0]).data,
    ],
)
def test_other_arrays_do_not_qualify(keys: Any) -> None:
    assert int_key_range(keys) is None
