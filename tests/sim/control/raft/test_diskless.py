"""Restart without the disk: what ``sim/control/raft/node.py`` claims, tested.

Claims: (1) a replica that lost its disk neither votes nor campaigns until a leader has
shown it a current-term commit it matches; (2) so a single lost disk never loses a
committed entry; (3) with at most one replica without its data at a time, random fault
runs show no violation; (4) the known caveat is real: rejoining through a *stale* leader,
the replica can vote twice in a term -- and the checkers catch it.
"""

from __future__ import annotations

from typing import Any

import pytest

from sim.control.raft import Role
from sim.control.raft.nemesis import ChaosConfig, run_seed

from .util import make_group, wait_leader


def _write(env: Any, g: Any, target: int, key: str, value: Any) -> list[Any]:
    c = g.client(timeout=0.2, give_up=3.0)
    c._target = target
    out: list[Any] = []

    def go():  # type: ignore[no-untyped-def]
        out.append((yield env.process(c.call("put", key, value))))

    env.process(go())
    return out


def test_committed_entry_survives_one_lost_disk() -> None:
    env, g, tr = make_group(n=3, seed=11)
    g.start()
    a = wait_leader(env, g)
    b, c = [i for i in range(3) if i != a]
    tr.isolate(c)  # C misses the write: it is committed on A and B only
    out = _write(env, g, a, "k", "precious")
    env.run(until=env.now + 0.5)
    assert out == ["precious"] and g.nodes[c].log.last_index == 0
    g.crash(b)
    g.restart(b, with_disk=False)  # B forgets it ever stored the entry
    assert g.nodes[b].recovering
    g.crash(a)
    tr.heal()
    env.run(until=env.now + 2.0)
    # C would win with B's vote and erase the entry; B refuses while recovering
    assert g.leader() is None
    assert g.nodes[b].voted_for is None and g.nodes[b].role is Role.FOLLOWER
    g.restart(a)
    lead = wait_leader(env, g)
    assert lead != b
    out2 = _write(env, g, lead, "k2", "next")  # a current-term commit ends B's recovery
    env.run(until=env.now + 2.0)
    assert out2 == ["next"]
    assert not g.nodes[b].recovering  # caught up through the new leader
    for x in g.nodes:
        assert x.log.last_index >= 1 and x.log.entry(1).command.value == "precious"
    assert g.checker.ok, g.checker.violations


def test_recovering_replica_does_not_campaign() -> None:
    env, g, tr = make_group(n=3, seed=2)
    g.start()
    a = wait_leader(env, g)
    other = (a + 1) % 3
    g.crash(other)
    g.restart(other, with_disk=False)
    tr.isolate(a)
    env.run(until=env.now + 3.0)
    assert g.nodes[other].current_term == 0 or g.nodes[other].role is Role.FOLLOWER
    assert all(v != other for v in g.checker.leaders.values())
    assert g.nodes[other].recovering


@pytest.mark.parametrize("with_disk", [True, False])
def test_double_vote_caveat(with_disk: bool) -> None:
    """5 replicas. Term 7 is won by node 3 with node 2's vote; node 2 then restarts and
    rejoins through node 0, a stale leader of term 6. With its disk, node 2 remembers its vote
    and node 1 cannot win term 7; without it, node 2 votes again and two leaders of term 7
    exist -- Election Safety breaks, and the checker reports it."""
    env, g, tr = make_group(n=5, seed=0)
    for x in g.nodes:
        x.load_state(5, None, [])
    g.start()
    g.nodes[0].timeout_now()
    env.run(until=0.05)
    assert g.leader() == 0 and g.nodes[0].current_term == 6
    assert _write(env, g, 0, "k", 1) is not None
    env.run(until=0.3)
    assert all(x.commit_index == 1 for x in g.nodes)
    tr.partition([[0, 1], [2, 3, 4]])
    g.nodes[3].timeout_now()
    env.run(until=0.35)
    assert g.checker.leaders[7] == 3 and g.nodes[2].voted_for == 3
    g.crash(2)
    g.restart(2, with_disk=with_disk)
    tr.partition([[0, 1, 2], [3, 4]])
    env.run(until=0.5)
    g.nodes[1].timeout_now()
    env.run(until=0.6)
    if with_disk:
        assert g.checker.ok, g.checker.violations
        assert g.checker.leaders.get(7) == 3
    else:
        assert not g.nodes[2].recovering  # it caught up through the stale leader
        (v,) = [v for v in g.checker.violations if v.prop == "Election Safety"]
        assert v.terms == (7,) and v.nodes == (3, 1)


@pytest.mark.parametrize("n", [3, 5])
def test_random_faults_with_one_lost_disk_at_a_time(n: int) -> None:
    cfg = ChaosConfig(n=n, diskless=0.3)
    bad = [r for r in (run_seed(s, cfg) for s in range(30)) if not r.ok]
    assert bad == []


@pytest.mark.slow
def test_random_faults_with_lost_disks_many_seeds() -> None:
    for n in (3, 5):
        cfg = ChaosConfig(n=n, diskless=0.3)
        bad = [r.seed for r in (run_seed(s, cfg) for s in range(300)) if not r.ok]
        assert bad == []
