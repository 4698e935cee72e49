"""Chunk store: written once, every read verified, corruption re-fetched, missing chunks named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.chunks import MIN_CHUNK_BYTES, chunk_checksums
from engine.chunkstore import (
    ChunkCorrupt,
    ChunkMissing,
    ChunkStore,
    Manifest,
    chunk_name,
    layer_weights,
    load_manifest,
    manifest_name,
    scale_layer_bytes,
    write_model,
)
from engine.errors import InputError
from engine.tiers import ObjectStoreTier, make_stack

CB = MIN_CHUNK_BYTES  # 256 KiB chunks keep the test model small
LAYERS = [2 * CB + 1000, 3 * CB, 0, CB // 2]  # a layer of zero bytes has no chunks
MODEL = "tiny"


def setup(tmp_path: Path, **caps: int) -> tuple[ObjectStoreTier, ChunkStore]:
    store = ObjectStoreTier(tmp_path / "objects")
    manifest = write_model(store, MODEL, LAYERS, seed=11, chunk_bytes=CB)
    stack = make_stack(
        store,
        device_bytes=caps.get("device", 2 * CB),
        host_bytes=caps.get("host", 4 * CB),
        ssd_dir=tmp_path / "ssd",
        ssd_bytes=caps.get("ssd", 64 * CB),
        policy="lru",
    )
    return store, ChunkStore(manifest, stack)


def chunk_file(tmp_path: Path, where: str, cid: int) -> Path:
    return tmp_path / where / chunk_name(MODEL, 1, cid)


def flip(path: Path, offset: int = 1234) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_manifest_records_version_sizes_and_checksums(tmp_path: Path) -> None:
    store, cs = setup(tmp_path)
    m = load_manifest(store, MODEL, 1)
    assert m == cs.manifest
    assert m.version == 1 and m.dtype == "float16"
    assert [c.size for c in m.chunks] == [CB, CB, 1000, CB, CB, CB, CB // 2]
    assert [c.layer for c in m.chunks] == [0, 0, 0, 1, 1, 1, 3]
    for rec in m.chunks:
        data = store.get_host(chunk_name(MODEL, 1, rec.id))
        assert chunk_checksums(data) == (rec.crc32c, rec.sha256)
    raw = json.loads(store.get_host(manifest_name(MODEL, 1)).tobytes())
    assert {"crc32c", "sha256", "size", "layer", "id"} == set(raw["chunks"][0])


def test_weights_are_deterministic_and_layer_bytes_match(tmp_path: Path) -> None:
    _, cs = setup(tmp_path)
    for layer in (0, 1, 3):
        got = np.concatenate(cs.read_layer(layer, now=float(layer)))
        assert np.array_equal(got, cs.expected_layer(layer))
    w = layer_weights(11, 4, 1, 3 * CB, "float16").view(np.float16)
    assert np.isfinite(w).all() and 0.01 < float(np.std(w.astype(np.float32))) < 0.03
    assert not np.array_equal(layer_weights(12, 4, 1, 64, "float16"), w.view(np.uint8)[:64])


def test_written_once(tmp_path: Path) -> None:
    store = ObjectStoreTier(tmp_path / "o")
    m1 = write_model(store, MODEL, LAYERS, seed=11, chunk_bytes=CB)
    f = tmp_path / "o" / chunk_name(MODEL, 1, 0)
    mtime = f.stat().st_mtime_ns
    f.write_bytes(b"marker")  # a second call with the same inputs must not rewrite
    m2 = write_model(store, MODEL, LAYERS, seed=11, chunk_bytes=CB)
    assert m1 == m2 and f.read_bytes() == b"marker"
    assert f.stat().st_mtime_ns != mtime
    m3 = write_model(store, MODEL, LAYERS, seed=12, chunk_bytes=CB)  # other inputs: rewritten
    assert m3.chunks[0].sha256 != m1.chunks[0].sha256
    assert chunk_checksums(f.read_bytes()) == (m3.chunks[0].crc32c, m3.chunks[0].sha256)


def test_corrupt_object_store_chunk_is_detected_and_refetched(tmp_path: Path) -> None:
    """A flipped byte in the object store: the first read is bad, the retry is re-read from
    the object store; with the file still bad and no replica, nothing is served."""
    _, cs = setup(tmp_path)
    flip(chunk_file(tmp_path, "objects", 4))
    with pytest.raises(ChunkCorrupt, match=r"chunk 4 .*layer 1"):
        cs.read_chunk(4, now=0.0)
    assert cs.stack.where(cs.key(4)) == []  # bad bytes reached no tier
    assert cs.stack.corrupt_found["object_store"] == 2


def test_corrupt_object_store_chunk_repaired_from_replica(tmp_path: Path) -> None:
    store = ObjectStoreTier(tmp_path / "objects")
    replica = ObjectStoreTier(tmp_path / "replica", name="replica")
    m = write_model(store, MODEL, LAYERS, seed=11, chunk_bytes=CB)
    write_model(replica, MODEL, LAYERS, seed=11, chunk_bytes=CB)
    cs = ChunkStore(m, make_stack(store, device_bytes=2 * CB, replicas=[replica]))
    flip(chunk_file(tmp_path, "objects", 1))
    r = cs.read_chunk(1, now=0.0)
    assert r.corrupt == 2 and r.source == "object_store"
    assert chunk_checksums(r.data) == (m.chunks[1].crc32c, m.chunks[1].sha256)
    # the object store was repaired from the replica
    assert chunk_checksums(chunk_file(tmp_path, "objects", 1).read_bytes())[1] == m.chunks[1].sha256


def test_corrupt_ssd_chunk_is_detected_and_refetched(tmp_path: Path) -> None:
    _, cs = setup(tmp_path, device=CB, host=CB)
    cs.read_chunk(0, now=0.0)
    cs.read_chunk(1, now=1.0)  # 0 leaves device and host, stays in the ssd
    assert cs.stack.where(cs.key(0)) == ["ssd"]
    flip(chunk_file(tmp_path, "ssd", 0), offset=7)
    r = cs.read_chunk(0, now=2.0)
    assert r.source == "object_store" and r.corrupt == 1
    assert np.array_equal(r.data, cs.expected_layer(0)[:CB])
    assert cs.stack.corrupt_found == {"ssd": 1}
    assert chunk_checksums(chunk_file(tmp_path, "ssd", 0).read_bytes())[1] == (
        cs.manifest.chunks[0].sha256
    )


def test_truncated_ssd_chunk_is_not_served(tmp_path: Path) -> None:
    _, cs = setup(tmp_path, device=CB, host=CB)
    cs.read_chunk(3, now=0.0)
    cs.read_chunk(4, now=1.0)
    path = chunk_file(tmp_path, "ssd", 3)
    path.write_bytes(path.read_bytes()[:-1])
    r = cs.read_chunk(3, now=2.0)
    assert r.source == "object_store" and r.corrupt == 1 and r.data.size == CB


def test_missing_chunk_names_it(tmp_path: Path) -> None:
    _, cs = setup(tmp_path)
    chunk_file(tmp_path, "objects", 5).unlink()
    with pytest.raises(ChunkMissing) as info:
        cs.read_chunk(5, now=0.0)
    msg = str(info.value)
    assert "chunk 5" in msg and "layer 1" in msg and "'tiny'" in msg
    assert chunk_name(MODEL, 1, 5) in msg
    assert isinstance(info.value, InputError)


def test_missing_manifest_and_bad_manifest(tmp_path: Path) -> None:
    store = ObjectStoreTier(tmp_path / "o")
    with pytest.raises(ChunkMissing, match="'nomodel' version 3 has no manifest"):
        load_manifest(store, "nomodel", 3)
    store.put(manifest_name("bad", 1), b'{"model": "bad"}')
    with pytest.raises(InputError, match="manifest keys"):
        load_manifest(store, "bad", 1)
    with pytest.raises(InputError, match="line 1"):
        Manifest.from_json("{", "x.json")


def test_out_of_range_chunk_id(tmp_path: Path) -> None:
    _, cs = setup(tmp_path)
    with pytest.raises(InputError, match=r"allowed: 0\.\.6"):
        cs.read_chunk(7, now=0.0)


def test_scale_layer_bytes() -> None:
    assert scale_layer_bytes([1000, 0, 3], 0.1, 2) == [100, 0, 2]
    assert scale_layer_bytes([4096], 1.0, 4) == [4096]
    with pytest.raises(InputError, match="0 < scale <= 1"):
        scale_layer_bytes([10], 0.0, 2)
    with pytest.raises(InputError, match="multiples"):
        write_model(ObjectStoreTier("memory://cs-bad"), "m", [3], seed=0, chunk_bytes=CB)


def test_cache_decisions_follow_chunk_keys(tmp_path: Path) -> None:
    """Reads of layers in order, twice: with a device holding 2 chunks, LRU, and 7 chunks,
    the second pass misses everywhere on the device and hits the host for the last chunks."""
    _, cs = setup(tmp_path, device=2 * CB, host=4 * CB)
    for t in range(2):
        for layer in (0, 1, 3):
            cs.read_layer(layer, now=float(t * 10 + layer))
    dev, host, ssd = (lvl.cache.stats for lvl in cs.stack.levels)
    assert dev.hits == 0 and dev.misses == 14
    assert ssd.misses == 7 and ssd.hits == 14 - 7 - host.hits
    assert cs.stack.bytes_moved["object_store->ssd"] == sum(LAYERS)
    cs.stack.check()


@pytest.mark.gpu
def test_chunks_reach_gpu_memory_verified(tmp_path: Path) -> None:
    from engine.backend import get_backend, to_numpy

    xp = get_backend("cupy")
    store = ObjectStoreTier(tmp_path / "objects")
    m = write_model(store, MODEL, LAYERS, seed=11, chunk_bytes=CB)
    stack = make_stack(
        store, device_bytes=2 * CB, host_bytes=4 * CB, ssd_dir=tmp_path / "ssd",
        ssd_bytes=64 * CB, xp=xp,
    )  # fmt: skip
    cs = ChunkStore(m, stack)
    r = cs.read_chunk(0, now=0.0)
    assert not isinstance(r.data, np.ndarray)  # a CuPy array on the device
    assert np.array_equal(to_numpy(r.data), cs.expected_layer(0)[:CB])
    flip(chunk_file(tmp_path, "objects", 3))
    with pytest.raises(ChunkCorrupt):
        cs.read_chunk(3, now=1.0)
