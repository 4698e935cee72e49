"""Log replication: client writes through the leader with redirection, the paper's figure 7
follower logs repaired, and the figure 8 commit rule."""

from __future__ import annotations

from typing import Any

import pytest

from sim.control.raft import SafetyViolation

from .util import entries, make_group, wait_leader


def test_writes_commit_apply_everywhere_and_redirect() -> None:
    env, g, _ = make_group(n=5, seed=2, loss=0.05, duplicate=0.05)
    g.start()
    lead = wait_leader(env, g)
    follower = (lead + 1) % 5
    c = g.client(timeout=0.2)
    c._target = follower  # first attempt goes to a follower: it must redirect
    results: list[Any] = []

    def load():  # type: ignore[no-untyped-def]
        for i in range(30):
            results.append((yield env.process(c.call("put", f"k{i % 4}", i))))
        results.append((yield env.process(c.call("get", "k1"))))

    env.process(load())
    env.run(until=env.now + 5.0)
    assert results == [*range(30), 29]
    assert c.redirects >= 1
    # every acknowledged command is applied, in the same order, on every replica
    assert len({tuple(x.applied) for x in g.nodes}) == 1
    assert all(x.sm.data == {"k0": 28, "k1": 29, "k2": 26, "k3": 27} for x in g.nodes)
    # an ack means committed on a majority
    for h in c.history:
        assert sum(x.log.last_index >= h.index for x in g.nodes) >= 3
    assert g.checker.ok


def test_retry_is_applied_once() -> None:
    """A request whose reply is lost is retried with the same (client, seq): applied once."""
    env, g, tr = make_group(n=3, seed=4)
    g.start()
    lead = wait_leader(env, g)
    c = g.client(timeout=0.2)
    c._target = lead
    tr.one_way_block(lead, c.id)  # replies from the leader are lost
    out: list[Any] = []

    def one():  # type: ignore[no-untyped-def]
        out.append((yield env.process(c.call("put", "x", "v"))))

    env.process(one())
    env.run(until=env.now + 0.5)
    tr.heal()
    env.run(until=env.now + 2.0)
    assert out == ["v"]
    applied = [cmd for cmd in g.nodes[lead].applied if cmd.key == "x"]
    assert len(applied) >= 2  # the retry was appended again...
    assert g.nodes[lead].sm._last[c.id] == (1, "v")  # ...but took effect once


# The paper's figure 7: the leader of term 8 and six possible follower logs (a)-(f).
FIG7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIG7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


def _fig7_logs() -> list[list[Any]]:
    lead = entries(FIG7_LEADER)
    logs = [lead]
    for terms in FIG7_FOLLOWERS.values():
        # shared prefix entries are identical to the leader's (Log Matching); the rest differ
        same = 0
        while same < min(len(terms), len(FIG7_LEADER)) and terms[same] == FIG7_LEADER[same]:
            same += 1
        tail = entries(terms, tag="f")[same:]
        if terms == FIG7_FOLLOWERS["c"] or terms == FIG7_FOLLOWERS["d"]:
            tail = entries(terms, tag=f"f{len(terms)}")[same:]
        logs.append(lead[:same] + tail)
    return logs


def test_figure7_follower_logs_are_repaired() -> None:
    env, g, _ = make_group(n=7, seed=0, keep_trace=True)
    for node, log in zip(g.nodes, _fig7_logs(), strict=True):
        node.load_state(term=7, voted_for=None, entries=log)
    g.start()
    g.nodes[0].timeout_now()
    env.run(until=0.05)
    assert g.leader() == 0 and g.nodes[0].current_term == 8
    env.run(until=1.0)
    want = [e.term for e in g.nodes[0].log.entries()]
    assert want == FIG7_LEADER
    # every follower now holds the leader's log as a prefix; (c) and (d) keep their extra
    # entries until the leader sends an entry at those indices (Raft deletes only on conflict)
    lead_log = g.nodes[0].log.entries()
    for node in g.nodes:
        assert node.log.entries()[:10] == lead_log, node.id
    assert [x.log.last_index for x in g.nodes] == [10, 10, 10, 11, 12, 10, 10]
    # figure 8 rule: no entry of term 8 yet, so nothing may commit although all logs match
    assert all(x.commit_index == 0 for x in g.nodes)
    c = g.client()
    c._target = 0
    out: list[Any] = []

    def one():  # type: ignore[no-untyped-def]
        out.append((yield env.process(c.call("put", "z", 1))))

    env.process(one())
    env.run(until=2.0)
    assert out == [1]
    for node in g.nodes:  # the term-8 entry at index 11 replaced (c)'s and (d)'s extra entries
        assert node.log.entries() == g.nodes[0].log.entries(), node.id
        assert node.commit_index == 11 and node.last_applied == 11
    assert g.checker.ok


