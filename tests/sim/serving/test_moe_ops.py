"""Expert parallelism, all-to-all, expert tables and MLA in the cost protocol, checked against
hand computations written here (sim.serving.moeparallel, sim.serving.opcost.moemla)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.serving.costmodel import Profile, load_profile
from sim.serving.decoderblock import expected_experts
from sim.serving.gpumemory import weights_per_gpu
from sim.serving.hfconfig import entry_from_config
from sim.serving.itercost import iteration_cost
from sim.serving.models import ModelEntry, ModelSpec, build_model, load_catalogue
from sim.serving.moeparallel import ExpertParallel, alltoall_bytes, skew_imbalance
from sim.serving.moeroofline import MoeRoofline
from sim.serving.opcost import OpCostModel

HF = Path(__file__).parents[2] / "data" / "hf"
runner = CliRunner()


@pytest.fixture(scope="module")
def cat() -> dict[str, ModelSpec]:
    return load_catalogue()


@pytest.fixture(scope="module")
def vllm() -> Profile:
    return load_profile("h200-sxm-vllm")


def without(profile: Profile, *, a2a: bool = True, moe: bool = True) -> Profile:
    """``profile`` without its all-to-all and/or expert tables (the roofline prices them)."""
    ops = profile.ops
    assert ops is not None
    keep = [t for t in ops.all_reduce if not a2a or t.op == "all_reduce"]
    new = ops.model_copy(update={"all_reduce": keep, "moe": [] if moe else ops.moe})
    return profile.model_copy(update={"ops": new})


# -- the layout ---------------------------------------------------------------------------------
def test_expert_layouts() -> None:
    inside = ExpertParallel(8, 8)
    assert (inside.moe_tp, inside.moe_ep, inside.dp, inside.group) == (1, 8, 1, 8)
    split = ExpertParallel(8, 2)
    assert (split.moe_tp, split.moe_ep, split.dp) == (4, 2, 1)
    dp = ExpertParallel(2, 8)
    assert (dp.moe_tp, dp.moe_ep, dp.dp, dp.group) == (1, 8, 4, 8)
    for tp, ep in ((4, 6), (3, 2), (0, 1)):
        with pytest.raises(InputError, match="ep must divide tp"):
            ExpertParallel(tp, ep)


def test_alltoall_bytes_by_hand() -> None:
    # 64 tokens x top-8 x hidden 7168 x 2 bytes, 7 of 8 experts remote, one GPU per replica
    assert alltoall_bytes(64, 8, 7168, 2, ExpertParallel(1, 8)) == 64 * 8 * 7168 * 2 * 7 // 8
    assert alltoall_bytes(64, 8, 7168, 2, ExpertParallel(1, 8)) == 6_422_528
    # tp=2: the replica's tokens leave from both of its GPUs, half each
    assert alltoall_bytes(64, 8, 7168, 2, ExpertParallel(2, 8)) == 3_211_264
    # experts inside the replica: every GPU already holds every token
    assert alltoall_bytes(64, 8, 7168, 2, ExpertParallel(8, 8)) == 0
    assert alltoall_bytes(0, 8, 7168, 2, ExpertParallel(1, 8)) == 0


def test_skew_imbalance_by_hand() -> None:
    # 4 experts with shares 1, 1/2, 1/3, 1/4 dealt to 2 ranks: rank 0 holds 1 + 1/3 of 25/12
    assert skew_imbalance(4, 2, 1.0) == pytest.approx((4 / 3) / (25 / 12) * 2)
    assert skew_imbalance(256, 8, 0.0) == 1.0  # balanced
    assert skew_imbalance(256, 1, 1.2) == 1.0  # one rank holds them all
    assert 1.0 < skew_imbalance(256, 8, 1.2) < skew_imbalance(256, 8, 2.0) <= 8


# -- all-to-all in the op model and the roofline ------------------------------------------------
def test_op_model_alltoall_is_bytes_over_the_link(cat, vllm) -> None:
    m = cat["deepseek-v3"]  # 58 expert layers, top-8, hidden 7168
    prof = without(vllm)
    cm = OpCostModel(prof, m, tp=1, ep=8, gpus_per_server=8)
    assert cm.moe is not None and cm.layout.dp == 8
    ops = {n: (s, src) for n, s, src in cm.breakdown(0, 0.0, 0, 64, 64 * 1024.0)}
    link = prof.links.nvlink
    assert prof.ops is not None
    eff = prof.ops.roofline.link_efficiency
    one = 6_422_528 / (link.bandwidth * eff) + 7 * link.latency  # bytes by hand, above
    assert ops["moe_dispatch"] == (pytest.approx(58 * one), "roofline")
    assert ops["moe_combine"] == ops["moe_dispatch"]
    assert ops["allreduce_mlp"][0] == 0.0  # tp=1; expert layers combine by all-to-all
    inside = OpCostModel(prof, m, tp=8, ep=8, gpus_per_server=8)
    ops8 = {n: s for n, s, _ in inside.breakdown(0, 0.0, 0, 64, 64 * 1024.0)}
    assert ops8["moe_dispatch"] == ops8["moe_combine"] == 0.0  # tokens on every GPU already
    # with the imported table: the table at the same bytes
    tab = OpCostModel(vllm, m, tp=1, ep=8, gpus_per_server=8)
    assert tab.moe is not None and tab.moe.a2a is not None
    got = {n: (s, src) for n, s, src in tab.breakdown(0, 0.0, 0, 64, 64 * 1024.0)}
    assert got["moe_dispatch"][0] == pytest.approx(58 * tab.moe.a2a.lookup(6_422_528)[0])


def test_roofline_alltoall_is_bytes_over_the_link(cat) -> None:
    prof = load_profile("h200-sxm")
    m = cat["qwen3-30b-a3b"]  # 48 expert layers, top-8, hidden 2048
    cost = iteration_cost(prof, m, tp=1, ep=8, gpus_per_server=8)
    assert isinstance(cost, MoeRoofline)
    link = prof.links.nvlink
    nbytes = 16 * 8 * 2048 * 2 * 7 // 8
    assert cost.alltoall_time(16) == pytest.approx(
        2 * 48 * (nbytes / link.bandwidth + 7 * link.latency)
    )
    alone = iteration_cost(prof, m, tp=1, ep=1, gpus_per_server=8)
    k = cost.work(0, 0.0, 0, 16, 16 * 1024.0)[1]
    k1 = alone.work(0, 0.0, 0, 16, 16 * 1024.0)[1]
    assert k - k1 == pytest.approx(cost.alltoall_time(16))


# -- experts per step ---------------------------------------------------------------------------
def test_an_8_token_decode_reads_at_most_8_times_top_k_experts(cat, vllm) -> None:
    """The op model's expert roofline reads the experts the batch touches: at 8 tokens
    E (1 - (1 - k/E)^8) <= 8 k per layer, and its seconds are that many experts' bytes."""
    prof = without(vllm)
    for name in ("qwen3-30b-a3b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"):
        m = cat[name]
        cm = OpCostModel(prof, m, tp=8 if name == "deepseek-v3" else 1)
        s = cm.shape
        touched = expected_experts(s.n_experts, s.top_k, 8)
        assert touched <= min(8 * s.top_k, s.n_experts)
        assert touched == pytest.approx(s.n_experts * (1 - (1 - s.top_k / s.n_experts) ** 8))
        ffn = s.moe_ffn // cm.layout.moe_tp
        weights = touched / cm.layout.moe_ep * 3 * s.hidden * ffn * s.dtype_bytes
        acts = 8 * s.top_k / cm.layout.moe_ep * (2 * s.hidden + 3 * ffn) * 2
        assert prof.ops is not None
        floor, mem = prof.ops.roofline.op_floor_s, prof.ops.roofline.memory_efficiency
        memory_s = (weights + acts) / (prof.gpu.hbm_bandwidth * mem) + floor
        secs, src = cm.moe.experts_time(8) if cm.moe else (0.0, "")
        assert src == "roofline" and secs == pytest.approx(memory_s)  # memory-bound at 8


