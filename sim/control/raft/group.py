"""A Raft group: N replicas, their transport, checkers, clients, event trace and watch hub.

Usage::

    env = simpy.Environment()
    g = RaftGroup(env, RaftConfig(n=5), np.random.default_rng(7))
    g.start()
    c = g.client()
    env.process(c.call("put", "ring/node3", 1))
    env.run(until=2.0)
    g.leader(), g.trace_hash(), g.checker.violations

Randomness: one Generator in; each replica and the transport get their own child stream
(``Generator.spawn``), so adding a client or a fault does not shift election timeouts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import simpy

from sim.control.raft.client import RaftClient
from sim.control.raft.groupconfig import RaftConfig
from sim.control.raft.messages import CLIENT_ID_BASE
from sim.control.raft.node import RaftNode, Role
from sim.control.raft.safety import SafetyChecker
from sim.control.raft.statemachine import Change, WatchHub
from sim.control.raft.transport import SimTransport, Transport


class EventTrace:
    """Running SHA-256 of ``(time, node, event)`` records; optionally keeps them."""

    def __init__(self, keep: bool = False) -> None:
        self._h = hashlib.sha256()
        self.keep = keep
        self.records: list[tuple[float, int, str]] = []
        self.count = 0

    def __call__(self, now: float, node: int, event: str) -> None:
        self._h.update(f"{now!r}|{node}|{event}\n".encode())
        self.count += 1
        if self.keep:
            self.records.append((now, node, event))

    def hexdigest(self) -> str:
        """Hash of every record so far."""
        return self._h.hexdigest()


class RaftGroup:
    """Create and drive a group of ``config.n`` replicas with ids ``0..n-1``.

    ``transport`` defaults to a loss-free :class:`SimTransport`; ``checker`` to a
    non-strict :class:`SafetyChecker` (inspect ``.violations``).
    """

    def __init__(
        self,
        env: simpy.Environment,
        config: RaftConfig,
        rng: np.random.Generator,
        transport: Transport | None = None,
        checker: SafetyChecker | None = None,
        keep_trace: bool = False,
    ) -> None:
        self.env = env
        self.config = config.validate()
        node_rngs = rng.spawn(config.n + 1)
        self.transport: Transport = transport or SimTransport(env, node_rngs[-1])
        self.checker = checker or SafetyChecker()
        self.trace = EventTrace(keep=keep_trace)
        self.hub = WatchHub()
        members = list(range(config.n))
        self.nodes = [
            RaftNode(
                env,
                i,
                members,
                self.transport,
                node_rngs[i],
                self.config,
                self.checker,
                self.trace,
                self.hub.on_apply,
            )
            for i in members
        ]
        self.clients: list[RaftClient] = []

    def start(self, nodes: Sequence[int] | None = None) -> None:
        """Boot every replica, or only those listed (the others stay down until
        :meth:`restart`)."""
        for n in self.nodes:
            if nodes is None or n.id in nodes:
                n.start()

    def client(self, **kwargs: float) -> RaftClient:
        """A new client endpoint (ids 1000, 1001, ...); kwargs go to :class:`RaftClient`."""
        c = RaftClient(
            self.env,
            CLIENT_ID_BASE + len(self.clients),
            [n.id for n in self.nodes],
            self.transport,
            **kwargs,
        )
        self.clients.append(c)
        return c

    def leader(self) -> int | None:
        """The live leader with the highest term, or ``None``."""
        best: RaftNode | None = None
        for n in self.nodes:
            if (
                n.alive
                and n.role is Role.LEADER
                and (best is None or n.current_term > best.current_term)
            ):
                best = n
        return None if best is None else best.id

    def crash(self, node: int) -> None:
        """Crash replica ``node``."""
        self.nodes[node].crash()

    def restart(self, node: int, with_disk: bool = True) -> None:
        """Restart replica ``node`` (with or without its persistent state)."""
        self.nodes[node].restart(with_disk)

    def watch(self, prefix: str, callback: Callable[[Change], None]) -> Callable[[], None]:
        """Subscribe to committed changes of keys starting with ``prefix`` (R11 watch);
        returns an unsubscribe function."""
        return self.hub.subscribe(prefix, callback)

    def trace_hash(self) -> str:
        """SHA-256 of the event trace so far (same seed -> same hash)."""
        return self.trace.hexdigest()
