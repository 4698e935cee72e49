"""The tier stack: reads go down and promote, evictions demote, bad bytes are never served."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache import TierCache
from engine.tiers import (
    DeviceTier,
    HostTier,
    Level,
    ObjectCorrupt,
    ObjectMissing,
    ObjectStoreTier,
    SsdTier,
    TierStack,
)

SIZE = 1000


def payload(i: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, size=size, dtype=np.uint8)


def cache(
    name: str, n_objects: int, policy: str = "lru", params: dict[str, int] | None = None
) -> TierCache:
    return TierCache(
        n_objects * SIZE, policy, params or {}, high_watermark=1.0, low_watermark=1.0, name=name
    )


def build(
    root: Path,
    dev: int = 2,
    host: int = 3,
    ssd: int = 4,
    n: int = 10,
    replicas: int = 0,
    dev_policy: tuple[str, dict[str, int]] = ("lru", {}),
) -> tuple[TierStack, dict[int, str]]:
    """A 3-level stack over an object store holding objects 0..n-1; returns it and the
    SHA-256 of each object (what the validator checks against)."""
    store = ObjectStoreTier(root / "objects")
    digests = {}
    reps = [ObjectStoreTier(root / f"replica{r}", name=f"replica{r}") for r in range(replicas)]
    for i in range(n):
        data = payload(i)
        digests[i] = hashlib.sha256(data).hexdigest()
        store.put(f"{i:08d}", data)
        for rep in reps:
            rep.put(f"{i:08d}", data)

    def valid(key: object, data: np.ndarray) -> bool:
        assert isinstance(key, int)
        return hashlib.sha256(data).hexdigest() == digests[key]

    levels = [
        Level(DeviceTier(), cache("device", dev, *dev_policy)),
        Level(HostTier(), cache("host", host)),
        Level(SsdTier(root / "ssd"), cache("ssd", ssd), verify=True),
    ]
    return TierStack(levels, store, replicas=reps, validator=valid), digests


def test_miss_fetches_from_backing_and_promotes_everywhere(tmp_path: Path) -> None:
    stack, _ = build(tmp_path)
    r = stack.read(0, SIZE, now=0.0)
    assert (r.level, r.source, r.corrupt) == (3, "object_store", 0)
    assert np.array_equal(r.data, payload(0))
    assert stack.where(0) == ["device", "host", "ssd"]
    assert stack.bytes_moved == {
        "object_store->ssd": SIZE,
        "ssd->host": SIZE,
        "host->device": SIZE,
    }
    r = stack.read(0, SIZE, now=1.0)
    assert r.level == 0
    assert [lvl.cache.stats.hits for lvl in stack.levels] == [1, 0, 0]
    assert [lvl.cache.stats.misses for lvl in stack.levels] == [1, 1, 1]
    stack.check()


def test_eviction_demotes_to_next_tier(tmp_path: Path) -> None:
    stack, _ = build(tmp_path, dev=2, host=2, ssd=10)
    for t, k in enumerate([0, 1, 2]):  # device holds 2: reading 2 evicts 0 (LRU)
        stack.read(k, SIZE, now=float(t))
    assert stack.where(0) == ["ssd"]  # host (2 objects) evicted 0 as well when 2 arrived
    assert stack.where(2) == ["device", "host", "ssd"]
    # a hit in the ssd promotes back; the device's victim (1) is already in the host (no
    # copy), then the host's own LRU victim is 1 too, which the ssd still holds
    r = stack.read(0, SIZE, now=5.0)
    assert r.level == 2 and r.source == "ssd"
    assert stack.where(0) == ["device", "host", "ssd"]
    assert stack.where(1) == ["ssd"]
    assert stack.where(2) == ["device", "host", "ssd"]
    assert "device->host" not in stack.bytes_moved
    stack.check()


def test_demotion_into_lower_tier_that_lacks_the_object(tmp_path: Path) -> None:
    """An object promoted into the device only (host full of pinned data) is demoted to the
    host when the device evicts it."""
    store = ObjectStoreTier(tmp_path / "o")
    for i in range(3):
        store.put(f"{i:08d}", payload(i))
    dev = Level(DeviceTier(), cache("device", 1))
    host = Level(HostTier(), cache("host", 2))
    stack = TierStack([dev, host], store)
    stack.read(0, SIZE, 0.0)
    host.cache.remove(0, 0.5)
    host.tier.delete("00000000")
    stack.read(1, SIZE, 1.0)  # device evicts 0 -> demoted into the host
    assert stack.where(0) == ["host"]
    assert np.array_equal(host.tier.get("00000000"), payload(0))
    assert stack.bytes_moved["device->host"] == SIZE
    stack.check()


def test_top_level_decisions_equal_a_plain_tier_cache(tmp_path: Path) -> None:
    """The stack's device cache makes the same hit/miss/eviction decisions as a TierCache
    driven by `access` with the same keys and `now` values (the simulator's view)."""
    stack, _ = build(tmp_path, dev=3, host=5, ssd=8, n=12, dev_policy=("lru-k", {"k": 2}))
    ref = TierCache(3 * SIZE, "lru-k", {"k": 2}, high_watermark=1.0, low_watermark=1.0)
    ref_evicted: list[object] = []
    ref.on_evict = lambda k, s, c: ref_evicted.append(k)
    seq = np.random.default_rng(7).zipf(1.3, size=300) % 12
    hits, ref_hits = [], []
    for t, k in enumerate(seq.tolist()):
        hits.append(stack.read(k, SIZE, now=float(t)).level == 0)
        ref_hits.append(ref.access(k, SIZE, now=float(t)))
    assert hits == ref_hits
    assert sorted(stack.levels[0].cache) == sorted(ref)
    assert stack.levels[0].cache.stats.evictions == ref.stats.evictions == len(ref_evicted)


def flip_byte(path: Path, offset: int = 17) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_corrupt_ssd_copy_is_detected_and_refetched(tmp_path: Path) -> None:
    stack, _ = build(tmp_path, dev=1, host=1, ssd=4)
    stack.read(0, SIZE, 0.0)
    stack.read(1, SIZE, 1.0)  # 0 now only in the ssd
    assert stack.where(0) == ["ssd"]
    flip_byte(tmp_path / "ssd" / "00000000")
    r = stack.read(0, SIZE, 2.0)
    assert r.source == "object_store" and r.corrupt == 1
    assert np.array_equal(r.data, payload(0))
    assert stack.corrupt_found == {"ssd": 1}
    ssd = stack.levels[2]
    assert np.array_equal(ssd.tier.get("00000000"), payload(0))  # repaired by the promotion
    assert ssd.cache.stats.misses == 3  # the bad copy counted as a miss, not a hit
    stack.check()


def test_corrupt_object_store_copy_is_reread_from_replica_and_repaired(tmp_path: Path) -> None:
    stack, _ = build(tmp_path, replicas=1)
    flip_byte(tmp_path / "objects" / "00000003")
    r = stack.read(3, SIZE, 0.0)
    assert np.array_equal(r.data, payload(3))
    assert r.corrupt == 2  # original read + one retry
    assert (tmp_path / "objects" / "00000003").read_bytes() == payload(3).tobytes()


def test_all_copies_corrupt_serves_nothing(tmp_path: Path) -> None:
    stack, _ = build(tmp_path)
    flip_byte(tmp_path / "objects" / "00000004")
    with pytest.raises(ObjectCorrupt, match="00000004"):
        stack.read(4, SIZE, 0.0)
    assert stack.where(4) == []  # nothing admitted anywhere
    stack.check()


def test_missing_object_names_it(tmp_path: Path) -> None:
    stack, _ = build(tmp_path, n=2)
    with pytest.raises(ObjectMissing, match="00000009"):
        stack.read(9, SIZE, 0.0)


def test_pin_keeps_object_on_device(tmp_path: Path) -> None:
    stack, _ = build(tmp_path, dev=1)
    stack.read(0, SIZE, 0.0, pin=True)
    stack.read(1, SIZE, 1.0)  # device full of a pinned object: 1 is not admitted there
    assert stack.where(0)[0] == "device"
    assert "device" not in stack.where(1)
    stack.unpin(0)
    stack.read(1, SIZE, 2.0)
    assert stack.where(1)[0] == "device"
    stack.check()


@settings(max_examples=40)
@given(
    seq=st.lists(st.integers(0, 7), min_size=1, max_size=60),
    caps=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6)),
    policy=st.sampled_from(["lru", "fifo", "lru-k", "arc"]),
)
def test_random_reads_serve_exact_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    seq: list[int],
    caps: tuple[int, int, int],
    policy: str,
) -> None:
    root = tmp_path_factory.mktemp("stack")
    store = ObjectStoreTier(root / "o")
    for i in range(8):
        store.put(f"{i:08d}", payload(i))
    levels = [
        Level(DeviceTier(), cache("device", caps[0], policy)),
        Level(HostTier(), cache("host", caps[1], policy)),
        Level(SsdTier(root / "s"), cache("ssd", caps[2], policy)),
    ]
    stack = TierStack(levels, store)
    for t, k in enumerate(seq):
        before = stack.where(k)
        r = stack.read(k, SIZE, float(t))
        assert np.array_equal(r.data, payload(k))
        names = [lv.tier.name for lv in levels]
        assert r.level == (names.index(before[0]) if before else 3)
        assert stack.where(k)[0] == "device"
        stack.check()
    for lvl in levels:
        s = lvl.cache.stats
        assert lvl.cache.used <= lvl.cache.capacity
        assert s.hits + s.misses <= len(seq)