def test_expert_table_by_shape_split_and_nearest_skew(cat, vllm) -> None:
    m = cat["qwen3-30b-a3b"]
    for skew, want in ((0.0, 0.0), (1.1, 1.01), (1.2, 1.2), (3.0, 1.2)):
        cm = OpCostModel(vllm, m, routing_skew=skew)
        assert cm.moe is not None and cm.moe.table is not None
        t = cm.moe.table
        assert (t.hidden, t.moe_ffn, t.top_k, t.n_experts, t.dtype) == (2048, 768, 8, 128, "bf16")
        assert (t.moe_tp, t.moe_ep, t.routing_skew) == (1, 1, want)
        ops = {n: s for n, s, _ in cm.breakdown(0, 0.0, 0, 16, 16 * 1024.0)}
        assert ops["moe_experts"] == pytest.approx(48 * t.lookup(16)[0])
    mx = OpCostModel(vllm, cat["mixtral-8x7b"], tp=2)
    assert mx.moe is not None and mx.moe.table is not None
    assert (mx.moe.table.moe_tp, mx.moe.table.moe_ep) == (2, 1)  # experts split by tp


# -- MLA ---------------------------------------------------------------------------------------
def test_mla_kv_bytes_per_token_from_the_config() -> None:
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    m = build_model(ModelEntry.model_validate(entry_from_config(cfg, "d", "fp8")))
    # one compressed latent plus the shared rotary key per layer, in the KV dtype (bf16)
    by_hand = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
    assert by_hand == 61 * (512 + 64) * 2 == 70_272
    assert m.kv_bytes_per_token == by_hand and m.kv_dtype_bytes == 2
    assert m.kv_heads == 1  # every TP rank caches the whole latent


