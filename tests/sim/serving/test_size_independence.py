"""Per-event work that does not grow with the cluster (issue 36): the network's rate
allocation gives the same rates, link rates and completion times, bit for bit, however many
idle links the network holds; a cluster's sample row equals the sums over its replicas."""

from __future__ import annotations

from typing import Any

import numpy as np
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster import build
from sim.scenario import validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.link import Link
from sim.serving.models import load_catalogue
from sim.serving.network import Network

_SPEC = st.lists(
    st.tuples(
        st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True),  # path (busy links)
        st.integers(0, 2),  # priority
        st.integers(1, 50),  # size in MB
        st.sampled_from([0.0, 0.25, 0.5]),  # start time
    ),
    min_size=1,
    max_size=25,
)


def _run(
    spec: list[tuple[list[int], int, int, float]],
    idle: list[int],
    mode: str,
    down: int | None,
) -> tuple[list[tuple[float, int]], list[tuple[float, float, float]], dict[str, float]]:
    """Run the transfers of ``spec`` on 5 busy links, with ``idle[k]`` idle links added before
    busy link ``k`` (``idle[5]``: after the last); returns each transfer's (finish time,
    bytes), every busy link's (bytes carried, busy time, utilisation) at the end, and every
    rate the busy links had at the instants the transfers start."""
    env = simpy.Environment()
    net = Network(env, priority_mode=mode)  # type: ignore[arg-type]
    busy: list[Link] = []
    bandwidths = [3e8, 7e8, 1e9, 1.25e9, 5e8]
    for k in range(5):
        for i in range(idle[k]):
            net.add_link(f"idle{k}.{i}", 1e9, 1e-4)
        busy.append(net.add_link(f"busy{k}", bandwidths[k], 1e-4))
    for i in range(idle[5]):
        net.add_link(f"idle5.{i}", 1e9, 1e-4)
    if down is not None:
        busy[down].set_down("hold")
    done: list[tuple[float, int]] = [(-1.0, -1)] * len(spec)

    def proc(i: int, path: list[int], prio: int, mb: int, at: float) -> Any:
        yield env.timeout(at)
        value = yield net.transfer([busy[j] for j in path], mb * 10**6, prio)
        done[i] = (float(env.now), int(value))

    for i, (path, prio, mb, at) in enumerate(spec):
        env.process(proc(i, path, prio, mb, at))
    rates: dict[str, float] = {}
    for t in (0.1, 0.3, 0.6):
        env.run(until=t)
        rates.update({f"{lk.name}@{t}": lk.rate for lk in busy})
    if down is not None:
        busy[down].set_up()
    env.run()
    counters = [(lk.bytes_carried, lk.busy_time, lk.utilisation()) for lk in busy]
    return done, counters, rates


@settings(max_examples=60, deadline=None)
@given(
    spec=_SPEC,
    idle=st.lists(st.integers(0, 30), min_size=6, max_size=6),
    mode=st.sampled_from(["weighted", "strict"]),
    down=st.one_of(st.none(), st.integers(0, 4)),
)
def test_idle_links_change_no_rate_and_no_finish_time(
    spec: list[tuple[list[int], int, int, float]], idle: list[int], mode: str, down: int | None
) -> None:
    """The same transfers with and without idle links interleaved finish at the same
    instants (==) with the same link counters and rates: the allocation only numbers the
    links its flows cross, and renumbering never changes a rate."""
    assert _run(spec, idle, mode, down) == _run(spec, [0] * 6, mode, down)


def test_idle_links_keep_rate_zero_and_count_nothing() -> None:
    env = simpy.Environment()
    net = Network(env)
    idle = [net.add_link(f"idle{i}", 1e9, 0.0) for i in range(100)]
    a = net.add_link("a", 1e9, 0.0)
    ev = net.transfer([a], 10**9)
    env.run()
    assert ev.ok and env.now == 1.0 and a.busy_time == 1.0
    assert all(lk.rate == 0.0 and lk.bytes_carried == 0.0 and lk.busy_time == 0.0 for lk in idle)


_CLUSTER: dict[str, Any] = {
    "name": "sampler",
    "deployments": [{"model": "llama-2-7b"}],
    "cluster": {"servers": 3, "param_servers": 1, "replica": {"max_num_seqs": 4}},
    "workload": {"requests": 24, "rate": 40.0, "input_tokens": {"mean": 128}},
}


def test_a_sample_row_is_the_sums_over_the_replicas() -> None:
    """One pass over the replicas per row gives what a sum over each figure gives."""
    sc = validate(_CLUSTER)
    cl = build(sc, 3, load_catalogue(sc.catalogue), load_profile(sc.profile), CostModel)
    cl._start()
    cl.env.run(until=0.6)  # mid-run: queues, running requests and KV in use
    nodes = cl.ctx.nodes
    assert sum(n.running for n in nodes) > 0
    met = cl.ctx.metrics
    before = len(met.samples)
    next(cl._sampler(1.0))
    row = met.samples[before]
    n_tiers = len(met.tier_hits)
    head = row[:5]
    tail = row[5 + 2 * n_tiers :]
    assert head == (
        cl.env.now,
        met.n_arrived,
        met.n_final,
        sum(n.qlen for n in nodes),
        sum(n.running for n in nodes),
    )
    assert tail == (
        sum(n.ws.hbm.used for n in nodes),
        sum(n.kv.reserved for n in nodes),
        float(np.mean([n.kv.fragmentation() for n in nodes])),
        met.accesses,
        sum(n.busy for n in nodes),
        sum(n.tok_s for n in nodes),
        sum(n.preemptions for n in nodes),
    )
