"""Helpers shared by the Raft tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from sim.control.raft import Command, Entry, RaftConfig, RaftGroup, Role, SimTransport
from sim.control.raft.messages import (
    CLIENT_ID_BASE,
    AppendEntries,
    ClientRequest,
    RequestVote,
    RequestVoteReply,
)

TERM = 5  # a Solo replica's term when it boots


def make_group(
    n: int = 3,
    seed: int = 0,
    loss: float = 0.0,
    duplicate: float = 0.0,
    keep_trace: bool = False,
    **cfg: Any,
) -> tuple[simpy.Environment, RaftGroup, SimTransport]:
    """A group on a fresh environment with its own SimTransport."""
    env = simpy.Environment()
    rng = np.random.default_rng(seed)
    tr = SimTransport(env, np.random.default_rng(seed + 10_000), loss=loss, duplicate=duplicate)
    g = RaftGroup(env, RaftConfig(n=n, **cfg), rng, transport=tr, keep_trace=keep_trace)
    return env, g, tr


def entries(terms: Sequence[int], tag: str = "x") -> list[Entry]:
    """Log entries with the given terms; commands identify (tag, index, term)."""
    return [Entry(t, Command("put", f"{tag}{i}", t, 999, i)) for i, t in enumerate(terms, 1)]


def wait_leader(env: simpy.Environment, g: RaftGroup, limit: float = 5.0) -> int:
    """Run until some live leader exists; return its id."""
    end = env.now + limit
    while env.now < end:
        env.run(until=env.now + 0.01)
        lead = g.leader()
        if lead is not None:
            return lead
    raise AssertionError(f"no leader by t={env.now}")


class Solo:
    """Replica 0 of a 3-replica group, booted alone in ``TERM`` with ``log``; every message
    it sends is recorded as ``(time, destination, message)``. Tests deliver its peers'
    messages by hand (:meth:`deliver`)."""

    def __init__(self, seed: int = 0, log: Sequence[Entry] = ()) -> None:
        env, g, tr = make_group(n=3, seed=seed)
        self.env: simpy.Environment = env
        self.g: RaftGroup = g
        self.node = g.nodes[0]
        self.node.load_state(TERM, None, log)
        self.sent: list[tuple[float, int, Any]] = []
        send = tr.send

        def spy(src: int, dst: int, msg: Any) -> None:
            if src == 0:
                self.sent.append((env.now, dst, msg))
            send(src, dst, msg)

        tr.send = spy  # type: ignore[method-assign]
        g.start(nodes=[0])
        self.seq = 0

    def deliver(self, msg: Any) -> None:
        """Deliver ``msg`` to the replica and let it handle it."""
        self.node.deliver(msg)
        self.env.run(until=self.env.now + 1e-6)

    def heartbeat(self, src: int, term: int) -> None:
        self.deliver(AppendEntries(src, term, 0, 0, (), 0))

    def vote_requests(self) -> list[float]:
        return [t for t, _, m in self.sent if isinstance(m, RequestVote)]

    def lead(self) -> int:
        """Make the replica leader (an election, one vote granted); returns its term."""
        self.node.timeout_now()
        self.env.run(until=self.env.now + 1e-6)
        term = self.node.current_term
        self.g.checker.on_grant(1, 0, term)  # what replica 1 reports when it grants
        self.deliver(RequestVoteReply(1, term, True))
        assert self.node.role is Role.LEADER
        return term

    def write(self) -> int:
        """A client write to the leader; returns its log index."""
        self.seq += 1
        cmd = Command("put", f"k{self.seq}", self.seq, CLIENT_ID_BASE, self.seq)
        self.deliver(ClientRequest(CLIENT_ID_BASE, cmd))
        return self.node.log.last_index
