"""Single-point mutants of ``sim.control.raft`` for the mutation harness: the chaos route
(tests/sim/control/raft/test_mutation.py) and the pytest route (``python -m tests.mutation``).

Each :class:`~tests.mutation.mutant.Mutant` is a bug a real engineer could write, in one line of
one function, patched in in-process (no file is edited). ``kind`` says what the bug breaks:
``safety`` or ``liveness``; ``tests`` names the test files that kill it without chaos.
"""

from __future__ import annotations

from dataclasses import replace

from sim.control.raft import election as raft_election
from sim.control.raft import log as raft_log
from sim.control.raft import node as raft_node
from sim.control.raft import replication as raft_replication
from tests.mutation.mutant import Mutant

__all__ = ["MUTANTS", "Mutant"]

# each mutant's owner is the class that defines the method (RaftNode's handlers live in its
# parts), so the patch replaces the code the replica really runs
N = raft_node.RaftNode
E = raft_election.Election
R = raft_replication.Replication
L = raft_log.RaftLog

MUTANTS: list[Mutant] = [
    Mutant(
        "vote-without-log-check",
        "a vote is granted without the up-to-date log check",
        E,
        "_on_request_vote",
        "and self.log.up_to_date(m.last_log_index, m.last_log_term)",
        "",
    ),
    Mutant(
        "vote-not-recorded",
        "a granted vote is not recorded (voted_for stays as it was)",
        E,
        "_on_request_vote",
        "self.voted_for = m.src",
        "pass",
    ),
    Mutant(
        "prev-term-unchecked",
        "AppendEntries checks prevLogIndex but not prevLogTerm",
        R,
        "_on_append",
        "if m.prev_index > log.last_index or log.term_at(m.prev_index) != m.prev_term:",
        "if m.prev_index > log.last_index:",
    ),
    Mutant(
        "truncate-matching",
        "a follower truncates from the first new entry even when it matches",
        R,
        "_on_append",
        "if log.term_at(index) == e.term:",
        "if False:",
    ),
    Mutant(
        "majority-off-by-one",
        "majority computed as n // 2 instead of n // 2 + 1",
        N,
        "__init__",
        "self.majority = len(self.members) // 2 + 1",
        "self.majority = len(self.members) // 2",
    ),
    Mutant(
        "log-slice-off-by-one",
        "the entries sent start one index late (slice from start)",
        L,
        "slice",
        "self._entries[start - 1 : start - 1 + max_count]",
        "self._entries[start : start + max_count]",
    ),
    Mutant(
        "commit-checks-last-term",
        "commit rule checks the leader's last log term, not the term at the majority index",
        R,
        "_advance_commit",
        "self.log.term_at(n) != self.current_term",
        "self.log.last_term != self.current_term",
    ),
    Mutant(
        "stale-append-reply-accepted",
        "the leader accepts AppendEntries replies from earlier terms",
        R,
        "_on_append_reply",
        "if self.role is not Role.LEADER or m.term != self.current_term:",
        "if self.role is not Role.LEADER:",
    ),
    Mutant(
        "no-stepdown-on-append-reply",
        "the leader does not step down on a higher term in an AppendEntries reply",
        R,
        "_on_append_reply",
        "self._set_term(m.term)",
        "pass",
        "liveness",
    ),
    Mutant(
        "stale-append-resets-timer",
        "a follower resets its election timer on AppendEntries from a stale leader",
        R,
        "_on_append",
        "def _on_append(self, m: AppendEntries) -> None:\n",
        "def _on_append(self, m: AppendEntries) -> None:\n    self._reset_election_deadline()\n",
        "liveness",
    ),
    Mutant(
        "next-index-past-hint",
        "nextIndex after a rejection is set one past the follower's conflict hint",
        R,
        "_on_append_reply",
        "min(m.conflict_index, self.next_index[p])",
        "min(m.conflict_index + 1, self.next_index[p])",
        "liveness",
    ),
    Mutant(
        "follower-commits-past-match",
        "a follower commits up to leaderCommit bounded by its last index, not the match",
        R,
        "_on_append",
        "self._commit_to(min(m.leader_commit, match))",
        "self._commit_to(min(m.leader_commit, log.last_index))",
    ),
    Mutant(
        "stale-vote-reply-counted",
        "a candidate counts granted votes from earlier terms",
        E,
        "_on_vote_reply",
        "if self.role is Role.CANDIDATE and m.term == self.current_term and m.granted:",
        "if self.role is Role.CANDIDATE and m.granted:",
    ),
    Mutant(
        "leader-commit-is-last-index",
        "the leader sends its last log index as leaderCommit instead of its commit index",
        R,
        "_send_append",
        "entries, self.commit_index",
        "entries, self.log.last_index",
    ),
    Mutant(
        "up-to-date-ignores-term",
        "the voting rule compares log lengths only (ignores the last term)",
        L,
        "up_to_date",
        "if last_term != self.last_term:",
        "if False:",
    ),
]

#: the pytest route's targeted files for every Raft mutant (the fast, deterministic tiers;
#: the chaos route is tests/sim/control/raft/test_mutation.py)
RAFT_TESTS = (
    "tests/sim/control/raft/test_stale_messages.py",
    "tests/sim/control/raft/test_message_rules.py",
    "tests/sim/control/raft/test_replication.py",
    "tests/sim/control/raft/test_election.py",
    "tests/sim/control/raft/test_stepdown.py",
)
MUTANTS = [replace(m, tests=RAFT_TESTS) for m in MUTANTS]
