"""Cluster components: layer/chunk invariant, coupled mode, KV accounting, degradation,
placement policies and determinism (same seed -> same summary and trace hash)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.runner import run_scenario
from sim.scenario import validate
from sim.serving.replica import KvAccount

SMALL: dict[str, Any] = {
    "name": "small",
    "deployments": [{"model": "llama-2-7b", "share": 0.5}, {"model": "llama-2-13b", "share": 0.5}],
    "cluster": {
        "servers": 2,
        "param_servers": 2,
        "gpu": {"weight_cache_fraction": 0.4},
        "server": {"host": "16GiB"},
        "replica": {"max_num_seqs": 8},
    },
    "chunks": {"size": "16MiB"},
    "workload": {
        "requests": 40,
        "rate": 20.0,
        "input_tokens": {"mean": 128},
        "output_tokens": {"dist": "uniform", "low": 2, "high": 12},
    },
}


def _sc(**patch: Any) -> Any:
    data = copy.deepcopy(SMALL)
    for path, value in patch.items():
        node = data
        parts = path.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return validate(data)


def _cluster_run(sc: Any, seed: int = 0) -> Any:
    from sim.cluster import build
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    cl = build(sc, seed, load_catalogue(), load_profile(sc.profile), CostModel)
    cl.run()
    return cl


def test_layers_never_run_before_their_chunks_arrive() -> None:
    cl = _cluster_run(_sc(metrics__check_invariants=True))
    log = cl.ctx.metrics.layer_log
    assert log, "the cold cluster must have run layers through the fetch path"
    fetched = 0
    for start, _node, _m, _layer, arrived in log:
        assert arrived <= start  # the last chunk of the layer arrived before the layer ran
        fetched += arrived >= 0
    assert fetched > 0
    assert cl.ctx.metrics.n_final == 40


def test_coupled_mode_fetches_nothing_after_warmup() -> None:
    res = run_scenario(
        _sc(mode="coupled", cluster__server={"host": "16GiB"}, cluster__replica={"max_num_seqs": 8})
    )
    s = res.summary
    assert s["requests"]["completed"] == 40
    assert s["fetches_after_warmup"] == 0
    assert s["hit_rate"]["hbm"] == 1.0
    assert s["bytes_by_tier"]["remote"] == 0.0
    pd_run = run_scenario(_sc())
    assert pd_run.summary["fetches_after_warmup"] > 0  # the PD cluster did fetch


def test_same_seed_same_summary_and_hash_different_seed_differs() -> None:
    sc = _sc()
    a, b, c = run_scenario(sc, seed=3), run_scenario(sc, seed=3), run_scenario(sc, seed=4)
    assert a.summary == b.summary
    assert a.trace_hash == b.trace_hash
    assert a.trace_hash != c.trace_hash
    assert a.requests.equals(b.requests)


@given(
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 3000)), max_size=60),
    bt=st.sampled_from([1, 16, 64]),
)
def test_kv_account_never_overcommits(ops: list[tuple[bool, int]], bt: int) -> None:
    kv = KvAccount(capacity=200_000, block_tokens=bt)
    held: list[int] = []
    rid = 0
    for take, tokens in ops:
        if take:
            need, exact = kv.size(tokens, 8)
            assert need >= exact and need % (bt * 8) == 0
            if kv.can(need):
                kv.take(rid, 0, tokens, 8)
                held.append(rid)
                rid += 1
        elif held:
            kv.give(held.pop(0), 8)
        assert 0 <= kv.reserved <= kv.capacity
        assert kv.reserved == sum(kv.size(kv.seqs[r][1], 8)[0] for r in held)
        assert 0.0 <= kv.fragmentation() < 1.0


def _overload(action: str) -> Any:
    return _sc(
        deployments=[{"model": "llama-2-7b"}],
        cluster__server={"host": "16GiB"},
        cluster__replica={"max_num_seqs": 4},
        warmup={"node_hbm": True},
        workload={
            "requests": 300,
            "rate": 400.0,
            "input_tokens": {"mean": 256},
            "output_tokens": {"mean": 32},
            "classes": [{"name": "gold", "share": 0.3}, {"name": "bulk", "share": 0.7}],
        },
        degradation={
            "enabled": True,
            "protected": ["gold"],
            "action": action,
            "queue_per_node": 3,
            "max_wait": 0.05,
        },
    )


def test_degradation_never_sheds_the_protected_class() -> None:
    res = run_scenario(_overload("shed"))
    df = res.requests
    shed = df[df["status"] == "shed"]
    assert len(shed) > 0, "the scenario must overload the cluster"
    assert set(shed["cls"].astype(str)) == {"bulk"}
    gold = df[df["cls"] == "gold"]
    assert (gold["status"] == "done").all()


def test_degradation_queue_holds_but_finishes_everything() -> None:
    res = run_scenario(_overload("queue"))
    df = res.requests
    assert (df["status"] == "done").all()
    lat = (df["end"] - df["arrival"]).to_numpy()
    gold = (df["cls"] == "gold").to_numpy()
    assert np.percentile(lat[gold], 99) < np.percentile(lat[~gold], 99)


@pytest.mark.parametrize("policy", ["random", "round-robin", "least-loaded", "score"])
def test_every_placement_policy_serves_all(policy: str) -> None:
    res = run_scenario(_sc(scheduler={"policy": policy}))
    df = res.requests
    assert (df["status"] == "done").all()
    assert set(df["node"].unique().tolist()) == {0, 1}


def test_round_robin_alternates_nodes() -> None:
    res = run_scenario(_sc(scheduler={"policy": "round-robin"}))
    nodes = res.requests.sort_values("arrival")["node"].to_numpy()
    assert np.array_equal(nodes, np.arange(len(nodes)) % 2)


def test_hot_shards_get_replicated_under_burst() -> None:
    sc = _sc(
        deployments=[{"model": "llama-2-7b"}],
        cluster={
            "servers": 4,
            "param_servers": 3,
            "gpu": {"weight_cache_fraction": 0.12},
            "server": {"host": "1GiB", "nvme": "1GiB"},
            "replica": {"max_num_seqs": 4},
        },
        hot_shards={"enabled": True, "window": 0.2, "factor": 2.0, "min_count": 2},
        workload={
            "kind": "step",
            "rate": 2.0,
            "steps": [{"at": 0.6, "rate": 80.0}],
            "requests": 40,
            "output_tokens": {"mean": 2},
        },
    )
    res = run_scenario(sc)
    assert res.summary["replicas_added"] > 0
    assert res.summary["requests"]["completed"] == 40


def test_engine_kv_allocator_matches_byte_accounting() -> None:
    """The KV core's block allocator behind the adapter changes no decision."""
    a = run_scenario(_sc(kv={"allocator": "engine"}), seed=2)
    b = run_scenario(_sc(kv={"allocator": "count"}), seed=2)
    assert a.trace_hash == b.trace_hash
    cl = _cluster_run(_sc(kv={"allocator": "engine"}))
    for node in cl.ctx.nodes:  # every sequence was freed at completion
        for alloc in node.kv.allocators:
            assert alloc.sequences() == []
            assert alloc.num_used_blocks == 0
            alloc.check_invariants()


