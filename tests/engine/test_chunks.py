"""Tests for engine.chunks: chunk sizes, layer/head boundaries, keys, checksums."""

from __future__ import annotations

import hashlib

import crc32c
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.chunks import (
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    chunk_checksums,
    chunk_model,
)

KiB = 1024
MiB = 1024 * KiB


@given(
    layer_bytes=st.lists(st.integers(0, 40 * MiB), min_size=1, max_size=12),
    chunk_bytes=st.integers(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES),
    sharding=st.sampled_from(["layer", "layer-head", "layer-head-seq"]),
    heads=st.integers(1, 8),
)
def test_chunk_invariants(layer_bytes, chunk_bytes, sharding, heads) -> None:
    t = chunk_model("m", layer_bytes, chunk_bytes, sharding=sharding, heads=heads)
    assert t.n_layers == len(layer_bytes)
    assert int(t.size.sum()) == sum(layer_bytes) == t.total_bytes
    assert (t.size > 0).all() and (t.size <= chunk_bytes).all()
    assert t.layer.dtype == np.int32 and t.size.dtype == np.int64
    ids = []
    for li, nbytes in enumerate(layer_bytes):
        sl = t.layer_slice(li)
        ids.extend(sl)
        assert (t.layer[sl.start : sl.stop] == li).all()  # never spans layers
        assert int(t.size[sl.start : sl.stop].sum()) == nbytes == t.layer_bytes(li)
        # offsets inside the layer are contiguous from 0
        if len(sl):
            offs = t.offset[sl.start : sl.stop]
            assert offs[0] == 0
            assert (offs[1:] == np.cumsum(t.size[sl.start : sl.stop])[:-1]).all()
        if sharding != "layer":
            groups = t.head[sl.start : sl.stop]
            assert (np.diff(groups) >= 0).all()  # head groups in order, each contiguous
            # each head group's bytes differ by at most one from the even split
            per_group = [int(t.size[sl.start : sl.stop][groups == g].sum()) for g in range(heads)]
            assert sum(per_group) == nbytes
            assert max(per_group) - min(per_group) <= 1
    assert ids == list(range(t.n_chunks))
    assert (t.global_offset == np.concatenate([[0], np.cumsum(t.size)[:-1]])).all()


def test_layer_head_never_spans_head_groups() -> None:
    t = chunk_model("m", [10 * MiB], 4 * MiB, sharding="layer-head", heads=4)
    # 4 groups of 2.5 MiB each -> one chunk per group, none crossing a group boundary
    assert t.size.tolist() == [int(2.5 * MiB)] * 4
    assert t.head.tolist() == [0, 1, 2, 3]
    plain = chunk_model("m", [10 * MiB], 4 * MiB)
    assert plain.size.tolist() == [4 * MiB, 4 * MiB, 2 * MiB]
    assert plain.head.tolist() == [-1, -1, -1]


def test_resnet50_in_256k_chunks() -> None:
    t = chunk_model("resnet-50", [93 * MiB], 256 * KiB)
    assert t.n_chunks == 93 * 4
    assert t.chunk_bytes == 256 * KiB and t.version == 1


def test_chunk_bytes_range_enforced() -> None:
    for bad in (MIN_CHUNK_BYTES - 1, MAX_CHUNK_BYTES + 1):
        with pytest.raises(ValueError, match=r"256 KiB.*16 MiB"):
            chunk_model("m", [MiB], bad)
    assert chunk_model("m", [MiB]).chunk_bytes == DEFAULT_CHUNK_BYTES
    with pytest.raises(ValueError, match="sharding"):
        chunk_model("m", [MiB], sharding="rows")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        chunk_model("m", [-1])


def test_keys_unique_and_stable() -> None:
    a = chunk_model("a", [8 * MiB, 8 * MiB])
    b = chunk_model("b", [8 * MiB, 8 * MiB])
    keys = [a.key(i) for i in range(a.n_chunks)] + [b.key(i) for i in range(b.n_chunks)]
    assert len(set(keys)) == len(keys)
    assert a.key(3) == chunk_model("a", [1 * MiB] * 4).key(3)
    assert a.keys(a.layer_slice(1)) == [("a", 2), ("a", 3)]
    with pytest.raises(IndexError):
        a.key(a.n_chunks)
    with pytest.raises(IndexError):
        a.layer_slice(2)


def test_empty_layer_has_empty_slice() -> None:
    t = chunk_model("m", [MiB, 0, MiB], MIN_CHUNK_BYTES)
    assert len(t.layer_slice(1)) == 0
    assert t.layer_slice(2).start == 4


def test_checksums() -> None:
    data = b"pdsim chunk bytes" * 100
    crc, sha = chunk_checksums(data)
    assert crc == f"{crc32c.crc32c(data):08x}" and len(crc) == 8
    assert sha == hashlib.sha256(data).hexdigest()
    assert chunk_checksums(b"123456789")[0] == "e3069283"  # CRC-32C check value
    flipped = bytearray(data)
    flipped[5] ^= 1
    assert chunk_checksums(bytes(flipped)) != (crc, sha)