def test_mla_decode_roofline_reads_the_latent_once(cat, vllm) -> None:
    m = cat["deepseek-v3"]
    prof = vllm.model_copy(update={"ops": vllm.ops.model_copy(update={"mla": []})})  # type: ignore[union-attr]
    cm = OpCostModel(prof, m, tp=8, ep=8)
    assert cm.mla is not None and not cm.mla.module_tables
    batch, ctx = 4, 4 * 2048.0
    lat = 512 + 64
    flops = 2.0 * 16 * ctx * (lat + 512)  # 128 / 8 heads on a GPU
    nbytes = ctx * lat * 2 + batch * 16 * 2 * lat * 2
    rl = prof.ops.roofline  # type: ignore[union-attr]
    want = (
        max(
            flops / (cm.peak * rl.attention_efficiency),
            nbytes / (prof.gpu.hbm_bandwidth * rl.memory_efficiency),
        )
        + rl.op_floor_s
    )
    assert cm.decode_attention_time(batch, ctx) == (pytest.approx(want), "roofline")
    tab = OpCostModel(vllm, m, tp=8, ep=8)  # the imported module tables: projections inside
    ops = {n: src for n, _, src in tab.breakdown(0, 0.0, 0, 4, ctx)}
    assert ops["qkv_gemm"] == ops["o_gemm"] == "in mla module"
    assert ops["attention_decode"] == "table"