def test_cold_start_warmup_keeps_first_fetches_off_the_object_store() -> None:
    cold = run_scenario(_sc(warmup={"enabled": False})).summary
    warm = run_scenario(_sc(warmup={"enabled": True})).summary
    assert cold["bytes_by_tier"]["object"] > 0  # empty servers read the object store first
    assert warm["bytes_by_tier"]["object"] == 0.0  # warmed servers serve from DRAM
    assert warm["bytes_by_tier"]["remote"] > 0
    assert warm["latency"]["e2e"]["p99"] <= cold["latency"]["e2e"]["p99"]


def test_fetches_survive_a_dropped_link() -> None:
    """A parameter server's NIC drops traffic for a while: nodes retry and finish."""
    from sim.cluster import build
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    sc = _sc(
        cluster={
            "servers": 2,
            "param_servers": 1,
            "server": {"host": "1GiB"},
            "replica": {"max_num_seqs": 8},
        }
    )
    cl = build(sc, 0, load_catalogue(), load_profile(sc.profile), CostModel)
    link = cl.ctx.network.links["ps0.nic"]
    env = cl.env

    def cut() -> Any:
        yield env.timeout(0.01)
        link.set_down("drop")
        yield env.timeout(0.3)
        link.set_up()

    env.process(cut())
    cl.run()
    assert cl.ctx.metrics.fetch_retries > 0  # the cut did hit transfers
    assert cl.ctx.metrics.n_final == 40
    assert (cl.ctx.metrics.status == 1).all()


def test_closed_loop_keeps_at_most_clients_in_flight() -> None:
    sc = _sc(
        workload={
            "kind": "closed-loop",
            "clients": 3,
            "think_time": 0.05,
            "requests": 30,
            "output_tokens": {"mean": 4},
        }
    )
    df = run_scenario(sc).requests
    assert (df["status"] == "done").all()
    events = sorted(
        [(t, 1) for t in df["arrival"]] + [(t, -1) for t in df["end"]], key=lambda e: (e[0], e[1])
    )
    inside = peak = 0
    for _, d in events:
        inside += d
        peak = max(peak, inside)
    assert peak <= 3


