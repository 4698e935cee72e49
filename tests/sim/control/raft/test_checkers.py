"""Each online checker reports the violation it exists for (and nothing on a good run)."""

from __future__ import annotations

import pytest

from sim.control.raft import Command, Entry, RaftLog, SafetyChecker, SafetyViolation

from .util import entries


def cmd(i: int) -> Command:
    return Command("put", "k", i, 1, i)


def test_election_safety() -> None:
    c = SafetyChecker()
    c.on_leader(1.0, 0, 3, RaftLog())
    c.on_leader(1.5, 0, 3, RaftLog())  # same leader again: fine
    assert c.ok
    c.on_leader(2.0, 1, 3, RaftLog())
    (v,) = c.violations
    assert v.prop == "Election Safety" and v.nodes == (0, 1) and v.terms == (3,)
    assert "t=2.000000 Election Safety" in str(v)


def test_append_entries_only_from_the_leader_of_their_term() -> None:
    c = SafetyChecker()
    c.on_leader(1.0, 1, 5, RaftLog())
    c.on_append_sent(1.1, 1, 2, 5)  # the leader of term 5
    assert c.ok
    c.on_append_sent(1.2, 0, 2, 5)  # replica 0 never became leader of term 5
    c.on_append_sent(1.3, 1, 2, 6)  # nor did 1 of term 6 (no leader yet)
    assert [(v.prop, v.nodes, v.terms) for v in c.violations] == [
        ("Election Safety", (0, 2), (5,)),
        ("Election Safety", (1, 2), (6,)),
    ]
    assert "its leader: 1" in c.violations[0].detail
    assert "its leader: None" in c.violations[1].detail


def test_leader_append_only_and_committed_truncation() -> None:
    c = SafetyChecker()
    c.on_truncate(1.0, 2, False, 4, 5, 3)  # follower drops uncommitted entries: fine
    assert c.ok
    c.on_truncate(1.0, 2, True, 4, 5, 3)
    c.on_truncate(1.0, 1, False, 4, 3, 3)
    assert [v.prop for v in c.violations] == ["Leader Append-Only", "State Machine Safety"]


def test_log_matching() -> None:
    c = SafetyChecker()
    e = Entry(2, cmd(1))
    c.on_store(0.0, 0, 5, e, 2)
    c.on_store(0.1, 1, 5, e, 2)  # same entry after the same predecessor term
    c.on_store(0.1, 1, 6, Entry(2, cmd(2)), 2)
    assert c.ok
    c.on_store(0.2, 2, 5, Entry(2, cmd(9)), 2)  # same (index, term), other command
    c.on_store(0.3, 2, 6, Entry(2, cmd(2)), 1)  # same entry, different prefix
    assert [v.prop for v in c.violations] == ["Log Matching", "Log Matching"]
    assert c.violations[1].indices == (6,)


def test_leader_completeness() -> None:
    c = SafetyChecker()
    log = RaftLog(entries([1, 1, 2]))
    c.on_commit(0.0, 0, log, 0, 2)
    assert c.committed_terms == [1, 1]
    c.on_leader(1.0, 1, 3, RaftLog(entries([1, 1])))
    assert c.ok
    c.on_leader(2.0, 2, 4, RaftLog(entries([1, 3, 3])))
    (v,) = c.violations
    assert v.prop == "Leader Completeness" and v.indices == (2,) and v.terms == (4, 1)
    c2 = SafetyChecker()
    c2.on_commit(0.0, 0, log, 0, 3)
    c2.on_leader(1.0, 1, 5, RaftLog(entries([1, 1])))  # too short
    assert not c2.ok


def test_state_machine_safety_and_acks() -> None:
    c = SafetyChecker()
    c.on_apply(0.0, 0, 1, cmd(1))
    c.on_apply(0.1, 1, 1, cmd(1))
    c.on_ack(0.1, 0, 1, cmd(1))
    assert c.ok
    c.on_apply(0.2, 2, 1, cmd(7))
    props = [v.prop for v in c.violations]
    assert props == ["State Machine Safety", "Acknowledged write lost"]
    c.check_acked_present(1.0, 0, [cmd(1)])
    assert len(c.violations) == 2
    c.check_acked_present(1.0, 2, [cmd(7)])
    assert c.violations[-1].prop == "Acknowledged write lost"
    c3 = SafetyChecker()
    c3.on_ack(0.0, 0, 4, cmd(4))  # ack of something never applied
    assert not c3.ok


def test_commit_conflict() -> None:
    c = SafetyChecker()
    c.on_commit(0.0, 0, RaftLog(entries([1, 1])), 0, 2)
    c.on_commit(0.5, 1, RaftLog(entries([1, 2])), 0, 2)
    (v,) = c.violations
    assert v.prop == "State Machine Safety" and v.indices == (2,) and v.terms == (1, 2)


def test_strict_raises() -> None:
    c = SafetyChecker(strict=True)
    c.on_leader(0.0, 0, 1, RaftLog())
    with pytest.raises(SafetyViolation, match="Election Safety") as info:
        c.on_leader(0.0, 1, 1, RaftLog())
    assert info.value.violation.nodes == (0, 1)
