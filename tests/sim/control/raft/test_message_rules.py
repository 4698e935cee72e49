"""Figure 2's per-message rules on one replica, one message at a time: a follower commits
only what an AppendEntries matched, a leader steps down on a newer term in a reply, a
candidate counts only its own term's votes, and a vote needs a log at least as up to date
(last term first, then length). Mutation harness: these kill the Raft mutants
``follower-commits-past-match``, ``no-stepdown-on-append-reply``, ``stale-vote-reply-counted``
and ``up-to-date-ignores-term`` (``mutants.py``) without a chaos sweep."""

from __future__ import annotations

from sim.control.raft import Role
from sim.control.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    RequestVote,
    RequestVoteReply,
)

from .util import TERM, Solo, entries


def test_a_follower_commits_only_up_to_the_last_entry_the_append_matched() -> None:
    # entries 4-5 are a stale suffix (term 2, from a deposed leader); the leader of TERM
    # holds term-1 entries 1-3 and its commit index is 5 (its own entries 4-5)
    s = Solo(log=entries([1, 1, 1, 2, 2], tag="old"))
    lead_log = entries([1, 1, 1], tag="old")
    s.deliver(AppendEntries(1, TERM, 2, 1, (lead_log[2],), 5))
    ok = [m for _, _, m in s.sent if isinstance(m, AppendEntriesReply)]
    assert ok and ok[-1].success and ok[-1].match_index == 3
    assert s.node.log.last_index == 5  # the stale suffix stays until an entry conflicts
    assert s.node.commit_index == 3 and s.node.last_applied == 3  # not the stale 4-5


def test_a_leader_steps_down_on_a_newer_term_in_a_reply() -> None:
    s = Solo()
    term = s.lead()
    s.deliver(AppendEntriesReply(1, term + 2, False, 0, 0))
    assert s.node.role is Role.FOLLOWER and s.node.current_term == term + 2
    assert s.node.voted_for is None


def test_a_candidate_counts_only_its_own_terms_votes() -> None:
    s = Solo()
    s.node.timeout_now()
    s.env.run(until=s.env.now + 1e-6)
    term = s.node.current_term
    assert s.node.role is Role.CANDIDATE and term == TERM + 1
    s.deliver(RequestVoteReply(1, term - 1, True))  # a grant from an earlier election
    assert s.node.role is Role.CANDIDATE
    s.g.checker.on_grant(1, 0, term)  # what replica 1 reports when it grants
    s.deliver(RequestVoteReply(1, term, True))
    assert s.node.role is Role.LEADER and s.g.checker.ok


def test_a_vote_needs_a_log_with_a_later_last_term_or_as_long() -> None:
    # the voter's log ends in term 3; candidates: longer but older last term (refused),
    # shorter with a later last term (granted)
    s = Solo(log=entries([1, 3], tag="v"))
    s.deliver(RequestVote(1, TERM + 1, 5, 2))
    s.deliver(RequestVote(2, TERM + 2, 1, 4))
    votes = [(dst, m.term, m.granted) for _, dst, m in s.sent if isinstance(m, RequestVoteReply)]
    assert votes == [(1, TERM + 1, False), (2, TERM + 2, True)]
