"""The election part of a Raft replica: terms, votes and roles (Raft section 5.2).

:class:`Election` is mixed into :class:`sim.control.raft.node.RaftNode` over the shared state of
:class:`sim.control.raft.nodebase.ReplicaBase`. A follower or candidate whose election deadline passes
stands for election in a new term (never a *recovering* replica, see :mod:`sim.control.raft.node`); a
vote is granted at most once per term, only to a candidate whose log is at least as
up-to-date, and never by a recovering replica; a candidate holding a majority of votes
becomes leader (and appends a no-op when ``RaftConfig.leader_noop``); any message of a newer
term makes the replica adopt that term and step down. The leader's timer is its heartbeat.
"""

from __future__ import annotations

from sim.control.raft.messages import RequestVote, RequestVoteReply
from sim.control.raft.nodebase import NOOP, ReplicaBase, Role


class Election(ReplicaBase):
    """Terms, votes and role changes of one replica (handlers; none yields)."""

    # -- terms and roles -----------------------------------------------------------------
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

    # -- votes ---------------------------------------------------------------------------
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