def test_weights_per_gpu_shards_experts_over_ep(cat) -> None:
    m = cat["deepseek-v3"]
    experts = sum(ly.experts * ly.expert_bytes for ly in m.layers)
    dense = m.param_bytes - experts
    assert experts == 58 * 256 * 3 * 7168 * 2048  # fp8: 1 byte a weight
    assert weights_per_gpu([m], 8, 1, 8) == -(-dense // 8) + -(-experts // 8)
    assert weights_per_gpu([m], 1, 1, 8) == dense + experts // 8
    two = [cat["llama-3.1-8b"], cat["llama-2-7b"]]  # dense: the old ceil(total / g)
    assert weights_per_gpu(two, 2, 2) == -(-sum(x.param_bytes for x in two) // 4)


# -- the CLI and the scenario -------------------------------------------------------------------
def test_cost_ep_prices_and_refuses(cat) -> None:
    res = runner.invoke(app, ["cost", "--model", "deepseek-v3", "--tp", "8", "--ep", "8",
                              "--batch", "64", "--context", "4096", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["ep"] == 8 and out["sources"]["moe_experts"] == "table"
    assert out["sources"]["attention_decode"] == "table"
    for args, needle in (
        (["--model", "llama-3.1-8b", "--ep", "2"], "has no experts"),
        (["--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "3"], "ep must divide tp"),
        (["--model", "qwen3-30b-a3b", "--routing-skew", "-1"], "out of range"),
    ):
        res = runner.invoke(app, ["cost", *args])
        assert res.exit_code == 2 and needle in res.output, res.output


def test_scenario_ep_needs_experts_and_a_fitting_shape() -> None:
    from sim.feasible import check_feasible
    from sim.scenario import validate

    cat = load_catalogue()
    prof = load_profile("h200-sxm-vllm")
    base = {"profile": "h200-sxm-vllm", "mode": "coupled",
            "cluster": {"servers": 1, "gpus_per_server": 8, "tp": 8, "ep": 8}}  # fmt: skip
    ok = validate({**base, "deployments": [{"model": "deepseek-v3"}]}, "x.yaml")
    check_feasible(ok, cat, prof)
    dense = validate({**base, "deployments": [{"model": "llama-3.1-70b"}]}, "x.yaml")
    with pytest.raises(InputError, match="has no experts"):
        check_feasible(dense, cat, prof)
    bad = {**base, "cluster": {**base["cluster"], "tp": 4, "ep": 6}}
    with pytest.raises(InputError, match=r"cluster\.ep"):
        check_feasible(validate({**bad, "deployments": [{"model": "deepseek-v3"}]}, "x.yaml"),
                       cat, prof)  # fmt: skip


@pytest.mark.parametrize("profile", ["h200-sxm-vllm", "h200-sxm"])
def test_every_shipped_decoder_is_priced(cat, profile: str) -> None:
    """cost, run and plan share this price: every shipped decoder gets one, > 0 and growing
    with the batch, op tables or roofline (8 GPUs split every shipped model's heads)."""
    prof = load_profile(profile)
    for name, m in cat.items():
        if m.kind != "decoder":
            continue
        ep = 8 if m.n_experts else 1
        cost = iteration_cost(prof, m, tp=8, ep=ep, gpus_per_server=8)
        small = sum(cost.work(0, 0.0, 0, 1, 1024.0)[:2])
        big = sum(cost.work(0, 0.0, 0, 64, 64 * 1024.0)[:2])
        assert 0 < small < big, name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "tp", "ep"),
    [("deepseek-v3", 8, 8), ("deepseek-v3", 1, 8), ("qwen3-235b-a22b", 8, 8),
     ("qwen3-30b-a3b", 1, 1), ("mixtral-8x7b", 2, 1), ("gpt-oss-120b", 2, 1)],
)  # fmt: skip
def test_pdsim_run_serves_each_moe_model(model: str, tp: int, ep: int) -> None:
    args = ["run", "llama70b-h200", "--set", f"deployments.0.model={model}",
            "--set", "cluster.servers=1", "--set", f"cluster.tp={tp}", "--set", f"cluster.ep={ep}",
            "--set", "workload.rate=5", "--set", "workload.duration=2s", "--json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["requests"]["completed"] == out["requests"]["total"] > 0
