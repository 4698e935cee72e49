"""Chunk integrity: a stateful test against a reference model, and the checker catching a
corrupt copy that slips through (test-only ``verify: false``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import simpy
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine.chunks import chunk_checksums
from sim.control.integrity import Integrity, stand_in
from sim.serving.network import Network

from .conftest import small


def _ctx() -> SimpleNamespace:
    env = simpy.Environment()
    net = Network(env)
    servers = [
        SimpleNamespace(links={"object": net.add_link(f"ps{i}.object", 1e9, 0.001)})
        for i in range(2)
    ]
    model = SimpleNamespace(chunk_size=np.full(8, 4 << 20, dtype=np.int64), base=0)
    return SimpleNamespace(env=env, network=net, servers=servers, models=[model])


def test_stand_in_checksums_differ_per_chunk_and_after_one_flip() -> None:
    a, b = stand_in(1), stand_in(2)
    assert len(a) == 64 and chunk_checksums(a) != chunk_checksums(b)
    flipped = bytes([a[0] ^ 1]) + a[1:]
    crc, sha = chunk_checksums(flipped)
    assert crc != chunk_checksums(a)[0] and sha != chunk_checksums(a)[1]


class IntegrityMachine(RuleBasedStateMachine):
    """Reference model: the set of (server, chunk) copies currently corrupt; a read of a
    corrupt copy must be refused, a read of a good one accepted; after the repair time every
    detected copy is good again; nothing corrupt is ever used."""

    def __init__(self) -> None:
        super().__init__()
        self.ctx = _ctx()
        self.integ = Integrity(self.ctx)
        self.rng = np.random.default_rng(0)
        self.corrupt: set[tuple[int, int]] = set()
        self.injected = 0

    @rule(ps=st.integers(0, 1), key=st.integers(0, 7), bits=st.integers(1, 8))
    def corrupt_copy(self, ps: int, key: int, bits: int) -> None:
        if self.integ.corrupt(ps, key, bits, self.rng):
            self.injected += 1
            if (ps, key) in self.integ.bad:
                self.corrupt.add((ps, key))
            else:
                self.corrupt.discard((ps, key))

    @rule(ps=st.integers(0, 1), key=st.integers(0, 7))
    def read(self, ps: int, key: int) -> None:
        ok = self.integ.check_read(ps, key, self.ctx.env.now)
        assert ok == ((ps, key) not in self.corrupt)

    @rule(dt=st.floats(0.001, 0.2))
    def advance(self, dt: float) -> None:
        self.ctx.env.run(until=self.ctx.env.now + dt)
        self.corrupt = {c for c in self.corrupt if c in self.integ.bad}

    @rule()
    def scrub_and_settle(self) -> None:
        self.integ.scrub()
        self.ctx.env.run(until=self.ctx.env.now + 1.0)
        self.corrupt = set()
        assert not self.integ.bad
        assert self.integ.detected + self.integ.cancelled == self.injected

    @invariant()
    def never_used(self) -> None:
        assert self.integ.used_corrupt == 0
        assert set(self.integ.bad) == self.corrupt


TestIntegrity = IntegrityMachine.TestCase
TestIntegrity.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_unverified_corrupt_read_is_caught_by_the_checker() -> None:
    from sim.study.recording import run_checked

    sc = small(
        [
            "faults.verify=false",
            "faults.random.enabled=false",
            "faults.schedule=[{at: 0.0s, kind: corrupt, target: ps0, model: 0, chunk: 0}]",
        ]
    )
    out = run_checked(sc, 1)
    assert not out.ok
    assert "No corrupted chunk used" in out.findings[0]
