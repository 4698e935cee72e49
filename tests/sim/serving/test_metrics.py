"""Tests for sim.serving.metrics.TraceRecorder: the trace hash is blake2b over the packed records."""

from __future__ import annotations

import hashlib
import struct

from hypothesis import given
from hypothesis import strategies as st

from sim.serving.metrics import TraceRecorder

_REC = struct.Struct("<dBqq")

records = st.lists(
    st.tuples(
        st.floats(0.0, 1e6, allow_nan=False),
        st.integers(0, 7),
        st.integers(-(2**40), 2**40),
        st.integers(0, 2**40),
        st.booleans(),  # take a digest right after this record
    ),
    max_size=60,
)


@given(records=records, repeat=st.sampled_from([1, 150]))
def test_digest_is_blake2b_of_concatenated_records(records, repeat) -> None:
    """Digests taken at any point (also across the internal batching threshold) equal a
    one-shot blake2b of every record packed so far; recording continues after a digest."""
    tr = TraceRecorder()
    ref = hashlib.blake2b(digest_size=16)
    n = 0
    for _ in range(repeat):
        for t, kind, a, b, probe in records:
            tr.rec(t, kind, a, b)
            ref.update(_REC.pack(t, kind, a, b))
            n += 1
            if probe:
                assert tr.hexdigest() == ref.hexdigest()
    assert tr.count == n
    assert tr.hexdigest() == ref.hexdigest()


def test_order_matters_and_default_b_is_zero() -> None:
    x, y = TraceRecorder(), TraceRecorder()
    x.rec(1.0, 1, 2)
    x.rec(2.0, 1, 3, 0)
    y.rec(2.0, 1, 3)
    y.rec(1.0, 1, 2, 0)
    assert x.hexdigest() != y.hexdigest()
    z = TraceRecorder()
    z.rec(1.0, 1, 2, 0)
    z.rec(2.0, 1, 3)
    assert z.hexdigest() == x.hexdigest()
