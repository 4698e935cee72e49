"""The metadata transport over the simulated network: cuts, pauses, NIC state, latency."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import simpy

from sim.control.metaservice import NetTransport, Reachability


def _setup(rpc: tuple[float, float] = (0.001, 0.0)) -> tuple[simpy.Environment, NetTransport, dict]:
    env = simpy.Environment()
    hosts = ["ps0", "ps1", "node0"]
    reach = Reachability(hosts)
    nics = {h: SimpleNamespace(up=True, latency=0.0001) for h in hosts}
    where = {0: "ps0", 1: "ps1", 2: "node0"}
    tr = NetTransport(
        env, np.random.default_rng(0), reach, where.__getitem__, nics.__getitem__, rpc
    )
    got: dict[int, list] = {i: [] for i in where}
    for i in where:
        tr.register(i, lambda m, i=i: got[i].append((env.now, m)))
    return env, tr, {"reach": reach, "nics": nics, "got": got}


def test_latency_is_both_nics_plus_rpc() -> None:
    env, tr, s = _setup()
    tr.send(0, 1, "hi")
    env.run(until=1.0)
    ((t, m),) = s["got"][1]
    assert m == "hi" and abs(t - (0.0002 + 0.001)) < 1e-12


def test_one_way_cut_and_nic_down_drop() -> None:
    env, tr, s = _setup()
    s["reach"].cuts = {("ps0", "ps1")}
    tr.send(0, 1, "a")
    tr.send(1, 0, "b")
    s["nics"]["node0"].up = False
    tr.send(0, 2, "c")
    env.run(until=1.0)
    assert s["got"][1] == [] and [m for _, m in s["got"][0]] == ["b"] and s["got"][2] == []
    assert tr.dropped == 2


def test_cut_after_send_drops_at_delivery() -> None:
    env, tr, s = _setup()
    tr.send(0, 1, "a")
    s["reach"].cuts = {("ps0", "ps1")}
    env.run(until=1.0)
    assert s["got"][1] == [] and tr.dropped == 1


def test_pause_holds_messages_in_order_until_resume() -> None:
    env, tr, s = _setup()
    s["reach"].paused["ps1"] = 1
    for k in range(3):
        tr.send(0, 1, k)
    env.run(until=0.5)
    assert s["got"][1] == []
    del s["reach"].paused["ps1"]
    tr.resume("ps1")
    assert [m for _, m in s["got"][1]] == [0, 1, 2]


def test_loss_and_duplication_follow_the_probabilities() -> None:
    env, tr, s = _setup((0.001, 0.002))
    s["reach"].base_loss = 0.3
    s["reach"].base_duplicate = 0.2
    n = 4000
    for k in range(n):
        tr.send(0, 1, k)
    env.run(until=1.0)
    delivered = len(s["got"][1])
    assert 0.25 < tr.dropped / n < 0.35
    assert abs(delivered - (n - tr.dropped) - tr.duplicated) == 0
    assert 0.15 < tr.duplicated / (n - tr.dropped) < 0.25
