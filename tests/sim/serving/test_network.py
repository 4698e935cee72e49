"""Tests for sim.serving.network: processor sharing, max-min fairness, priorities, faults, counters."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from sim.serving.link import Link, LinkDown
from sim.serving.network import Network

GB = 1e9


def _run_transfer(env: simpy.Environment, net: Network, path, nbytes, at=0.0, priority=0, log=None):
    def proc():
        if at:
            yield env.timeout(at)
        start = env.now
        value = yield net.transfer(path, nbytes, priority)
        if log is not None:
            log.append((start, env.now, value))

    return env.process(proc())


def test_single_flow_time_is_latency_plus_bytes_over_bandwidth() -> None:
    env = simpy.Environment()
    net = Network(env)
    a = net.add_link("a", 10 * GB, 1e-3)
    b = net.add_link("b", 5 * GB, 2e-3)
    log: list = []
    _run_transfer(env, net, [a, b], int(10 * GB), log=log)
    env.run()
    assert log == [(0.0, pytest.approx(3e-3 + 2.0), int(10 * GB))]
    assert net.path_time([a, b], int(10 * GB)) == pytest.approx(2.003)
    assert a.carried() == pytest.approx(10 * GB) and b.busy_time == pytest.approx(2.0)


def test_two_equal_flows_finish_together_at_twice_single_time() -> None:
    env = simpy.Environment()
    net = Network(env)
    link = net.add_link("l", 1 * GB, 0.0)
    log: list = []
    for _ in range(2):
        _run_transfer(env, net, [link], int(1 * GB), log=log)
    env.run()
    assert [t for _, t, _ in log] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert link.utilisation(2.0) == pytest.approx(1.0)


def test_max_min_fair_rates_over_two_links() -> None:
    env = simpy.Environment()
    net = Network(env)
    l1 = net.add_link("l1", 10.0, 0.0)
    l2 = net.add_link("l2", 4.0, 0.0)
    net.transfer([l1, l2], 10_000)
    net.transfer([l1], 10_000)
    env.run(until=1.0)
    rates = sorted(f.rate for f in net._flows.values())
    assert rates == [pytest.approx(4.0), pytest.approx(6.0)]  # l2 bottlenecks A, B takes the rest
    assert l1.rate == pytest.approx(10.0) and l2.rate == pytest.approx(4.0)


def test_weighted_priority_share() -> None:
    env = simpy.Environment()
    net = Network(env, priority_weight=4.0)
    link = net.add_link("l", 100.0, 0.0)
    log: list = []
    _run_transfer(env, net, [link], 80, priority=0, log=log)
    _run_transfer(env, net, [link], 80, priority=1, log=log)
    env.run()
    # p0 gets 80 B/s -> done at 1.0; then p1 (20 B moved) finishes its last 60 B at full rate
    assert [t for _, t, _ in log] == [pytest.approx(1.0), pytest.approx(1.6)]


def test_strict_priority() -> None:
    env = simpy.Environment()
    net = Network(env, priority_mode="strict")
    link = net.add_link("l", 100.0, 0.0)
    log: list = []
    _run_transfer(env, net, [link], 100, priority=1, log=log)
    _run_transfer(env, net, [link], 100, priority=0, log=log)
    env.run()
    assert [t for _, t, _ in log] == [pytest.approx(1.0), pytest.approx(2.0)]
    assert [v for _, _, v in log] == [100, 100]


def test_drop_fails_in_flight_and_later_transfers() -> None:
    env = simpy.Environment()
    net = Network(env)
    link = net.add_link("l", 100.0, 0.0)
    other = net.add_link("o", 100.0, 0.0)
    outcome: list = []

    def proc(path, at):
        yield env.timeout(at)
        try:
            yield net.transfer(path, 100)
            outcome.append(("ok", env.now))
        except LinkDown as err:
            outcome.append(("down", env.now, err.link))

    env.process(proc([link], 0.0))
    env.process(proc([other], 0.0))
    env.process(proc([link], 0.7))
    env.process(proc([link], 2.0))

    def cut():
        yield env.timeout(0.5)
        link.set_down("drop")
        yield env.timeout(1.0)
        link.set_up()

    env.process(cut())
    env.run()
    assert ("down", 0.5, "l") in outcome
    assert ("down", 0.7, "l") in outcome
    assert ("ok", pytest.approx(1.0)) in outcome  # the other link is unaffected
    assert ("ok", pytest.approx(3.0)) in outcome  # after set_up transfers work again
    assert link.n_flows == 0 and net.active_flows == 0


def test_hold_pauses_until_set_up() -> None:
    env = simpy.Environment()
    net = Network(env)
    link = net.add_link("l", 100.0, 0.1)
    log: list = []
    _run_transfer(env, net, [link], 100, log=log)

    def cut():
        yield env.timeout(0.6)
        link.set_down("hold")
        assert not link.up
        yield env.timeout(2.0)
        link.set_up()

    env.process(cut())
    env.run()
    # 0.1 latency + 0.5 s moved before the hold, 2 s paused, then 0.5 s more
    assert log == [(0.0, pytest.approx(3.1), 100)]
    assert link.busy_time == pytest.approx(1.0)


def test_zero_bytes_and_empty_path() -> None:
    env = simpy.Environment()
    net = Network(env)
    link = net.add_link("l", 100.0, 0.25)
    log: list = []
    _run_transfer(env, net, [link], 0, log=log)
    _run_transfer(env, net, [], 500, log=log)
    env.run()
    assert sorted(log) == [(0.0, 0.0, 500), (0.0, 0.25, 0)]


def test_jitter_needs_seeded_rng_and_is_reproducible() -> None:
    def finish(seed: int) -> float:
        env = simpy.Environment()
        net = Network(env, rng=np.random.default_rng(seed))
        link = net.add_link("l", 100.0, 0.1, jitter=0.05)
        log: list = []
        _run_transfer(env, net, [link], 100, log=log)
        env.run()
        return log[0][1]

    assert finish(1) == finish(1) > 1.1
    assert finish(1) != finish(2)
    env = simpy.Environment()
    net = Network(env)
    with pytest.raises(ValueError, match="rng"):
        net.transfer([net.add_link("j", 1.0, 0.0, jitter=0.1)], 10)


def test_bad_arguments() -> None:
    env = simpy.Environment()
    net = Network(env)
    with pytest.raises(ValueError):
        net.add_link("x", 0.0, 0.0)
    with pytest.raises(ValueError):
        Link(env, "y", 1.0, -1.0)
    link = net.add_link("z", 1.0, 0.0)
    with pytest.raises(ValueError):
        net.add_link("z", 1.0, 0.0)
    with pytest.raises(ValueError):
        net.transfer([link], -1)
    with pytest.raises(ValueError):
        link.set_down("explode")  # type: ignore[arg-type]


flows_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),  # path (link indices)
        st.integers(0, 5_000),  # bytes
        st.floats(0.0, 5.0, allow_nan=False),  # start time
        st.integers(0, 2),  # priority
    ),
    min_size=1,
    max_size=12,
)


@given(
    flows=flows_strategy,
    bandwidths=st.lists(st.floats(10.0, 1000.0), min_size=4, max_size=4),
    latencies=st.lists(st.sampled_from([0.0, 0.001, 0.05]), min_size=4, max_size=4),
    mode=st.sampled_from(["weighted", "strict"]),
)
def test_sharing_conserves_bytes_and_respects_capacity(flows, bandwidths, latencies, mode) -> None:
    env = simpy.Environment()
    net = Network(env, priority_mode=mode)
    links = [
        net.add_link(f"l{i}", bw, lat)
        for i, (bw, lat) in enumerate(zip(bandwidths, latencies, strict=True))
    ]
    log: list = []
    for path_idx, nbytes, at, prio in flows:
        _run_transfer(env, net, [links[i] for i in path_idx], nbytes, at=at, priority=prio, log=log)
    while env.peek() < float("inf"):
        env.step()
        for link in links:  # the sum of rates on a link never exceeds its bandwidth
            assert link.rate <= link.bandwidth * (1 + 1e-9)
    assert len(log) == len(flows)  # every transfer completed
    assert net.transfers_completed == len(flows)
    assert net.bytes_delivered == sum(f[1] for f in flows)
    # per-flow lower bound: latency + bytes / bottleneck bandwidth
    by_start: dict = {}
    for path_idx, nbytes, at, _ in flows:
        by_start.setdefault((at, nbytes), []).append(path_idx)
    for start, end, value in log:
        paths = by_start[(start, value)]
        bound = min(
            sum(latencies[i] for i in p) + value / min(bandwidths[i] for i in p) for p in paths
        )
        assert end - start >= bound * (1 - 1e-9) - 1e-12
    for i, link in enumerate(links):
        expected = sum(nb for p, nb, _, _ in flows if i in p)
        assert link.carried() == pytest.approx(expected, rel=1e-9, abs=1e-6)
        assert link.n_flows == 0


@given(sizes=st.lists(st.integers(1, 10_000), min_size=1, max_size=10))
def test_single_link_is_work_conserving(sizes) -> None:
    env = simpy.Environment()
    net = Network(env)
    link = net.add_link("l", 250.0, 0.0)
    log: list = []
    for nbytes in sizes:
        _run_transfer(env, net, [link], nbytes, log=log)
    env.run()
    assert max(t for _, t, _ in log) == pytest.approx(sum(sizes) / 250.0)
    # equal sharing: smaller transfers never finish after larger ones
    order = sorted(log, key=lambda r: r[1])
    assert [v for _, _, v in order] == sorted(sizes)
    assert link.busy_time == pytest.approx(sum(sizes) / 250.0)


@given(
    paths=st.lists(
        st.tuples(
            st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True), st.integers(0, 2)
        ),
        min_size=1,
        max_size=15,
    ),
    bandwidths=st.lists(st.floats(1.0, 100.0), min_size=5, max_size=5),
    down=st.one_of(st.none(), st.integers(0, 4)),
)
def test_rates_are_weighted_max_min_fair(paths, bandwidths, down) -> None:
    """Certificate of weighted max-min fairness: every flow crosses a saturated link on which
    its rate per unit weight is the largest (its bottleneck); flows over a held link get 0."""
    env = simpy.Environment()
    net = Network(env, priority_weight=3.0)
    links = [net.add_link(f"l{i}", bw, 0.0) for i, bw in enumerate(bandwidths)]
    if down is not None:
        links[down].set_down("hold")
    for idx, prio in paths:
        net.transfer([links[i] for i in idx], 10**9, prio)
    env.run(until=1e-9)
    flows = list(net._flows.values())
    assert len(flows) == len(paths)
    for flow in flows:
        if down is not None and links[down] in flow.path:
            assert flow.rate == 0.0
            continue
        assert flow.rate > 0
        bottleneck = False
        for link in flow.path:
            saturated = link.rate >= link.bandwidth * (1 - 1e-9)
            on_link = [f for f in flows if link in f.path]
            top = max(f.rate / f.weight for f in on_link)
            if saturated and flow.rate / flow.weight >= top * (1 - 1e-9):
                bottleneck = True
        assert bottleneck


def _textbook_fill(flows, residual, by_class: bool = True) -> dict[int, float]:
    """Reference progressive filling: one heap entry pushed per link update (no batching).
    Returns flow id -> rate; ``residual`` is updated in place like Network._fill's.

    ``by_class``: flows with the same path and weight are filled as one class of their
    total weight (``w * k`` for ``k`` flows), first flow's position first, each flow getting
    ``w * share`` (the network's model); else flow by flow (the same allocation up to
    float rounding)."""
    import heapq

    classes: dict = {}  # (path, weight) -> [flows]
    for flow in flows:
        key = (tuple(flow.path), flow.weight) if by_class else flow.fid
        classes.setdefault(key, []).append(flow)
    groups = list(classes.values())
    total = [g[0].weight * len(g) if len(g) > 1 else g[0].weight for g in groups]
    weight_on: dict = {}
    count_on: dict = {}
    members: dict = {}
    for c, group in enumerate(groups):
        for link in group[0].path:
            residual.setdefault(link, link.bandwidth if link.up else 0.0)
            weight_on[link] = weight_on.get(link, 0.0) + total[c]
            count_on[link] = count_on.get(link, 0) + 1
            members.setdefault(link, []).append(c)
    version = dict.fromkeys(weight_on, 0)
    heap = [(max(0.0, residual[lk]) / w, i, 0, lk) for i, (lk, w) in enumerate(weight_on.items())]
    seq = len(heap)
    heapq.heapify(heap)
    shares: dict[int, float] = {}
    while heap:
        share, _, ver, link = heapq.heappop(heap)
        if link not in count_on or ver != version[link]:
            continue
        for c in members[link]:
            if c in shares:
                continue
            shares[c] = share
            for lk in groups[c][0].path:
                residual[lk] -= total[c] * share
                count_on[lk] -= 1
                if count_on[lk] == 0:
                    del count_on[lk]
                    continue
                weight_on[lk] -= total[c]
                if lk is not link:
                    version[lk] += 1
                    share_lk = max(0.0, residual[lk]) / weight_on[lk]
                    heapq.heappush(heap, (share_lk, seq, version[lk], lk))
                    seq += 1
    return {f.fid: f.weight * shares[c] for c, group in enumerate(groups) for f in group}


@given(
    paths=st.lists(
        st.tuples(
            st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True), st.integers(0, 3)
        ),
        min_size=1,
        max_size=40,
    ),
    # few distinct bandwidths, so equal shares (heap ties) are common
    bandwidths=st.lists(st.sampled_from([3.0, 7.0, 10.0, 12.5, 1e9 / 3]), min_size=6, max_size=6),
    weight=st.sampled_from([4.0, 3.0, 1.0]),
    mode=st.sampled_from(["weighted", "strict"]),
    down=st.one_of(st.none(), st.integers(0, 5)),
    standalone=st.booleans(),
    repeats=st.lists(st.integers(0, 39), max_size=6),
)
def test_rates_bit_identical_to_textbook_filling(
    paths, bandwidths, weight, mode, down, standalone, repeats
) -> None:
    """The batched-push filling gives exactly (==, not approx) the rates of the textbook
    version over (path, weight) classes, ties included, and the per-flow textbook rates up
    to float rounding. ``standalone``: links are made outside the network and attached by
    their first transfer, so their internal indices follow first use, not creation order.
    ``repeats``: positions of flows started again (same path and priority) at the end, so
    classes of several flows are common."""
    paths = paths + [paths[i % len(paths)] for i in repeats]
    env = simpy.Environment()
    net = Network(env, priority_mode=mode, priority_weight=weight)
    if standalone:
        links = [Link(env, f"l{i}", bw, 0.0) for i, bw in enumerate(bandwidths)]
    else:
        links = [net.add_link(f"l{i}", bw, 0.0) for i, bw in enumerate(bandwidths)]
    if down is not None:
        links[down].set_down("hold")
    for idx, prio in paths:
        net.transfer([links[i] for i in idx], 10**6, prio)
    env.run(until=1e-12)
    flows = list(net._flows.values())
    assert len(flows) == len(paths)
    for by_class in (True, False):
        residual: dict = {}
        if mode == "strict":
            expected: dict[int, float] = {}
            for cls in sorted({f.priority for f in flows}):
                group = [f for f in flows if f.priority == cls]
                expected.update(_textbook_fill(group, residual, by_class))
        else:
            expected = _textbook_fill(flows, residual, by_class)
        if by_class:
            assert {f.fid: f.rate for f in flows} == expected
        else:  # the per-flow filling: the same allocation up to float rounding
            for f in flows:
                assert f.rate == pytest.approx(expected[f.fid], rel=1e-12, abs=1e-12)
    for link in links:  # per-link sums, accumulated in flow start order
        total = 0.0
        for f in flows:
            if f.rate > 0 and link in f.path:
                total += f.rate
        assert link.rate == total


def test_equal_shares_break_ties_like_textbook() -> None:
    """A case found by search where the order of equal-share heap entries changes the last
    bit of some rates: pushing the batched entries in any order but "last update last"
    differs from the textbook filling here."""
    env = simpy.Environment()
    net = Network(env, priority_weight=3.0)
    bws = [0.7, 1 / 3, 0.7, 1 / 3, 2.2, 0.1]
    links = [net.add_link(f"l{i}", bw, 0.0) for i, bw in enumerate(bws)]
    spec = [([0, 1], 2), ([2, 0, 3], 2), ([3], 2), ([3, 5, 1], 0), ([1], 2), ([4, 1, 3], 2)]
    for idx, prio in [*spec, ([4, 0], 0)]:
        net.transfer([links[i] for i in idx], 10**6, prio)
    env.run(until=1e-12)
    flows = list(net._flows.values())
    assert {f.fid: f.rate for f in flows} == _textbook_fill(flows, {})


def test_flows_due_at_one_instant_start_with_one_reallocation() -> None:
    """Transfers whose latency ends at the same instant start together: one reallocation for
    all of them (not one each), and the rates are those of all of them flowing at once."""
    env = simpy.Environment()
    net = Network(env)
    a = net.add_link("a", 100.0, 0.5)
    b = net.add_link("b", 60.0, 0.5)
    c = net.add_link("c", 45.0, 0.25)
    calls: list[tuple[float, int]] = []
    realloc = net._reallocate

    def counted() -> None:
        calls.append((env.now, net.active_flows))
        realloc()

    net._reallocate = counted  # type: ignore[method-assign]
    net.transfer([a], 1000)
    net.transfer([b], 1000)
    net.transfer([a], 1000, priority=1)  # weight 1/4 of the first on link a
    net.transfer([c, b], 1000)  # latency 0.75: due later
    env.run(until=0.6)
    assert calls == [(0.5, 3)]
    assert sorted(f.rate for f in net._flows.values()) == [20.0, 60.0, 80.0]
    env.run(until=0.8)
    assert calls == [(0.5, 3), (0.75, 4)]
    assert sorted(f.rate for f in net._flows.values()) == [20.0, 30.0, 30.0, 80.0]
