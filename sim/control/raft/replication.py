"""The replication part of a Raft replica: AppendEntries, commitment, applying (section 5.3).

:class:`Replication` is mixed into :class:`sim.control.raft.node.RaftNode` over the shared state of
:class:`sim.control.raft.nodebase.ReplicaBase`. Follower side: AppendEntries from a current leader is
accepted only when the entry before the new ones matches (index and term); a conflicting
suffix is truncated, matching entries are kept, and the commit index follows the leader's,
bounded by what this message matched. A recovering replica becomes a voter again once it
matches a commit index whose entry has the leader's term. Leader side: client commands are
appended and replicated in batches of ``RaftConfig.max_batch``; a rejection moves
``next_index`` back to the follower's hint; the leader commits the highest index a majority
stores only if that entry has its current term (figure 8). Committed entries are applied in
index order (``last_applied <= commit_index``) and the waiting client is answered.
"""

from __future__ import annotations

from sim.control.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    ClientReply,
    ClientRequest,
    Command,
    Entry,
)
from sim.control.raft.nodebase import ReplicaBase, Role


class Replication(ReplicaBase):
    """Log replication, commitment and applying of one replica (handlers; none yields)."""

    # -- AppendEntries and client requests -----------------------------------------------
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
