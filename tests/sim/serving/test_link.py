"""A link on its own: validation, binding to one network, fault state and counters while
unbound (the flows over a bound link are tested in test_network.py)."""

from __future__ import annotations

import pytest
import simpy

from sim.serving.link import Link, LinkDown
from sim.serving.network import Network


def test_bad_parameters_are_refused() -> None:
    env = simpy.Environment()
    for bw in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="bandwidth"):
            Link(env, "l", bw, 0.0)
    with pytest.raises(ValueError, match="latency and jitter"):
        Link(env, "l", 1.0, -1e-6)
    with pytest.raises(ValueError, match="latency and jitter"):
        Link(env, "l", 1.0, 0.0, jitter=-1.0)
    link = Link(env, "l", 1.0, 0.0)
    with pytest.raises(ValueError, match="mode"):
        link.set_down("bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bandwidth"):
        link.set_bandwidth(0.0)
    assert link.bandwidth == 1.0


def test_unbound_link_records_faults_and_bandwidth_itself() -> None:
    env = simpy.Environment()
    link = Link(env, "l", 100.0, 0.5)
    assert (link.network, link.index, link.n_flows) == (None, -1, 0)
    link.set_down("hold")
    assert (link.up, link.down_mode) == (False, "hold")
    link.set_up()
    assert (link.up, link.down_mode) == (True, None)
    link.set_bandwidth(40.0)
    assert link.bandwidth == 40.0


def test_a_link_belongs_to_one_network_for_good() -> None:
    env = simpy.Environment()
    a, b = Network(env), Network(env)
    first = a.add_link("x", 10.0, 0.0)
    second = Link(env, "y", 10.0, 0.0)
    b.transfer([second], 5)  # attaches it to b as b's link 0
    assert (first.network, first.index) == (a, 0)
    assert (second.network, second.index) == (b, 0)
    with pytest.raises(ValueError, match="belongs to a network already"):
        second.bind(a, 1)
    with pytest.raises(ValueError, match="another network"):
        a.transfer([second], 5)


def test_utilisation_is_carried_bytes_over_bandwidth_and_time() -> None:
    env = simpy.Environment()
    link = Link(env, "l", 100.0, 0.0)
    assert link.utilisation() == 0.0  # no time has passed
    env.run(until=2.0)
    link.bytes_carried = 50.0
    assert link.carried() == 50.0  # unbound: no in-flight progress
    assert link.utilisation() == 50.0 / (100.0 * 2.0)


def test_link_down_names_the_link_and_the_time() -> None:
    err = LinkDown("rdma0", 1.5)
    assert (err.link, err.at, err.args) == ("rdma0", 1.5, ("rdma0", 1.5))
    assert str(err) == "link 'rdma0' went down at t=1.500000s"
