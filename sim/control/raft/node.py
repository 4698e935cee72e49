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

import enum
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import simpy

from sim.control.raft.buggify import Buggify
from sim.control.raft.groupconfig import RaftConfig
from sim.control.raft.log import RaftLog
from sim.control.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    ClientReply,
    ClientRequest,
    Command,
    Entry,
    RequestVote,
    RequestVoteReply,
)
from sim.control.raft.safety import SafetyChecker
from sim.control.raft.statemachine import Change, MetadataStateMachine
from sim.control.raft.transport import Transport

Tracer = Callable[[float, int, str], None]
ApplyHook = Callable[[int, Change | None], None]

NOOP = Command("noop", "", None, -1, 0)


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


class RaftNode:
    """One replica. Create, then :meth:`start`; feed messages through :meth:`deliver`."""

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
        self.voted_for: int | None = None
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
        #: BUGGIFY perturbation (sim.control.raft.buggify); None: none
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
        self.leader_id: int | None = None
        self.commit_index = 0
        self.last_applied = 0
        self.sm = MetadataStateMachine()
        self.applied: list[Command] = []
        self.votes: set[int] = set()
        self.next_index: dict[int, int] = {}
        self.match_index: dict[int, int] = {}
        self._pending: dict[int, int] = {}  # log index -> client endpoint awaiting the reply
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

    # -- roles ---------------------------------------------------------------------------
    def _set_term(self, term: int) -> None:
        """Adopt a newer ``term``: forget the vote and step down."""
        self.current_term = term
        self.voted_for = None
        self.tr(f"term {term}")
        if self.role is not Role.FOLLOWER:
            self._become_follower()

    def _become_follower(self) -> None:
        if self.role is Role.LEADER:
            self._pending.clear()
            self._reset_election_deadline()
        self.role = Role.FOLLOWER
        self.tr("follower")

    def _on_timer(self) -> None:
        if self.role is Role.LEADER:
            self._broadcast_append()
            self._deadline = self.env.now + self.cfg.heartbeat_interval
            return
        if self.recovering:  # a recovering replica never stands for election
            self._reset_election_deadline()
            return
        self.current_term += 1
        self.role = Role.CANDIDATE
        self.voted_for = self.id
        self.votes = {self.id}
        self.leader_id = None
        self.tr(f"candidate {self.current_term}")
        self._reset_election_deadline()
        rv = RequestVote(self.id, self.current_term, self.log.last_index, self.log.last_term)
        for p in self.peers:
            self._send(p, rv)
        if len(self.votes) >= self.majority:
            self._become_leader()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.id
        self.tr(f"leader {self.current_term}")
        self.checker.on_leader(
            self.env.now, self.id, self.current_term, self.log, len(self.members)
        )
        nxt = self.log.last_index + 1
        self.next_index = {p: nxt for p in self.peers}
        self.match_index = {p: 0 for p in self.peers}
        if self.cfg.leader_noop:
            self._append_local(NOOP)
        self._broadcast_append()
        self._deadline = self.env.now + self.cfg.heartbeat_interval
        self._advance_commit()

    # -- message handling ----------------------------------------------------------------
    def _handle(self, msg: Any) -> None:
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

    def _on_request_vote(self, m: RequestVote) -> None:
        if m.term > self.current_term:
            self._set_term(m.term)
        grant = (
            m.term == self.current_term
            and not self.recovering
            and self.voted_for in (None, m.src)
            and self.log.up_to_date(m.last_log_index, m.last_log_term)
        )
        if grant:
            self.voted_for = m.src
            self._reset_election_deadline()
        self._send(m.src, RequestVoteReply(self.id, self.current_term, grant))

    def _on_vote_reply(self, m: RequestVoteReply) -> None:
        if m.term > self.current_term:
            self._set_term(m.term)
            return
        if self.role is Role.CANDIDATE and m.term == self.current_term and m.granted:
            self.votes.add(m.src)
            if len(self.votes) >= self.majority:
                self._become_leader()

    def _on_append(self, m: AppendEntries) -> None:
        if m.term < self.current_term:
            self._send(m.src, AppendEntriesReply(self.id, self.current_term, False, 0, 0))
            return
        if m.term > self.current_term:
            self._set_term(m.term)
        elif self.role is not Role.FOLLOWER:  # a candidate hears of the term's leader
            self._become_follower()
        self.leader_id = m.src
        self._reset_election_deadline()
        log = self.log
        if m.prev_index > log.last_index or log.term_at(m.prev_index) != m.prev_term:
            hint = (
                log.last_index + 1
                if m.prev_index > log.last_index
                else log.first_index_of_term(m.prev_index)
            )
            self._send(m.src, AppendEntriesReply(self.id, self.current_term, False, 0, hint))
            return
        index = m.prev_index
        for e in m.entries:
            index += 1
            if index <= log.last_index:
                if log.term_at(index) == e.term:
                    continue  # already have it (duplicate or reordered message)
                # conflict: delete the existing entry and all that follow it (never at or
                # below the commit index in a correct run: the checker reports it if it is)
                self.checker.on_truncate(
                    self.env.now,
                    self.id,
                    self.role is Role.LEADER,
                    self.current_term,
                    index,
                    self.commit_index,
                )
                log.truncate_from(index)
            self.checker.on_store(self.env.now, self.id, index, e, log.term_at(index - 1))
            log.append(e)
        match = m.prev_index + len(m.entries)
        if m.entries and self.buggify is not None:
            self.buggify.after_store(self)
        if m.leader_commit > self.commit_index:
            self._commit_to(min(m.leader_commit, match))
        if (
            self.recovering
            and m.leader_commit > 0
            and match >= m.leader_commit
            and log.term_at(m.leader_commit) == self.current_term
        ):
            self.recovering = False
            self.tr("voter again")
        self._send(m.src, AppendEntriesReply(self.id, self.current_term, True, match, 0))

    def _on_append_reply(self, m: AppendEntriesReply) -> None:
        if m.term > self.current_term:
            self._set_term(m.term)
            return
        if self.role is not Role.LEADER or m.term != self.current_term:
            return
        p = m.src
        if m.success:
            if m.match_index > self.match_index[p]:
                self.match_index[p] = m.match_index
                self._advance_commit()
            self.next_index[p] = max(self.next_index[p], self.match_index[p] + 1)
            if self.next_index[p] <= self.log.last_index:
                self._send_append(p)
        else:
            # conflict_index <= the failed request's prev_index, so next_index strictly
            # decreases until the logs match (prev_index 0 always matches)
            if m.conflict_index <= self.match_index[p]:
                # the follower lost entries it had acknowledged (a restart without its disk,
                # or a stale reply): count it as matching only what it still holds
                self.match_index[p] = m.conflict_index - 1
            self.next_index[p] = max(1, min(m.conflict_index, self.next_index[p]))
            self._send_append(p)

    def _on_client(self, m: ClientRequest) -> None:
        if self.role is not Role.LEADER:
            self._send(
                m.src,
                ClientReply(
                    self.id, m.command.client, m.command.seq, False, None, 0, self.leader_id
                ),
            )
            return
        index = self._append_local(m.command)
        self._pending[index] = m.src
        self._flush = True
        if self.buggify is not None:
            self.buggify.after_append(self, index)

    # -- replication and commitment ----------------------------------------------------------
    def _append_local(self, cmd: Command) -> int:
        entry = Entry(self.current_term, cmd)
        index = self.log.last_index + 1
        self.checker.on_store(self.env.now, self.id, index, entry, self.log.last_term)
        self.log.append(entry)
        if not self.peers:
            self._advance_commit()
        return index

    def _send_append(self, p: int) -> None:
        prev = self.next_index[p] - 1
        entries = self.log.slice(prev + 1, self.cfg.max_batch)
        self._send(
            p,
            AppendEntries(
                self.id, self.current_term, prev, self.log.term_at(prev), entries, self.commit_index
            ),
        )

    def _broadcast_append(self) -> None:
        for p in self.peers:
            self._send_append(p)

    def _advance_commit(self) -> None:
        """Commit the highest index stored on a majority -- only if it holds an entry of the
        leader's current term (figure 8 rule; earlier entries then commit with it). Log terms
        never decrease, so if the majority index has an older term no lower index qualifies.
        The test-only ``unsafe_commit_old_terms`` flag skips the term check."""
        matches = sorted([self.log.last_index, *self.match_index.values()], reverse=True)
        n = matches[self.majority - 1]
        if n <= self.commit_index:
            return
        if self.log.term_at(n) != self.current_term and not self.cfg.unsafe_commit_old_terms:
            return
        self._commit_to(n)

    def _commit_to(self, index: int) -> None:
        if index <= self.commit_index:
            return
        old = self.commit_index
        self.commit_index = index
        self.tr(f"commit {index}")
        lead = self.current_term if self.role is Role.LEADER else 0
        self.checker.on_commit(self.env.now, self.id, self.log, old, index, lead)
        self._apply()

    def _apply(self) -> None:
        """Apply committed entries in index order (invariant: last_applied <= commit_index)."""
        while self.last_applied < self.commit_index:
            i = self.last_applied + 1
            cmd = self.log.entry(i).command
            result, change = (None, None) if cmd.op == "noop" else self.sm.apply(i, cmd)
            self.last_applied = i
            self.applied.append(cmd)
            self.checker.on_apply(self.env.now, self.id, i, cmd)
            if self._on_apply is not None:
                self._on_apply(i, change)
            client = self._pending.pop(i, None)
            if client is not None and self.role is Role.LEADER:
                self.checker.on_ack(self.env.now, self.id, i, cmd)
                self._send(client, ClientReply(self.id, cmd.client, cmd.seq, True, result, i))
