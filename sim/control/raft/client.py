"""A Raft client: talks to the leader, follows redirections, retries on timeouts.

Each call is one logical operation with a fixed ``(client, seq)``; retries resend the same
command, and the state machine applies it at most once. A call returns once the command is
committed and applied (so a write is acknowledged only when durable); if no answer arrives
before ``give_up`` seconds the outcome is *unknown* (it may or may not take effect later).

Reads go through the log like writes (documented choice: simplest way to make them
linearizable; no read index or leases), so a ``get`` is answered with the value at its own log
position.

Every call is recorded in :attr:`RaftClient.history` for the linearizability checker.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from sim.control.raft.messages import ClientReply, ClientRequest, Command
from sim.control.raft.transport import Transport

UNKNOWN = object()
"""Returned by :meth:`RaftClient.call` when the outcome is unknown (gave up waiting)."""


@dataclass(slots=True)
class HistoryOp:
    """One client operation: invoked at ``invoke``; ``response`` is ``None`` when the
    outcome is unknown. ``index`` is the log index of the acknowledgement (0 if none)."""

    client: int
    op: str
    key: str
    value: Any
    invoke: float
    response: float | None = None
    result: Any = None
    index: int = 0


class RaftClient:
    """A client endpoint with id ``client_id`` (>= 1000) talking to ``members``."""

    def __init__(
        self,
        env: simpy.Environment,
        client_id: int,
        members: Sequence[int],
        transport: Transport,
        timeout: float = 0.5,
        retry_backoff: float = 0.05,
        give_up: float = 5.0,
    ) -> None:
        self.env = env
        self.id = client_id
        self.members = tuple(members)
        self.transport = transport
        self.timeout = timeout
        self.retry_backoff = retry_backoff
        self.give_up = give_up
        self.history: list[HistoryOp] = []
        self._seq = 0
        self._target = self.members[0]
        self._waiting: simpy.Event | None = None
        self._registered = False
        self._busy = False
        self.redirects = self.timeouts = 0

    def deliver(self, msg: Any) -> None:
        """Transport callback: hand a reply for the outstanding request to :meth:`call`."""
        if (
            isinstance(msg, ClientReply)
            and msg.seq == self._seq
            and self._waiting is not None
            and not self._waiting.triggered
        ):
            self._waiting.succeed(msg)

    def call(self, op: str, key: str, value: Any = None) -> Generator[simpy.Event, Any, Any]:
        """SimPy generator: perform one operation; its value is the result or :data:`UNKNOWN`.

        Use as ``result = yield env.process(client.call("put", "k", 1))``. A client has at
        most one outstanding call (a second concurrent call raises ``RuntimeError``); use
        several clients for concurrency.
        """
        if self._busy:
            raise RuntimeError(f"client {self.id}: one outstanding call at a time")
        self._busy = True
        try:
            return (yield from self._call(op, key, value))
        finally:
            self._busy = False

    def _call(self, op: str, key: str, value: Any) -> Generator[simpy.Event, Any, Any]:
        if not self._registered:
            self.transport.register(self.id, self.deliver)
            self._registered = True
        env = self.env
        self._seq += 1
        cmd = Command(op, key, value, self.id, self._seq)
        rec = HistoryOp(self.id, op, key, value, env.now)
        self.history.append(rec)
        deadline = env.now + self.give_up
        n = len(self.members)
        while env.now < deadline:
            self._waiting = env.event()
            self.transport.send(self.id, self._target, ClientRequest(self.id, cmd))
            yield self._waiting | env.timeout(min(self.timeout, deadline - env.now))
            reply = self._waiting.value if self._waiting.triggered else None
            if reply is None:  # timeout: try the next replica
                self.timeouts += 1
                self._target = self.members[(self.members.index(self._target) + 1) % n]
                continue
            if reply.ok:
                rec.response = env.now
                rec.result = reply.result
                rec.index = reply.index
                return reply.result
            self.redirects += 1
            if reply.leader_hint is not None and reply.leader_hint != reply.src:
                self._target = reply.leader_hint
            else:
                self._target = self.members[(self.members.index(self._target) + 1) % n]
                yield env.timeout(self.retry_backoff)
        self._waiting = None
        return UNKNOWN
