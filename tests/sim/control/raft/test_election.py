"""Leader election: initial election, re-election after a leader crash (within a bound of
election timeouts), no leader without a quorum, and Election Safety under split votes."""

from __future__ import annotations

import pytest

from sim.control.raft import UNKNOWN, Role

from .util import make_group, wait_leader

LO, HI = 0.150, 0.300  # RaftConfig's default election timeout range


@pytest.mark.parametrize("n", [3, 5])
def test_initial_election(n: int) -> None:
    env, g, _ = make_group(n=n, seed=1)
    g.start()
    lead = wait_leader(env, g)
    # the first leader cannot appear before the shortest election timeout has passed
    assert env.now >= LO
    env.run(until=env.now + 1.0)
    assert g.leader() == lead  # stable: heartbeats keep followers from starting elections
    term = g.nodes[lead].current_term
    assert all(x.current_term == term for x in g.nodes)
    assert all(x.leader_id == lead for x in g.nodes)
    assert sum(x.role is Role.LEADER for x in g.nodes) == 1
    assert g.checker.ok


@pytest.mark.parametrize("seed", range(12))
def test_reelection_after_leader_crash_within_bound(seed: int) -> None:
    env, g, _ = make_group(n=5, seed=seed)
    g.start()
    old = wait_leader(env, g)
    env.run(until=env.now + 0.5)
    t0 = env.now
    old_term = g.nodes[old].current_term
    g.crash(old)
    new = wait_leader(env, g)
    took = env.now - t0
    assert new != old and g.nodes[new].current_term > old_term
    # followers heard a heartbeat at most one heartbeat interval before the crash, so no
    # election can start earlier than LO - heartbeat; without loss one or two election rounds
    # suffice (a split vote costs one more timeout)
    assert LO - 0.05 <= took <= 3 * HI
    assert g.checker.ok


def test_no_leader_without_quorum_then_recovery() -> None:
    env, g, tr = make_group(n=5, seed=3)
    g.start()
    old = wait_leader(env, g)
    old_term = g.nodes[old].current_term
    others = [i for i in range(5) if i != old]
    for node in [old, *others[:2]]:  # the leader and two more: the remaining two are a minority
        tr.isolate(node)
    c = g.client(timeout=0.2, give_up=1.5)
    outcome: list[object] = []

    def write():  # type: ignore[no-untyped-def]
        outcome.append((yield env.process(c.call("put", "k", 1))))

    env.process(write())
    commits = [x.commit_index for x in g.nodes]
    env.run(until=env.now + 3.0)
    assert all(t <= old_term for t in g.checker.leaders)  # no new leader elected
    assert [x.commit_index for x in g.nodes] == commits  # nothing commits
    assert outcome == [UNKNOWN]
    # the minority kept trying: terms went up, but no one won
    assert max(g.nodes[i].current_term for i in others[2:]) > old_term + 2
    tr.heal()  # the stale leader steps down on hearing the higher term; a new one is elected
    env.process(write())
    env.run(until=env.now + 2.0)
    new = g.leader()
    assert new is not None and g.nodes[new].current_term > old_term
    assert g.nodes[old].role is not Role.LEADER or old == new
    assert outcome[-1] == 1  # the write now commits
    assert g.checker.ok


def test_election_safety_under_loss_and_contention() -> None:
    """Tight timeout range + loss -> many split votes; still one leader per term."""
    for seed in range(5):
        env, g, _ = make_group(n=5, seed=seed, loss=0.2, election_timeout=(0.15, 0.16))
        g.start()
        env.run(until=5.0)
        assert g.checker.ok, g.checker.violations
        assert len(g.checker.leaders) >= 1
