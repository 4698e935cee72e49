"""SimTransport: latency bounds, loss/duplication rates, partition rules, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from engine.errors import InputError
from sim.control.raft import SimTransport


def _net(
    seed: int = 0, **kw: float
) -> tuple[simpy.Environment, SimTransport, dict[int, list[tuple[float, str]]]]:
    env = simpy.Environment()
    tr = SimTransport(env, np.random.default_rng(seed), **kw)  # type: ignore[arg-type]
    got: dict[int, list[tuple[float, str]]] = {}
    for node in (0, 1, 2, 3, 1000):
        got[node] = []
        tr.register(node, lambda m, n=node: got[n].append((env.now, m)))
    return env, tr, got


def test_latency_within_min_plus_jitter() -> None:
    env, tr, got = _net(latency=(0.002, 0.003))
    for i in range(200):
        tr.send(0, 1, f"m{i}")
    env.run()
    times = [t for t, _ in got[1]]
    assert len(times) == 200
    assert min(times) >= 0.002 and max(times) <= 0.005
    assert max(times) - min(times) > 0.002  # jitter is really applied


def test_loss_and_duplication_rates() -> None:
    env, tr, got = _net(loss=0.3, duplicate=0.2)
    for i in range(4000):
        tr.send(0, 1, i)
    env.run()
    distinct = {m for _, m in got[1]}
    assert 0.65 < len(distinct) / 4000 < 0.75
    dupes = len(got[1]) - len(distinct)
    assert 0.15 < dupes / len(distinct) < 0.25
    assert tr.sent == 4000 and tr.delivered == len(got[1])


def test_partition_isolate_one_way_heal() -> None:
    env, tr, got = _net()
    tr.partition([[0, 1], [2, 3]])
    for a, b in [(0, 1), (0, 2), (3, 2), (1, 3), (1000, 2), (2, 1000)]:
        tr.send(a, b, f"{a}->{b}")
    env.run()
    assert [m for _, m in got[1]] == ["0->1"]
    assert sorted(m for _, m in got[2]) == ["1000->2", "3->2"]  # clients reach all groups
    assert [m for _, m in got[1000]] == ["2->1000"]
    assert got[3] == []
    tr.heal()
    tr.isolate(2)
    tr.one_way_block(0, 1)
    for a, b in [(0, 1), (1, 0), (2, 3), (1000, 2), (3, 0)]:
        tr.send(a, b, f"{a}->{b}")
    env.run()
    assert sorted(m for _, m in got[0]) == ["1->0", "3->0"]
    assert [m for _, m in got[1]] == ["0->1"]  # only the earlier message
    assert sorted(m for _, m in got[2]) == ["1000->2", "3->2"]
    tr.heal()
    tr.send(0, 1, "after heal")
    env.run()
    assert got[1][-1][1] == "after heal"


def test_partition_drops_messages_in_flight() -> None:
    env, tr, got = _net(latency=(0.01, 0.0))
    tr.send(0, 1, "in flight")
    env.run(until=0.005)
    tr.isolate(1)
    env.run()
    assert got[1] == [] and tr.dropped == 1


def test_same_seed_same_schedule() -> None:
    runs = []
    for _ in range(2):
        env, tr, got = _net(seed=5, loss=0.2, duplicate=0.1)
        for i in range(100):
            tr.send(i % 3, (i + 1) % 3, i)
        env.run()
        runs.append({k: list(v) for k, v in got.items()})
    assert runs[0] == runs[1]


def test_bad_knobs_rejected() -> None:
    env = simpy.Environment()
    with pytest.raises(InputError, match="loss"):
        SimTransport(env, np.random.default_rng(0), loss=1.5)
    with pytest.raises(InputError, match="latency"):
        SimTransport(env, np.random.default_rng(0), latency=(-1.0, 0.0))
    tr = SimTransport(env, np.random.default_rng(0))
    with pytest.raises(InputError, match="two groups"):
        tr.partition([[0, 1], [1, 2]])