def test_diurnal_arrivals_peak_where_the_rate_peaks() -> None:
    from sim.scenario import WorkloadCfg
    from sim.serving.workload import diurnal_arrivals

    cfg = WorkloadCfg(kind="diurnal", rate=100.0, period=100.0, amplitude=0.8, requests=20000)
    t = diurnal_arrivals(cfg, cfg.requests, np.random.default_rng(0))
    first = t[t < 100.0]
    peak = ((first > 10) & (first < 40)).sum()  # rate near its maximum (t = 25)
    trough = ((first > 60) & (first < 90)).sum()  # rate near its minimum (t = 75)
    assert peak > 3 * trough


@pytest.mark.parametrize("placement", ["shard", "chunk"])
def test_ring_placement_unit(placement: str) -> None:
    from sim.cluster import build
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    sc = _sc(
        cluster={"servers": 1, "param_servers": 4, "server": {"host": "1GiB"}},
        ring={"placement": placement},
    )
    cl = build(sc, 0, load_catalogue(), load_profile(sc.profile), CostModel)
    d, mr = cl.ctx.directory, cl.ctx.models[0]
    per_layer = [
        {
            tuple(d.replicas(0, c))
            for c in range(int(mr.layer_start[la]), int(mr.layer_start[la + 1]))
        }
        for la in range(mr.n_layers)
        if mr.layer_chunks[la] > 1
    ]
    if placement == "shard":
        assert all(len(s) == 1 for s in per_layer)  # a layer lives on one server
    else:
        assert any(len(s) > 1 for s in per_layer)  # chunks of a layer spread out
    used = {ps for c in range(mr.n_chunks) for ps in d.replicas(0, c)}
    assert used == {0, 1, 2, 3}


@settings(max_examples=8)
@given(
    seed=st.integers(0, 2**16),
    nodes=st.integers(1, 3),
    max_batch=st.integers(1, 6),
    policy=st.sampled_from(["random", "round-robin", "least-loaded", "score"]),
    out_high=st.integers(1, 20),
)
def test_random_small_clusters_keep_request_invariants(
    seed: int, nodes: int, max_batch: int, policy: str, out_high: int
) -> None:
    sc = _sc(
        cluster={
            "servers": nodes,
            "param_servers": 2,
            "gpu": {"weight_cache_fraction": 0.4},
            "server": {"host": "4GiB"},
            "replica": {"max_num_seqs": max_batch},
        },
        scheduler={"policy": policy},
        workload={
            "requests": 25,
            "rate": 30.0,
            "input_tokens": {"dist": "uniform", "low": 1, "high": 300},
            "output_tokens": {"dist": "uniform", "low": 1, "high": out_high},
        },
    )
    cl = _cluster_run(sc, seed)
    met = cl.ctx.metrics
    assert (met.status == 1).all()
    assert (met.arrival <= met.start).all() and (met.start < met.first).all()
    assert (met.first <= met.end).all()
    for node in cl.ctx.nodes:  # everything released at the end
        assert node.running == 0 and node.qlen == 0
        assert node.kv.reserved == 0 and node.kv.needed == 0
        assert all(b == 0 for b in node.sched.num_decoding) and all(
            b == 0.0 for b in node.sched.context_base
        )
        assert node.ws.hbm.used <= node.ws.hbm.capacity
        for m, mr in enumerate(cl.ctx.models):  # O(1) residency counters match the cache
            for layer in range(mr.n_layers):
                lo, hi = int(mr.layer_start[layer]), int(mr.layer_start[layer + 1])
                real = sum((mr.base | c) in node.ws.hbm for c in range(lo, hi))
                assert node.ws.counts[m][layer] == real


def test_the_default_steady_window_skips_the_first_tenth_of_the_arrivals() -> None:
    """Open loop, no ``metrics.warmup``: the window starts a tenth of the arrival span after
    the first arrival and ends ``cooldown`` before the last; an explicit warmup replaces it."""
    from pathlib import Path

    from sim.cluster import build
    from sim.scenario import load_scenario
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    root = Path(__file__).resolve().parents[2]
    for sets, warm in (([], None), (["metrics.warmup=0.5s"], 0.5)):
        sc = load_scenario(root / "scenarios" / "quickstart.yaml",
                           ["workload.requests=50", "metrics.cooldown=0.2s", *sets])  # fmt: skip
        cl = build(sc, 0, load_catalogue(sc.catalogue), load_profile(sc.profile), CostModel, None)
        first, last = float(cl.wl.arrival[0]), float(cl.wl.arrival[-1])
        assert last - first > 1.0  # a window both ways
        w0 = first + 0.1 * (last - first) if warm is None else warm
        assert cl.window() == (w0, last - 0.2)
