"""The serving model: queueing against theory, one request against the cost formula at TP=1
and TP=8, KV pressure with preemption, steady-state windows, overload and unfinished runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.cluster import check_feasible
from sim.runner import run_scenario
from sim.scenario import validate
from sim.serving.costmodel import load_profile
from sim.serving.gpumemory import plan_memory, workspace_bytes
from sim.serving.models import load_catalogue

CAT = load_catalogue()
T_975 = {19: 2.093}  # Student t, 97.5% quantile, by degrees of freedom


def _scenario(**over: Any) -> Any:
    data: dict[str, Any] = {
        "name": "serving",
        "profile": "a100-80gb",
        "mode": "coupled",
        "deployments": [{"model": "llama-2-7b"}],
        "cluster": {"servers": 1, "param_servers": 1, "server": {"host": "16GiB", "nvme": 0}},
        "chunks": {"size": "16MiB"},
        "workload": {"kind": "poisson", "requests": 100, "rate": 1.0},
    }
    for path, value in over.items():
        node = data
        parts = path.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return validate(data)


def _batch_mean_ci(x: np.ndarray, batches: int = 20) -> tuple[float, float]:
    """Mean and 95% half-width by batch means (waits of successive requests correlate)."""
    n = len(x) // batches * batches
    means = x[:n].reshape(batches, -1).mean(axis=1)
    half = T_975[batches - 1] * means.std(ddof=1) / math.sqrt(batches)
    return float(means.mean()), float(half)


def _queue_check(out_tokens: dict[str, Any], rho: float, n: int) -> tuple[float, float, float]:
    """Run one replica of one sequence (an M/G/1 queue); returns (mean wait, CI half-width,
    Pollaczek-Khinchine mean wait from the service times the run itself measured)."""
    probe = run_scenario(
        _scenario(
            workload__requests=1,
            workload__input_tokens={"dist": "fixed", "mean": 32},
            workload__output_tokens=out_tokens,
            cluster__replica={"max_num_seqs": 1},
        ),
        seed=1,
    ).requests
    s1 = float((probe["end"] - probe["start"]).iloc[0])
    mean_out = out_tokens["mean"]
    rate = rho / (s1 * mean_out / max(probe["output_tokens"].iloc[0], 1))
    res = run_scenario(
        _scenario(
            workload__requests=n,
            workload__rate=rate,
            workload__input_tokens={"dist": "fixed", "mean": 32},
            workload__output_tokens=out_tokens,
            cluster__replica={"max_num_seqs": 1},
        ),
        seed=3,
    )
    df = res.requests.sort_values("arrival")
    assert (df["status"] == "done").all()
    service = (df["end"] - df["start"]).to_numpy()
    wait = (df["start"] - df["arrival"]).to_numpy()
    # one sequence at a time: a request starts when the previous one ends, or on arrival
    starts, ends, arr = df["start"].to_numpy(), df["end"].to_numpy(), df["arrival"].to_numpy()
    assert np.allclose(starts[1:], np.maximum(arr[1:], ends[:-1]), rtol=0, atol=1e-9)
    lam = (n - 1) / (arr[-1] - arr[0])
    es, es2 = service.mean(), (service**2).mean()
    pk = lam * es2 / (2 * (1 - lam * es))
    mean, half = _batch_mean_ci(wait[n // 10 :])
    return mean, half, pk


def test_md1_mean_wait_matches_pollaczek_khinchine() -> None:
    mean, half, pk = _queue_check({"dist": "fixed", "mean": 8}, rho=0.6, n=6000)
    assert abs(mean - pk) <= half, (mean, half, pk)


def test_mm1_memoryless_service_mean_wait_matches_theory() -> None:
    # geometric output lengths make the service time (nearly) exponential: the M/M/1 case of
    # Pollaczek-Khinchine, with the service moments the run measured
    mean, half, pk = _queue_check({"dist": "geometric", "mean": 8, "high": 400}, rho=0.6, n=6000)
    assert abs(mean - pk) <= half, (mean, half, pk)


def _hand_iteration(
    spec: Any, prof: Any, tp: int, prefill: int, n_dec: int, ctx: float, sampled: int
) -> float:
    """One fused iteration of a LLaMA-shaped model, written out from the shapes: per layer
    max(FLOPs / rate, bytes / bandwidth) + overhead, split over ``tp`` GPUs, plus ring
    all-reduces (2 per block + 1) of the activations over NVLink."""
    g = prof.gpu
    rate, bw, over = g.flops_fp16 * g.compute_efficiency, g.hbm_bandwidth, g.per_layer_overhead_s
    h, heads, hd, db = spec.hidden, spec.heads, spec.head_dim, spec.dtype_bytes
    blocks = [ly for ly in spec.layers if ly.attention]
    emb = spec.layers[0]
    head = spec.layers[-1]
    tokens = prefill + n_dec
    kvl = spec.kv_bytes_per_token / len(blocks)
    attn = (0.5 * 4 * heads * hd * prefill**2 + 4 * heads * hd * ctx) / tp
    t = 0.0
    for ly in blocks:
        f = ly.flops_per_token * tokens / tp + attn
        b = ly.param_bytes / tp + kvl * (prefill + ctx) / tp
        t += max(f / rate, b / bw) + over
    t += min(emb.param_bytes / tp, tokens * h * db / tp) / bw + over
    t += max(head.flops_per_token * sampled / tp / rate, head.param_bytes / tp / bw) + over
    t += g.kernel_launch_s
    if tp > 1:
        nv = prof.links.nvlink
        t += (
            (2 * len(blocks) + 1) * 2 * (tp - 1) * (nv.latency + tokens * h * 2 / tp / nv.bandwidth)
        )
    return t


@pytest.mark.parametrize("tp", [1, 8])
def test_one_request_ttft_and_tpot_equal_the_hand_formula(tp: int) -> None:
    prompt, out = 512, 16
    sc = _scenario(
        profile="h200-sxm",
        cluster__gpus_per_server=8,
        cluster__tp=tp,
        workload__requests=1,
        workload__input_tokens={"dist": "fixed", "mean": prompt},
        workload__output_tokens={"dist": "fixed", "mean": out},
    )
    df = run_scenario(sc, seed=1).requests
    spec, prof = CAT["llama-2-7b"], load_profile("h200-sxm")
    ttft = float((df["first_token"] - df["arrival"]).iloc[0])
    tpot = float(((df["end"] - df["first_token"]) / (out - 1)).iloc[0])
    want_ttft = _hand_iteration(spec, prof, tp, prompt, 0, 0.0, 1)
    steps = [_hand_iteration(spec, prof, tp, 0, 1, prompt + k, 1) for k in range(1, out)]
    assert ttft == pytest.approx(want_ttft, rel=1e-9)
    assert tpot == pytest.approx(sum(steps) / len(steps), rel=1e-6)
    if tp == 8:  # the all-reduce is charged: a TP=8 step is not just a TP=1 step / 8
        assert want_ttft > _hand_iteration(spec, prof, 1, prompt, 0, 0.0, 1) / 8


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_kv_pressure_preempts_and_loses_no_request(mode: str) -> None:
    sc = _scenario(
        cluster__gpu={"hbm": "16GiB", "memory_utilization": 1.0, "workspace": "1GiB"},
        kv={"preemption": mode, "block_tokens": 16},
        workload__requests=40,
        workload__rate=50.0,
        workload__input_tokens={"dist": "fixed", "mean": 256},
        workload__output_tokens={"dist": "fixed", "mean": 600},
        metrics={"check_invariants": True},
    )
    res = run_scenario(sc, seed=2)
    s = res.summary
    assert s["requests"]["preemptions"] > 0
    assert s["requests"]["completed"] == 40 and s["requests"]["unfinished"] == 0
    df = res.requests
    assert (df["end"] > df["first_token"]).all()


def test_kv_blocks_return_to_the_engine_allocator_after_preemptions() -> None:
    from sim.cluster import build
    from sim.serving.costmodel import CostModel

    sc = _scenario(
        cluster__gpu={"hbm": "16GiB", "memory_utilization": 1.0, "workspace": "1GiB"},
        workload__requests=30,
        workload__rate=50.0,
        workload__input_tokens={"dist": "fixed", "mean": 256},
        workload__output_tokens={"dist": "fixed", "mean": 600},
    )
    cl = build(sc, 2, CAT, load_profile(sc.profile), CostModel)
    cl.run()
    (node,) = cl.ctx.nodes
    assert node.preemptions > 0
    assert node.kv.reserved == 0 and node.kv.seqs == {}
    (alloc,) = node.kv.allocators
    assert alloc.num_used_blocks == 0 and alloc.sequences() == []


def test_duration_bounded_run_excludes_the_cold_start() -> None:
    sc = validate(
        {
            "name": "cold",
            "profile": "a100-80gb",
            "mode": "pd",
            "deployments": [{"model": "llama-2-7b"}],
            "cluster": {"servers": 2, "param_servers": 2, "server": {"host": "32GiB"}},
            "warmup": {"enabled": True, "node_hbm": False},
            "workload": {
                "kind": "poisson",
                "rate": 4.0,
                "duration": "40s",
                "requests": 5,  # ignored: the duration bounds the workload
                "input_tokens": {"dist": "fixed", "mean": 128},
                "output_tokens": {"dist": "fixed", "mean": 16},
            },
        }
    )
    res = run_scenario(sc, seed=4)
    s, df = res.summary, res.requests
    assert df["arrival"].max() < 40.0 and len(df) > 100
    w0, w1 = s["window_s"]
    assert w0 == pytest.approx(0.1 * (w1 - df["arrival"].min()) + df["arrival"].min())
    assert s["requests"]["in_window"] == int(((df["arrival"] >= w0) & (df["arrival"] <= w1)).sum())
    lat = (df["end"] - df["arrival"]).to_numpy()
    cold = lat[df["arrival"].to_numpy() < 1.0]
    # the first requests wait for the weights to stream in; the steady window leaves them out
    assert cold.max() > 5 * s["latency"]["e2e"]["p99"]
    assert s["latency"]["e2e"]["p99"] < np.percentile(lat, 99.9)
    assert not s["overloaded"]


def test_overload_is_flagged_and_throughput_is_offered_vs_achieved() -> None:
    sc = _scenario(
        workload__rate=200.0,
        workload__duration=10.0,
        workload__input_tokens={"dist": "fixed", "mean": 512},
        workload__output_tokens={"dist": "fixed", "mean": 256},
    )
    s = run_scenario(sc, seed=1).summary
    thr = s["throughput"]
    assert s["overloaded"] and thr["achieved_rps"] < 0.95 * thr["offered_rps"]
    assert any(w.startswith("overloaded") for w in s["warnings"])
    light = run_scenario(_scenario(workload__rate=2.0, workload__duration=60.0), seed=1).summary
    assert not light["overloaded"]
    assert light["throughput"]["achieved_rps"] == pytest.approx(
        light["throughput"]["offered_rps"], rel=0.1
    )


def test_unfinished_requests_are_reported_and_exit_3(tmp_path: Path) -> None:
    scen = tmp_path / "cut.yaml"
    scen.write_text(
        "name: cut\nprofile: a100-80gb\nmode: coupled\nduration: 5s\n"
        "deployments: [{model: llama-2-7b}]\n"
        "cluster: {servers: 1, server: {host: 16GiB, nvme: 0}}\nchunks: {size: 16MiB}\n"
        "workload: {kind: poisson, rate: 100, requests: 400,"
        " output_tokens: {dist: fixed, mean: 256}}\n",
        encoding="utf-8",
    )
    res = CliRunner().invoke(app, ["run", str(scen), "--out", str(tmp_path / "runs")])
    assert res.exit_code == 3, res.output
    assert "unfinished" in res.output
    (folder,) = (tmp_path / "runs").iterdir()
    import json

    s = json.loads((folder / "summary.json").read_text())
    assert s["requests"]["unfinished"] > 0
    assert s["requests"]["completed"] + s["requests"]["unfinished"] == 400
    assert "duration" in s["stop_reason"]


def test_tp1_70b_on_an_h200_is_infeasible_with_the_numbers() -> None:
    sc = _scenario(profile="h200-sxm", deployments=[{"model": "llama-2-70b"}])
    with pytest.raises(InputError, match=r"cluster.tp: .*GB of weights per GPU.*use tp >= 2"):
        check_feasible(sc, CAT, load_profile("h200-sxm"))
    ok = _scenario(
        profile="h200-sxm",
        deployments=[{"model": "llama-2-70b"}],
        cluster__gpus_per_server=8,
        cluster__tp=2,
    )
    check_feasible(ok, CAT, load_profile("h200-sxm"))


@pytest.mark.parametrize(
    ("servers", "gps", "tp", "pp", "replicas"),
    [(4, 1, 1, 1, 4), (2, 8, 8, 1, 2), (2, 8, 2, 2, 4), (3, 8, 1, 1, 24), (4, 8, 16, 1, 2)],
)
def test_replicas_from_servers_gpus_tp_pp(
    servers: int, gps: int, tp: int, pp: int, replicas: int
) -> None:
    sc = _scenario(
        cluster__servers=servers, cluster__gpus_per_server=gps, cluster__tp=tp, cluster__pp=pp
    )
    assert sc.cluster.replicas == replicas
    assert sc.cluster.gpus == servers * gps


@pytest.mark.parametrize(
    ("servers", "gps", "tp", "field"),
    [(1, 8, 3, "cluster.tp"), (3, 8, 16, "cluster.servers"), (2, 8, 12, "cluster.tp")],
)
def test_replica_shapes_that_do_not_tile_servers_are_errors(
    servers: int, gps: int, tp: int, field: str
) -> None:
    sc = _scenario(
        profile="h200-sxm", cluster__servers=servers, cluster__gpus_per_server=gps, cluster__tp=tp
    )
    with pytest.raises(InputError, match=field):
        check_feasible(sc, CAT, load_profile("h200-sxm"))


def test_memory_plan_hand_figures() -> None:
    spec = CAT["llama-2-70b"]
    sc = _scenario(profile="h200-sxm", deployments=[{"model": "llama-2-70b"}], cluster__tp=8,
                   cluster__gpus_per_server=8)  # fmt: skip
    hbm = load_profile("h200-sxm").gpu.hbm_bytes
    mem = plan_memory(sc, [spec], hbm, "h200-sxm")
    rc = sc.cluster.replica
    # workspace: 8192 tokens x (4 + 8/8) x 8192 hidden x 2 B + 256 seqs x 32000/8 x 4 B
    assert workspace_bytes(spec, rc.max_num_batched_tokens, rc.max_num_seqs, 8) == (
        8192 * 5 * 8192 * 2 + 256 * 4000 * 4
    )
    budget = int(hbm * 0.9)
    weights = -(-spec.param_bytes // 8)
    assert mem.weights_gpu == weights
    assert mem.kv_gpu == budget - mem.workspace_gpu - weights
    # 8 KV heads over 8 ranks: one each, nothing replicated
    assert mem.kv == mem.kv_gpu * 8


def test_lru_on_a_cyclic_layer_scan_gets_no_hbm_hits_and_each_access_counts_once() -> None:
    # a weight cache smaller than the model, no prefetch: LRU evicts every chunk before the
    # next iteration comes back to it, so (after the first iteration) no access is a hit;
    # each iteration accesses every chunk once
    sc = validate(
        {
            "name": "scan",
            "profile": "a100-80gb",
            "mode": "pd",
            "deployments": [{"model": "llama-2-7b"}],
            "cluster": {
                "servers": 1,
                "param_servers": 1,
                "gpu": {"hbm": "20GiB", "weight_cache_fraction": 0.25, "workspace": 0},
                "server": {"host": "32GiB", "nvme": 0},
            },
            "prefetch": {"enabled": False},
            "warmup": {"node_hbm": False},
            "metrics": {"warmup": 0.0},
            "workload": {
                "kind": "poisson",
                "requests": 3,
                "rate": 0.01,
                "input_tokens": {"dist": "fixed", "mean": 16},
                "output_tokens": {"dist": "fixed", "mean": 4},
            },
        }
    )
    from sim.cluster import build
    from sim.serving.costmodel import CostModel

    cl = build(sc, 1, CAT, load_profile(sc.profile), CostModel)
    cl.run()
    (node,) = cl.ctx.nodes
    met = cl.ctx.metrics
    n_chunks = cl.ctx.models[0].n_chunks
    assert met.accesses == node.iterations * n_chunks  # every chunk once per iteration
    assert met.tier_hits[0] == 0  # LRU on a cyclic scan: no reuse
    assert met.tier_hits[1:].sum() == met.accesses  # every access streamed its chunk in
