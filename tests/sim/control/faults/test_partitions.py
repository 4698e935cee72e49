"""Partition shapes against their definitions, and the random fault schedule."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.control.faults import RandomFaultsCfg, hosts, partition_cuts, raft_hosts, random_schedule


def _reach(all_hosts: list[str], cuts: list[tuple[str, str]]) -> dict[str, set[str]]:
    cut = set(cuts)
    return {a: {b for b in all_hosts if (a, b) not in cut} for a in all_hosts}


sizes = st.tuples(st.integers(1, 4), st.integers(1, 5))


@given(sizes, st.data())
def test_isolate_cuts_exactly_the_target(sz: tuple[int, int], data: st.DataObject) -> None:
    hs = hosts(*sz)
    t = data.draw(st.sampled_from(hs))
    r = _reach(hs, partition_cuts("isolate", hs, t, raft_hosts(hs, 3), False))
    assert r[t] == {t}
    for h in hs:
        if h != t:
            assert r[h] == set(hs) - {t}


@given(sizes, st.data())
def test_one_way_cuts_one_direction_only(sz: tuple[int, int], data: st.DataObject) -> None:
    hs = hosts(*sz)
    t = data.draw(st.sampled_from(hs))
    shape = data.draw(st.sampled_from(["isolate", "halves", "majority-minority", "bridge"]))
    one = set(partition_cuts(shape, hs, t, raft_hosts(hs, 3), True))
    both = set(partition_cuts(shape, hs, t, raft_hosts(hs, 3), False))
    assert one <= both
    assert all((b, a) not in one for a, b in one)  # never both directions
    assert both == one | {(b, a) for a, b in one}


@given(st.integers(3, 9))
def test_majorities_ring_every_host_sees_a_distinct_majority(n: int) -> None:
    hs = [f"ps{i}" for i in range(n)]
    r = _reach(hs, partition_cuts("majorities-ring", hs, None, hs, False))
    for h in hs:
        assert len(r[h]) == min(3, n)
    if n == 5:  # the classic case: each sees a majority, no two the same one
        assert all(len(v) == 3 for v in r.values())
        assert len({frozenset(v) for v in r.values()}) == 5


@given(st.integers(3, 8), st.data())
def test_bridge_target_sees_everyone_halves_do_not(n: int, data: st.DataObject) -> None:
    hs = [f"node{i}" for i in range(n)]
    t = data.draw(st.sampled_from(hs))
    r = _reach(hs, partition_cuts("bridge", hs, t, hs, False))
    assert r[t] == set(hs)
    others = [h for h in hs if h != t]
    left = set(others[: len(others) // 2])
    for h in left:
        assert r[h] == left | {t}


def test_majority_minority_leaves_a_raft_majority_together() -> None:
    hs = hosts(3, 2)
    raft = raft_hosts(hs, 5)
    r = _reach(hs, partition_cuts("majority-minority", hs, "ps1", raft, False))
    assert r["ps1"] == {"ps1", "ps2"}  # target plus the next Raft host: 2 of 5
    assert r["node0"] == {"ps0", "node0", "node1"}


@given(st.integers(0, 2**32 - 1))
def test_random_schedule_is_a_pure_function_of_the_seed(seed: int) -> None:
    cfg = RandomFaultsCfg(enabled=True, rate=5.0, until=3.0)
    a = random_schedule(cfg, np.random.default_rng(seed), 2, 3, 3)
    b = random_schedule(cfg, np.random.default_rng(seed), 2, 3, 3)
    assert [f.model_dump() for f in a] == [f.model_dump() for f in b]
    times = [f.at for f in a]
    assert times == sorted(times) and all(cfg.start < t < cfg.until for t in times)
    assert {f.kind for f in a} <= {k for k, w in cfg.kinds.items() if w > 0}
    # Raft replicas always come back with their disks (diskless votes are unsafe)
    assert all(f.disk for f in a if f.kind == "kill" and (f.target or "").startswith("raft"))


def test_random_schedule_respects_zero_weights() -> None:
    cfg = RandomFaultsCfg(enabled=True, rate=50.0, until=3.0, kinds={"corrupt": 1.0})
    sched = random_schedule(cfg, np.random.default_rng(1), 2, 2, 3)
    assert len(sched) > 50 and {f.kind for f in sched} == {"corrupt"}
    assert all(f.target in ("ps0", "ps1") for f in sched)
