"""Hypothesis drives a Raft group with arbitrary fault/client steps; the checkers are the
invariants, and the client history must stay linearizable (the reference model: one
atomic register per key)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.control.raft import RaftConfig, RaftGroup, SimTransport
from sim.control.raft.linearizability import check_history

N = 3


class RaftMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.env = simpy.Environment()
        self.tr = SimTransport(self.env, np.random.default_rng(1), loss=0.05, duplicate=0.05)
        self.g = RaftGroup(self.env, RaftConfig(n=N), np.random.default_rng(2), transport=self.tr)
        self.g.start()
        self.clients = [self.g.client(timeout=0.2, give_up=1.0) for _ in range(2)]
        self.busy = [False, False]
        self.counter = 0

    def _issue(self, i: int, op: str, key: str) -> None:
        self.counter += 1
        c, value = self.clients[i], self.counter
        self.busy[i] = True

        def go():  # type: ignore[no-untyped-def]
            yield self.env.process(c.call(op, key, value if op == "put" else None))
            self.busy[i] = False

        self.env.process(go())

    @precondition(lambda self: not all(self.busy))
    @rule(op=st.sampled_from(["put", "get"]), key=st.sampled_from(["a", "b"]))
    def client_op(self, op: str, key: str) -> None:
        self._issue(self.busy.index(False), op, key)

    @rule(node=st.integers(0, N - 1))
    def crash(self, node: int) -> None:
        self.g.crash(node)

    @rule(node=st.integers(0, N - 1))
    def restart(self, node: int) -> None:
        self.g.restart(node)

    @rule()
    def crash_leader(self) -> None:
        lead = self.g.leader()
        if lead is not None:
            self.g.crash(lead)

    @rule(node=st.integers(0, N - 1))
    def isolate(self, node: int) -> None:
        self.tr.isolate(node)

    @rule(side=st.lists(st.booleans(), min_size=N, max_size=N))
    def partition(self, side: list[bool]) -> None:
        self.tr.partition([[i for i in range(N) if side[i]], [i for i in range(N) if not side[i]]])

    @rule()
    def heal(self) -> None:
        self.tr.heal()

    @rule(dt=st.floats(0.001, 0.6))
    def run(self, dt: float) -> None:
        self.env.run(until=self.env.now + dt)

    @invariant()
    def safe(self) -> None:
        assert self.g.checker.ok, self.g.checker.violations

    def teardown(self) -> None:
        # heal everything; a fresh client's write makes the new leader commit an entry of its
        # term (so everything committed is applied there); then the group must agree and
        # have lost no acknowledged write
        self.tr.heal()
        for i in range(N):
            self.g.restart(i)
        final = self.g.client(timeout=0.2, give_up=3.0)
        self.env.process(final.call("put", "a", -1))
        self.env.run(until=self.env.now + 3.5)
        g = self.g
        assert g.checker.ok, g.checker.violations
        assert final.history[0].response is not None
        ref: Any = max((x.applied for x in g.nodes), key=len)
        for x in g.nodes:  # applied sequences are prefixes of one another
            assert x.applied == ref[: len(x.applied)]
        g.checker.check_acked_present(self.env.now, -1, ref)
        assert g.checker.ok, g.checker.violations
        history = [h for c in g.clients for h in c.history]
        assert check_history(history) == []


TestRaftStateful = RaftMachine.TestCase
TestRaftStateful.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)


@pytest.mark.slow
def test_raft_stateful_many() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        RaftMachine, settings=settings(max_examples=300, stateful_step_count=50, deadline=None)
    )
