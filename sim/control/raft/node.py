"""One Raft replica as one long-lived SimPy process (Ongaro & Ousterhout 2014).

The process sleeps on a single wake-up event, triggered by a message arriving in its inbox
or by its timer (election timeout for followers/candidates, heartbeat for the leader). It
drains the inbox, handles the timer if due, flushes replication, and sleeps again. Handlers
never yield, so the replica's state changes atomically per message.

Persistent state (survives :meth:`RaftNode.crash` + :meth:`RaftNode.restart` with its disk):
``current_term``, ``voted_for``, ``log``. Everything else (role, commit index, state machine,
leader bookkeeping) is volatile; a restarted replica re-applies its log as it learns the
commit index again.

Diskless restart (``restart(with_disk=False)``): the replica comes back with term 0, no vote
and an empty log, in *recovering* mode. While recovering it never votes and never stands for
election; it only follows a leader, adopting terms it hears of. It becomes a voter again once
it has received, from a leader, a commit index ``c`` that it matches and whose entry has the
leader's current term -- by Leader Completeness every entry committed so far is then in its
log, so its lost acknowledgements can no longer make a committed entry disappear.
Known caveat (inherent without stable storage): the replica forgot which candidate it voted
for before the crash. If it rejoins through a *stale* leader whose term is below a term in
which it had already voted, it may vote a second time in that term, and Election Safety can
break. The safe fix is to rejoin under a new identity through a membership change; this model
does not implement membership changes, so fault schedules that need guaranteed safety restart
replicas with their disks (see ``tests/sim/control/raft/test_diskless.py`` for what is claimed).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from sim.control.raft.buggify import Buggify
from sim.control.raft.election import Election
from sim.control.raft.groupconfig import RaftConfig
from sim.control.raft.log import RaftLog
from sim.control.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    ClientRequest,
    Entry,
    RequestVote,
    RequestVoteReply,
)
from sim.control.raft.nodebase import NOOP, ApplyHook, Role, Tracer
from sim.control.raft.replication import Replication
from sim.control.raft.safety import SafetyChecker
from sim.control.raft.statemachine import MetadataStateMachine
from sim.control.raft.transport import Transport

__all__ = ["NOOP", "ApplyHook", "RaftNode", "Role", "Tracer"]


class RaftNode(Election, Replication):
    """One replica. Create, then :meth:`start`; feed messages through :meth:`deliver`.

    The protocol handlers live in its parts (:class:`sim.control.raft.election.Election`,
    :class:`sim.control.raft.replication.Replication`); this class owns the lifecycle, the plumbing
    and the process that calls them."""

    def __init__(
        self,
        env: simpy.Environment,
        node_id: int,
        members: Sequence[int],
        transport: Transport,
        rng: np.random.Generator,
        config: RaftConfig,
        checker: SafetyChecker | None = None,
        trace: Tracer | None = None,
        on_apply: ApplyHook | None = None,
    ) -> None:
        self.env = env
        self.id = node_id
        self.members = tuple(members)
        self.peers = tuple(m for m in self.members if m != node_id)
        self.majority = len(self.members) // 2 + 1
        self.transport = transport
        self.rng = rng
        self.cfg = config
        self.checker = checker or SafetyChecker()
        self._trace = trace
        self._on_apply = on_apply
        # persistent state
        self.current_term = 0
        self.voted_for = None
        self.log = RaftLog()
        # liveness / incarnation
        self.alive = False
        self.recovering = False
        #: fault-injection mark: the next restart loses the disk (set by fault schedules)
        self.lose_disk_on_restart = False
        self._epoch = 0
        self._inbox: deque[Any] = deque()
        self._wake: simpy.Event | None = None
        self._timer_at: float | None = None
        self._deadline = 0.0
        self.buggify: Buggify | None = None
        # liveness evidence seen at deliver/send, not by the handlers (sim.control.raft.liveness):
        # highest term delivered since boot (and when), last boot / current AE / vote grant
        self.seen_term = 0
        self.seen_term_at = 0.0
        self.last_contact = 0.0
        self._reset_volatile()

    # -- lifecycle -----------------------------------------------------------------------
    def _reset_volatile(self) -> None:
        self.role = Role.FOLLOWER
        self.leader_id = None
        self.commit_index = 0
        self.last_applied = 0
        self.sm = MetadataStateMachine()
        self.applied = []
        self.votes = set()
        self.next_index = {}
        self.match_index = {}
        self._pending = {}
        self._flush = False

    def load_state(self, term: int, voted_for: int | None, entries: Sequence[Entry]) -> None:
        """Set the persistent state as if read from disk (tests, replays). Only while down."""
        if self.alive:
            raise RuntimeError(f"replica {self.id} is running; crash it before load_state")
        self.current_term = term
        self.voted_for = voted_for
        self.log = RaftLog(entries)

    def start(self) -> None:
        """Bring the replica up (first boot)."""
        self._boot()

    def timeout_now(self) -> None:
        """Let the election timer expire now (Raft's TimeoutNow): a live follower or
        candidate starts an election at once; no effect on a leader or a recovering one."""
        if self.alive and self.role is not Role.LEADER:
            self._deadline = self.env.now
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _boot(self) -> None:
        self.transport.register(self.id, self.deliver)
        self.alive = True
        self._epoch += 1
        self._inbox.clear()
        self._timer_at = None
        self.seen_term = 0
        self.last_contact = self.env.now
        self._reset_volatile()
        self._reset_election_deadline()
        self.env.process(self._run(self._epoch))

    def crash(self) -> None:
        """Stop the replica now: in-flight messages to it are lost, its process exits."""
        if not self.alive:
            return
        self.tr(f"crash {self.role.value}")
        self.alive = False
        self._epoch += 1
        self._inbox.clear()
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def restart(self, with_disk: bool = True) -> None:
        """Restart a crashed replica, keeping (or losing) its persistent state."""
        if self.alive:
            return
        if not with_disk:
            self.current_term = 0
            self.voted_for = None
            self.log = RaftLog()
            self.recovering = True
        self.tr(f"restart disk={with_disk}")
        self._boot()

    # -- plumbing ------------------------------------------------------------------------
    def tr(self, event: str) -> None:
        if self._trace is not None:
            self._trace(self.env.now, self.id, event)

    def deliver(self, msg: Any) -> None:
        """Transport callback: queue ``msg`` and wake the process (dropped when down)."""
        if not self.alive:
            return
        now = self.env.now
        if self.buggify is not None and self.buggify.deaf(self.id, msg.src, now):
            return
        term = getattr(msg, "term", None)
        if term is not None:
            if term > self.seen_term:
                self.seen_term, self.seen_term_at = term, now
            if isinstance(msg, AppendEntries) and term >= self.current_term:
                self.last_contact = now
        self._inbox.append(msg)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _send(self, dst: int, msg: Any) -> None:
        if isinstance(msg, RequestVoteReply) and msg.granted:
            self.last_contact = self.env.now
            self.checker.on_grant(self.id, dst, msg.term)
        elif isinstance(msg, AppendEntries):
            self.checker.on_append_sent(self.env.now, self.id, dst, msg.term)
        if self.buggify is None:
            self.transport.send(self.id, dst, msg)
        else:
            self.buggify.send(self.env, self.transport, self.id, dst, msg)

    def _arm_timer(self, at: float) -> None:
        self._timer_at = at
        ev = self.env.timeout(max(0.0, at - self.env.now))
        epoch = self._epoch

        def fire(_ev: simpy.Event) -> None:
            if epoch != self._epoch:
                return
            if self._timer_at == at:
                self._timer_at = None
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

        ev.callbacks.append(fire)

    def _reset_election_deadline(self) -> None:
        lo, hi = self.cfg.election_timeout
        early = None if self.buggify is None else self.buggify.election_timeout(lo, hi)
        if early is not None:
            self._deadline = self.env.now + early
            return
        self._deadline = self.env.now + lo + float(self.rng.random()) * (hi - lo)

    def _run(self, epoch: int) -> Any:
        env = self.env
        while True:
            if epoch != self._epoch:
                return
            while self._inbox:
                self._handle(self._inbox.popleft())
                if epoch != self._epoch:  # crashed by a handler's fault hook
                    return
            if env.now >= self._deadline - 1e-12:
                self._on_timer()
            if self._flush:
                self._flush = False
                # a handler may have made it step down after it appended: only a leader
                # of the current term replicates (else a follower would send
                # AppendEntries in a term whose leader is another replica)
                if self.role is Role.LEADER:
                    self._broadcast_append()
            # invariant: a timer is pending at or before the deadline
            if self._timer_at is None or self._timer_at > self._deadline:
                self._arm_timer(self._deadline)
            self._wake = env.event()
            yield self._wake

    # -- message handling ----------------------------------------------------------------
    def _handle(self, msg: Any) -> None:
        """Dispatch one message to its handler (and report a leader's raised match index)."""
        if isinstance(msg, AppendEntries):
            self._on_append(msg)
        elif isinstance(msg, AppendEntriesReply):
            lead, before = self.role is Role.LEADER, self.match_index.get(msg.src, 0)
            term = self.current_term
            self._on_append_reply(msg)
            after = self.match_index.get(msg.src, 0)
            if lead and after > before:
                self.checker.on_match_raise(self.env.now, self.id, term, msg.src, after, msg.term)
        elif isinstance(msg, RequestVote):
            self._on_request_vote(msg)
        elif isinstance(msg, RequestVoteReply):
            self._on_vote_reply(msg)
        elif isinstance(msg, ClientRequest):
            self._on_client(msg)