def _campaign(env: Any, g: Any, node: int) -> None:
    """Make ``node`` stand for election quickly and repeatedly (its first tries may use a
    stale term) until it leads or five tries have failed."""
    for _ in range(5):
        g.nodes[node].timeout_now()
        env.run(until=env.now + 0.01)
        if g.leader() == node:
            return


def _figure8(unsafe: bool, leader_writes: bool) -> Any:
    """Figure 8 of the paper with S1..S5 = nodes 0..4, starting in its state (b):
    S1 (leader of term 2) stored index 2 on S2 only and crashed; S5 was elected in term 3
    with votes of S3, S4, S5, stored a different index 2 only on itself and crashed."""
    env, g, _ = make_group(n=5, seed=0, unsafe_commit_old_terms=unsafe)
    one = entries([1])
    e2 = entries([1, 2], tag="s1")[1]
    e3 = entries([1, 3], tag="s5")[1]
    g.nodes[0].load_state(2, 0, [*one, e2])
    g.nodes[1].load_state(2, 0, [*one, e2])
    g.nodes[2].load_state(3, 4, one)
    g.nodes[3].load_state(3, 4, one)
    g.nodes[4].load_state(3, 4, [*one, e3])
    g.start(nodes=[0, 1, 2, 3])  # S5 is down
    # (c) S1 restarts and is elected in term 4 (needs term > 3: it runs twice if needed)
    for _ in range(3):
        g.nodes[0].timeout_now()
        env.run(until=env.now + 0.05)
        if g.leader() == 0:
            break
    assert g.leader() == 0 and g.nodes[0].current_term >= 4
    env.run(until=env.now + 0.3)
    # index 2 (term 2) is now stored on S1, S2, S3, S4: a majority
    assert sum(x.log.last_index >= 2 and x.log.term_at(2) == 2 for x in g.nodes) >= 4
    if leader_writes:
        c = g.client()
        c._target = 0
        env.process(c.call("put", "new", 4))
        env.run(until=env.now + 0.3)
    return env, g, e2, e3


def test_figure8_old_term_entry_not_committed_by_counting() -> None:
    env, g, _, e3 = _figure8(unsafe=False, leader_writes=False)
    assert all(x.commit_index == 0 for x in g.nodes)  # counting alone commits nothing
    # (d) S1 crashes, S5 comes back and wins (its last term 3 beats term 2), overwriting
    # index 2 -- legal, because index 2 was never committed
    g.crash(0)
    g.restart(4)
    _campaign(env, g, 4)
    assert g.leader() == 4
    env.run(until=env.now + 0.3)
    assert all(x.log.entry(2) == e3 for x in g.nodes[1:])
    assert g.checker.ok, g.checker.violations


def test_figure8_current_term_entry_commits_old_one_for_good() -> None:
    env, g, e2, _ = _figure8(unsafe=False, leader_writes=True)
    # (e) a term-4 entry reached a majority: index 3 commits, and index 2 with it
    assert g.nodes[0].commit_index == 3 and g.nodes[0].applied[1] == e2.command
    g.crash(0)
    g.restart(4)
    _campaign(env, g, 4)
    env.run(until=env.now + 1.0)
    lead = g.leader()
    assert lead is not None and lead != 4  # S5 can never win again
    assert all(x.log.entry(2) == e2 for x in g.nodes if x.id != 4 or x.log.last_index >= 2)
    assert g.checker.ok


@pytest.mark.parametrize("strict", [False, True])
def test_figure8_planted_bug_is_caught(strict: bool) -> None:
    env, g, e2, e3 = _figure8(unsafe=True, leader_writes=False)
    g.checker.strict = strict
    # the bug: S1 committed (and applied) term-2 index 2 by counting replicas
    assert g.nodes[0].commit_index == 2 and g.nodes[0].applied[1] == e2.command
    g.crash(0)
    g.restart(4)
    try:
        _campaign(env, g, 4)
        env.run(until=env.now + 0.2)
    except SafetyViolation as exc:
        assert strict and exc.violation.prop == "Leader Completeness"
        return
    assert not strict
    props = {v.prop for v in g.checker.violations}
    assert "Leader Completeness" in props, g.checker.violations
    v = next(v for v in g.checker.violations if v.prop == "Leader Completeness")
    assert v.nodes == (4,) and v.indices == (2,)
    # and once S5 overwrites index 2, replicas apply different commands there
    env.run(until=env.now + 0.5)
    assert any(x.log.last_index >= 2 and x.log.entry(2) == e3 for x in g.nodes[1:4])
    assert "State Machine Safety" in {v.prop for v in g.checker.violations}
