"""Stateful test of the tier stack against a reference model of the bytes.

The reference is just the truth: object ``k`` must always read back as ``payload(k)``. The
machine reads (counted and prefetch), corrupts or deletes SSD copies, corrupts the object
store's copy (a clean replica exists), and invalidates keys; after every step the stack's
caches and tiers agree, no capacity is exceeded, and every read returned the true bytes.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine.tiers import ObjectStoreTier, make_stack

N, SIZE = 4, 512


def payload(k: int) -> np.ndarray:
    return np.random.default_rng(100 + k).integers(0, 256, size=SIZE, dtype=np.uint8)


DIGESTS = {k: hashlib.sha256(payload(k)).hexdigest() for k in range(N)}
keys = st.integers(0, N - 1)


class StackMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="pdsim-stack-"))
        store = ObjectStoreTier(self.root / "objects")
        replica = ObjectStoreTier(self.root / "replica", name="replica")
        for k in range(N):
            store.put(f"{k:08d}", payload(k))
            replica.put(f"{k:08d}", payload(k))
        self.stack = make_stack(
            store,
            device_bytes=SIZE,
            host_bytes=SIZE,
            ssd_dir=self.root / "ssd",
            ssd_bytes=3 * SIZE,
            policy="lru-k",
            policy_params={"k": 2},
            replicas=[replica],
        )
        self.stack.validator = lambda key, data: hashlib.sha256(data).hexdigest() == DIGESTS[key]
        self.counted = 0
        self.t = 0.0

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _now(self) -> float:
        self.t += 1.0
        return self.t

    @rule(k=keys, count=st.booleans())
    def read(self, k: int, count: bool) -> None:
        r = self.stack.read(k, SIZE, self._now(), count=count)
        assert np.array_equal(np.asarray(r.data), payload(k))
        assert self.stack.where(k)[0] == "device"
        self.counted += count

    @rule(k=keys)
    def corrupt_ssd_copy(self, k: int) -> None:
        path = self.root / "ssd" / f"{k:08d}"
        if path.exists():
            raw = bytearray(path.read_bytes())
            raw[k] ^= 0x80
            path.write_bytes(bytes(raw))

    @rule(k=keys)
    def delete_ssd_copy(self, k: int) -> None:
        (self.root / "ssd" / f"{k:08d}").unlink(missing_ok=True)

    @rule(k=keys)
    def corrupt_object_store_copy(self, k: int) -> None:
        path = self.root / "objects" / f"{k:08d}"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x01
        path.write_bytes(bytes(raw))

    @rule(k=keys)
    def invalidate(self, k: int) -> None:
        self.stack.invalidate(k, self._now())
        assert self.stack.where(k) == []

    @invariant()
    def caches_match_tiers(self) -> None:
        ssd = self.stack.levels[2]
        # a deleted or corrupted SSD file is only noticed on the next read of that key
        on_disk = set(ssd.tier.names())
        assert on_disk <= {f"{k:08d}" for k in ssd.cache}
        for lvl in self.stack.levels[:2]:
            assert sorted(f"{k:08d}" for k in lvl.cache) == lvl.tier.names()
        for lvl in self.stack.levels:
            assert lvl.cache.used <= lvl.cache.capacity
        assert self.stack.levels[0].cache.stats.lookups == self.counted


TestStackMachine = StackMachine.TestCase
TestStackMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
