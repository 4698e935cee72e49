"""What a plan reports at its answer: the latencies, per-user speed and tokens/s/GPU of the
answer probe's runs (recomputed here from the run records), and ``--emit vllm``: the chosen
deployment's ``vllm serve`` arguments, checked against the scenario knobs one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdsim.cli import app
from sim.scenario import load_scenario
from sim.study.emit import vllm_args
from sim.study.sweep.spec import build_points

ROOT = Path(__file__).resolve().parents[3]

SCEN = """name: tiny-plan
profile: h200-sxm-vllm
mode: coupled
deployments:
  - model: llama-3.1-8b
cluster:
  servers: 1
  gpus_per_server: 2
  tp: 1
  param_servers: 1
  server: {nvme: 0}
  replica: {max_num_seqs: 6, max_num_batched_tokens: 2048}
kv: {prefix_caching: false}
workload:
  kind: poisson
  rate: 10
  duration: 6s
  input_tokens: {dist: fixed, mean: 256}
  output_tokens: {dist: fixed, mean: 32}
  classes:
    - {name: normal, slo: 5s}
"""


def test_vllm_args_map_the_scenario_knobs(tmp_path: Path) -> None:
    """tp 2 on 8-GPU servers: 4 replicas per server (data parallel 4); the batch cap, token
    budget, memory share, chunked prefill and prefix caching as the scenario sets them."""
    scen = tmp_path / "s.yaml"
    scen.write_text(SCEN)
    grid = {"cluster.tp": [2], "cluster.gpus_per_server": [8], "cluster.gpu.memory_utilization": [0.85],
            "cluster.replica.chunked_prefill": [False]}  # fmt: skip
    sc = build_points(scen, grid, [0], [], None, source="test")[0].scenario
    assert vllm_args(sc) == [
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
        "--data-parallel-size", "4", "--max-num-seqs", "6", "--max-num-batched-tokens", "2048",
        "--no-enable-chunked-prefill", "--gpu-memory-utilization", "0.85",
        "--no-enable-prefix-caching",
    ]  # fmt: skip
    one = load_scenario(scen)  # tp 1 on 2-GPU servers, prefix caching off
    assert vllm_args(one)[4:6] == ["--data-parallel-size", "2"]
    moe = load_scenario(ROOT / "scenarios" / "deepseek-v3-h200.yaml")  # tp 8, ep 8
    assert vllm_args(moe)[:5] == [
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "1", "--enable-expert-parallel",
    ]  # fmt: skip


def test_plan_reports_figures_at_its_answer_and_emits_vllm(tmp_path: Path) -> None:
    """A min-size question (servers for 30 req/s under TPOT p50 <= 10 ms and E2E p99 <= 2 s):
    the answer row's TTFT/TPOT/E2E, tokens/s/user and tokens/s/GPU are the answer probe's
    run metrics; the sentence says them; --emit vllm writes the chosen deployment's
    arguments; a plan with no passing answer emits nothing, in one line naming --emit."""
    scen = tmp_path / "s.yaml"
    scen.write_text(SCEN)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"scenario: {scen}\nseeds: 1\nslo: {{tpot: {{p50: {{all: 10ms}}}}, e2e: {{p99: {{all: 2s}}}}}}\n"
        "size_range: [1, 3]\nqps: [30]\nalternatives: {cluster.replica.max_num_seqs: [6]}\n"
    )
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["plan", str(plan), "--out", str(out), "--emit", "vllm", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output.strip().splitlines()[-1])
    ans = res["answer"]
    assert ans["meets_slo"]
    n = ans["servers"]
    (rec,) = [
        json.loads(p.read_text())
        for p in (out / "runs").glob("*.json")
        if json.loads(p.read_text())["params"]["cluster.servers"] == n
    ]
    m = rec["metrics"]
    for col, key in (("ttft_p50_s", "latency.ttft.p50"), ("tpot_p50_s", "latency.tpot.p50"),
                     ("e2e_p99_s", "latency.e2e.p99"),
                     ("tokens_per_s_per_user", "user_tokens_per_s.p50")):  # fmt: skip
        assert ans[col] == pytest.approx(m[key], rel=1e-6)
    assert ans["e2e_p99_s"] <= 2.0 and ans["tpot_p50_s"] <= 0.010
    gpus = m["gpus"]
    assert ans["tokens_per_s_per_gpu"] == pytest.approx(
        m["throughput.output_tokens_per_s"] / gpus, rel=1e-6
    )
    assert "there: TTFT p50" in r.output and "tokens/s/user" in r.output
    sh = (out / "vllm-serve.sh").read_text()
    assert f"Run on each of the {n} server(s)" in sh
    assert sh.strip().splitlines()[-1] == (
        "vllm serve llama-3.1-8b --tensor-parallel-size 1 --pipeline-parallel-size 1 "
        "--data-parallel-size 2 --max-num-seqs 6 --max-num-batched-tokens 2048 "
        "--enable-chunked-prefill --gpu-memory-utilization 0.9 --no-enable-prefix-caching"
    )
    # nothing meets 1 ms TPOT: nothing to emit
    r2 = CliRunner().invoke(app, ["plan", str(plan), "--out", str(tmp_path / "o2"), "--emit",
                                  "vllm", "--set", "workload.duration=3s", "--quiet",
                                  "--p99", "all=1ms"])  # fmt: skip
    assert r2.exit_code == 2
    assert "--emit vllm: no deployment to emit" in r2.output
    bad = CliRunner().invoke(app, ["plan", str(plan), "--emit", "sglang"])
    assert bad.exit_code == 2 and "allowed: vllm" in bad.output
