"""Chunk integrity in the simulator (R28): CRC32C + SHA-256 per chunk, corruption, repair.

The simulator carries no weight bytes, so each chunk version is represented by a 64-byte
*content stand-in*: ``blake2b(model, chunk, version)``. Every chunk's expected checksums
(:func:`engine.chunks.chunk_checksums`, the same function the engine uses on real bytes) are
those of its stand-in. A ``corrupt`` fault flips bits of ONE parameter server's stored copy;
that copy's bytes then differ from the stand-in.

Every read of a chunk from a parameter server goes through :meth:`Integrity.check_read`, which
recomputes both checksums of the stored copy and compares them with the expected pair:

* match -> the copy is used;
* mismatch -> *detected*: the copy is never used (the directory tries another replica or the
  object store) and a repair starts (the server re-reads the chunk from the object store over
  its ``object`` link; when the transfer lands the copy is good again).

Counts: ``injected``, ``detected`` (injections whose corrupt copy was found, by a read or by
the final :meth:`Integrity.scrub`), ``cancelled`` (a later flip restored the original bytes),
``detections`` (reads refused), ``repaired`` (copies rewritten), ``used_corrupt`` (must stay 0; only a run with ``verify: false`` --
test-only -- can use a corrupt copy, which the checkers then report).
Invariant: a key is in ``bad`` exactly while that server's copy differs from the stand-in.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import simpy

from engine.chunks import chunk_checksums

if TYPE_CHECKING:
    from sim.control.runcheckers import Report
    from sim.serving.context import SimContext


def stand_in(key: int, version: int = 1) -> bytes:
    """The 64-byte content stand-in of chunk ``key`` at ``version``."""
    return hashlib.blake2b(f"{key}:{version}".encode(), digest_size=64).digest()


class Integrity:
    """Checksums, corrupt copies and repairs of one cluster; see the module docstring."""

    def __init__(self, ctx: SimContext, verify: bool = True) -> None:
        self.ctx = ctx
        self.verify = verify
        self._expected: dict[int, tuple[str, str]] = {}
        self.bad: dict[tuple[int, int], bytes] = {}
        self._repairing: set[tuple[int, int]] = set()
        self.injected = self.detected = self.detections = 0
        self.repaired = self.used_corrupt = self.scrubbed = self.cancelled = 0
        self._pending: dict[tuple[int, int], int] = {}  # injections not yet detected, per copy
        self.events: list[tuple[float, str, int, int]] = []
        #: ``report(prop, detail)`` of the run's checkers (set by the control plane)
        self.report: Report | None = None

    def expected(self, key: int) -> tuple[str, str]:
        e = self._expected.get(key)
        if e is None:
            e = self._expected[key] = chunk_checksums(stand_in(key))
        return e

    def stored(self, ps: int, key: int) -> bytes:
        """The bytes server ``ps`` holds for ``key`` (its corrupt copy, if any)."""
        return self.bad.get((ps, key)) or stand_in(key)

    def under_repair(self, ps: int, key: int) -> bool:
        return (ps, key) in self._repairing

    def corrupt(self, ps: int, key: int, bits: int, rng: np.random.Generator) -> bool:
        """Flip ``bits`` distinct random bits of server ``ps``'s copy of ``key``; False (and
        nothing done) while that copy is being repaired (the repair would overwrite it)."""
        if (ps, key) in self._repairing:
            return False
        data = bytearray(self.stored(ps, key))
        for b in rng.choice(len(data) * 8, size=bits, replace=False).tolist():
            data[b // 8] ^= 1 << (b % 8)
        self.injected += 1
        if bytes(data) == stand_in(key):  # flipped back to the original: nothing is corrupt
            self.bad.pop((ps, key), None)
            self.cancelled += self._pending.pop((ps, key), 0) + 1
        else:
            self.bad[(ps, key)] = bytes(data)
            self._pending[(ps, key)] = self._pending.get((ps, key), 0) + 1
        self.events.append((self.ctx.env.now, "corrupt", ps, key))
        return True

    def _detect(self, ps: int, key: int, now: float, how: str) -> None:
        self.detected += self._pending.pop((ps, key), 0)
        self._repairing.add((ps, key))
        self.events.append((now, how, ps, key))
        self._repair(ps, key)

    def check_read(self, ps: int, key: int, now: float) -> bool:
        """Verify the copy of ``key`` on ``ps`` before it is served; False = refuse it."""
        data = self.stored(ps, key)
        if self.verify and chunk_checksums(data) != self.expected(key):
            self.detections += 1
            if (ps, key) not in self._repairing:
                self._detect(ps, key, now, "detected")
            return False
        if (ps, key) in self.bad:
            self.used_corrupt += 1
            self.events.append((now, "used-corrupt", ps, key))
            if self.report is not None:
                self.report("No corrupted chunk used", f"ps{ps} served corrupt chunk {key:#x}")
        return True

    def _repair(self, ps: int, key: int) -> None:
        ctx = self.ctx
        m, cid = key >> 32, key & 0xFFFFFFFF
        size = int(ctx.models[m].chunk_size[cid])
        ev = ctx.network.transfer([ctx.servers[ps].links["object"]], size, 2)
        ev.callbacks.append(lambda e: self._repaired(e, ps, key))

    def _repaired(self, ev: simpy.Event, ps: int, key: int) -> None:
        self._repairing.discard((ps, key))
        if not ev.ok:  # the link went down: the next read detects it again and retries
            ev.defused = True
            return
        if self.bad.pop((ps, key), None) is not None:
            self.repaired += 1
            self.events.append((self.ctx.env.now, "repaired", ps, key))

    def scrub(self) -> None:
        """Verify every stored copy known to differ (a background scrub at the end of a run):
        a corrupt copy no read has met yet is detected here."""
        for ps, key in sorted(self.bad):
            if (ps, key) not in self._repairing:
                self.scrubbed += self._pending.get((ps, key), 0)
                self._detect(ps, key, self.ctx.env.now, "scrub-detected")

    def summary(self) -> dict[str, int]:
        return {
            "injected": self.injected,
            "cancelled": self.cancelled,
            "detected": self.detected,
            "detected_by_scrub": self.scrubbed,
            "reads_refused": self.detections,
            "repaired": self.repaired,
            "still_corrupt": len(self.bad),
            "corrupted_chunks_used": self.used_corrupt,
        }
