"""Each real tier: bytes in == bytes out, deletes, misses, names, no aliasing of the input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.tiers import (
    DeviceTier,
    HostTier,
    ObjectStoreTier,
    SsdTier,
    Tier,
    TierMiss,
    as_host_bytes,
    check_name,
)

KINDS = ("object", "ssd", "host", "device")


def make(kind: str, root: Path) -> Tier:
    if kind == "object":
        return ObjectStoreTier(root / "objects")
    if kind == "ssd":
        return SsdTier(root / "ssd")
    if kind == "host":
        return HostTier()
    return DeviceTier()


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_bytes_and_arrays(kind: str, tmp_path: Path) -> None:
    tier = make(kind, tmp_path)
    rng = np.random.default_rng(3)
    payload = rng.integers(0, 256, size=10_001, dtype=np.uint8)
    tier.put("m/v1/00000001.chunk", payload)
    tier.put("m/v1/00000002.chunk", b"hello")
    floats = rng.standard_normal(17).astype(np.float32)
    tier.put("floats", floats)
    assert np.array_equal(tier.get_host("m/v1/00000001.chunk"), payload)
    assert tier.get_host("m/v1/00000002.chunk").tobytes() == b"hello"
    assert tier.get_host("floats").view(np.float32).tolist() == floats.tolist()
    assert tier.names() == ["floats", "m/v1/00000001.chunk", "m/v1/00000002.chunk"]
    # the tier holds a copy: changing the caller's array afterwards changes nothing
    payload[:10] = 0
    assert not np.array_equal(tier.get_host("m/v1/00000001.chunk")[:10], payload[:10])


@pytest.mark.parametrize("kind", KINDS)
def test_overwrite_delete_and_miss(kind: str, tmp_path: Path) -> None:
    tier = make(kind, tmp_path)
    assert tier.names() == []
    tier.put("a", b"one")
    tier.put("a", b"second")
    assert tier.get_host("a").tobytes() == b"second"
    assert tier.exists("a")
    assert tier.delete("a") is True
    assert tier.delete("a") is False
    assert not tier.exists("a")
    with pytest.raises(TierMiss, match="'a'"):
        tier.get("a")


@pytest.mark.parametrize("kind", KINDS)
def test_empty_object(kind: str, tmp_path: Path) -> None:
    tier = make(kind, tmp_path)
    tier.put("empty", b"")
    assert tier.get_host("empty").size == 0


def test_memory_tiers_count_bytes() -> None:
    host = HostTier()
    host.put("a", b"x" * 10)
    host.put("b", b"y" * 5)
    host.put("a", b"z" * 3)
    assert host.nbytes == 8
    host.delete("b")
    assert host.nbytes == 3


def test_device_arena_is_separate_from_host() -> None:
    host, dev = HostTier(), DeviceTier()
    host.put("k", b"abc")
    dev.put("k", host.get("k"))
    assert not np.shares_memory(host.get("k"), dev.get("k"))


def test_constructors_do_no_io(tmp_path: Path) -> None:
    SsdTier(tmp_path / "ssd")
    ObjectStoreTier(tmp_path / "objects")
    assert list(tmp_path.iterdir()) == []


def test_ssd_is_plain_files(tmp_path: Path) -> None:
    ssd = SsdTier(tmp_path)
    ssd.put("x/y.bin", b"\x01\x02")
    assert (tmp_path / "x" / "y.bin").read_bytes() == b"\x01\x02"
    assert ssd.names() == ["x/y.bin"]  # no temporary files left behind


def test_object_store_fsspec_url() -> None:
    store = ObjectStoreTier("memory://pdsim-test-objects")
    store.put("m/c0", b"via fsspec")
    assert store.get_host("m/c0").tobytes() == b"via fsspec"
    assert store.names() == ["m/c0"]
    assert store.delete("m/c0")


def test_object_store_unknown_protocol_is_input_error() -> None:
    store = ObjectStoreTier("nosuchprotocol://bucket/x")
    with pytest.raises(InputError, match="nosuchprotocol"):
        store.put("a", b"1")


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "../up", "a/./b", "sp ace", "a/"])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(InputError, match="not allowed"):
        check_name(bad)


@given(st.binary(max_size=2000))
def test_as_host_bytes_preserves_content(data: bytes) -> None:
    assert as_host_bytes(data).tobytes() == data
    assert as_host_bytes(np.frombuffer(data, dtype=np.uint8).copy()).tobytes() == data


@pytest.mark.gpu
def test_gpu_tiers_round_trip() -> None:
    from engine.backend import get_backend

    xp = get_backend("cupy")
    host, dev = HostTier(xp=xp), DeviceTier(xp=xp)
    assert host.pinned and dev.on_gpu
    payload = np.arange(4096, dtype=np.uint32).view(np.uint8)
    host.put("p", payload)
    dev.put("p", host.get("p"))  # host -> device
    dev.put("q", dev.get("p"))  # device -> device
    assert np.array_equal(dev.get_host("q"), payload)  # device -> host
