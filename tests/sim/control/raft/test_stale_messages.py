"""Messages of earlier terms change nothing (figure 2): a stale leader's AppendEntries does not
hold off a follower's election, and a stale AppendEntries reply does not raise a leader's
``matchIndex`` (so nothing commits on it).

One replica runs alone (its peers are down, so what it sends is only recorded); the tests
deliver the peers' messages by hand. The Hypothesis machines drive it with arbitrary stale and
current messages against a reference of the rules: the election timer restarts only on an
AppendEntries of the current (or a newer) term, and ``matchIndex`` is the highest index a
success reply *of the leader's term* acknowledged. Mutation harness: they kill the mutants
``stale-append-resets-timer`` and ``stale-append-reply-accepted`` (``mutants.py``), which
only the chaos sweep caught before.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sim.control.raft import Role
from sim.control.raft.messages import AppendEntriesReply

from .util import TERM, Solo

LO, HI = 0.150, 0.300  # RaftConfig's default election timeout range


def test_a_stale_leaders_heartbeats_do_not_hold_off_an_election() -> None:
    s = Solo()
    for _ in range(int(HI / 0.02) + 5):  # a stale leader heartbeats every 20 ms
        s.heartbeat(1, TERM - 1)
        s.env.run(until=s.env.now + 0.02)
    votes = s.vote_requests()
    assert votes and LO <= votes[0] <= HI + 1e-6  # timed from boot, not from the heartbeats
    replies = [m for _, dst, m in s.sent if isinstance(m, AppendEntriesReply) and dst == 1]
    assert replies and all(not m.success and m.term >= TERM for m in replies)
    assert s.node.leader_id is None  # the stale leader was never taken as leader


def test_a_current_leaders_heartbeats_do_hold_off_an_election() -> None:
    s = Solo()
    for _ in range(int(HI / 0.02) + 5):
        s.heartbeat(1, TERM)
        s.env.run(until=s.env.now + 0.02)
    assert s.vote_requests() == [] and s.node.leader_id == 1


def test_a_stale_success_reply_neither_raises_match_index_nor_commits() -> None:
    s = Solo()
    term = s.lead()
    index = s.write()
    before = dict(s.node.match_index)
    # replica 1 acknowledges the index in an earlier term (a reply delayed from an older
    # leadership, describing another log): it must not count
    s.deliver(AppendEntriesReply(1, term - 1, True, index, 0))
    assert s.node.match_index == before and s.node.commit_index == 0
    # the same acknowledgement in the current term commits the entry (one vote + its own)
    s.deliver(AppendEntriesReply(1, term, True, index, 0))
    assert s.node.match_index[1] == index and s.node.commit_index == index
    assert s.g.checker.ok, s.g.checker.violations


class FollowerTimer(RuleBasedStateMachine):
    """A follower or candidate fed stale and current heartbeats: its election timer restarts
    only on the current term's (reference: ``contact``, the time of the last one)."""

    def __init__(self) -> None:
        super().__init__()
        self.s = Solo()
        self.contact = 0.0  # boot

    @rule(src=st.sampled_from([1, 2]), back=st.integers(1, 3))
    def stale_heartbeat(self, src: int, back: int) -> None:
        self.s.heartbeat(src, self.s.node.current_term - back)

    @rule(src=st.sampled_from([1, 2]))
    def current_heartbeat(self, src: int) -> None:
        self.s.heartbeat(src, self.s.node.current_term)
        self.contact = self.s.env.now

    @rule(dt=st.floats(0.001, 0.12))
    def run(self, dt: float) -> None:
        self.s.env.run(until=self.s.env.now + dt)

    @invariant()
    def elects_on_time(self) -> None:
        since = [t for t in self.s.vote_requests() if t > self.contact]
        if self.s.env.now > self.contact + HI + 1e-6:
            assert since, f"no election {self.s.env.now - self.contact:.3f} s after contact"
        if since:
            assert since[0] >= self.contact + LO - 1e-9


class LeaderMatchIndex(RuleBasedStateMachine):
    """A leader fed success replies of its term and of earlier ones: ``matchIndex`` follows
    the reference (highest index acknowledged in the current term), and so does the commit
    index (the majority index, when it holds an entry of the current term)."""

    def __init__(self) -> None:
        super().__init__()
        self.s = Solo()
        self.term = self.s.lead()
        self.match = {1: 0, 2: 0}
        self.commit = 0

    @rule()
    def write(self) -> None:
        self.s.write()

    @rule(src=st.sampled_from([1, 2]), back=st.integers(0, 2), data=st.data())
    def success_reply(self, src: int, back: int, data: st.DataObject) -> None:
        node = self.s.node
        index = data.draw(st.integers(0, node.log.last_index))
        self.s.deliver(AppendEntriesReply(src, self.term - back, True, index, 0))
        if back == 0:
            self.match[src] = max(self.match[src], index)
        n = sorted([node.log.last_index, *self.match.values()], reverse=True)[1]
        if n > self.commit and node.log.term_at(n) == self.term:
            self.commit = n

    @invariant()
    def follows_the_reference(self) -> None:
        assert self.s.node.role is Role.LEADER
        assert self.s.node.match_index == self.match
        assert self.s.node.commit_index == self.commit


TestFollowerTimer = FollowerTimer.TestCase
TestFollowerTimer.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestLeaderMatchIndex = LeaderMatchIndex.TestCase
TestLeaderMatchIndex.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)
