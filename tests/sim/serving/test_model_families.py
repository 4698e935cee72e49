"""Decoder shapes beyond dense LLaMA: q/k norms agree between the catalogue and the op cost
model (Qwen3-32B runs), and mixture-of-experts / MLA shapes expand to the right parameter
bytes, active FLOPs and KV bytes, checked against independent arithmetic."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.serving.costmodel import load_profile
from sim.serving.itercost import iteration_cost
from sim.serving.models import ModelSpec, load_catalogue, parse_catalogue
from sim.serving.moeroofline import MoeRoofline
from sim.serving.opcost import DecoderShape, OpCostModel
from sim.serving.roofline import roofline_pass

runner = CliRunner()


@pytest.fixture(scope="module")
def cat() -> dict[str, ModelSpec]:
    return load_catalogue()


def one(shape: str, extra: str = "") -> ModelSpec:
    text = f"models:\n  - name: m\n    kind: decoder\n{extra}    shape: {{{shape}}}\n"
    return parse_catalogue(text, "x.yaml")["m"]


# -- Qwen3-32B: q/k norms counted once, the op cost model reads the shape --------------------
def test_qwen3_32b_shape_is_read_not_divided(cat) -> None:
    for name in ("qwen3-32b", "qwen3-32b-fp8"):
        s = DecoderShape.from_model(cat[name])
        assert (s.hidden, s.heads, s.kv_heads, s.head_dim) == (5120, 64, 8, 128)
        assert (s.ffn, s.vocab, s.n_layers) == (25600, 151936, 64)
    # 32,762,123,264 by hand in test_models.py; the published figure is 32.8e9
    assert cat["qwen3-32b"].param_count == pytest.approx(32.76e9, rel=1e-3)


def test_explicit_layers_derive_ffn_with_the_same_count(cat) -> None:
    """A model given as explicit layers (no shape) still has its MLP width recovered from the
    block bytes, and a q/k-norm-sized remainder is refused rather than misread."""
    m = cat["llama-3.1-8b"]
    explicit = m.model_copy(update={"shape": None})
    assert DecoderShape.from_model(explicit).ffn == 14336
    q = cat["qwen3-32b"].model_copy(update={"shape": None})
    with pytest.raises(InputError, match="MLP parameters"):
        DecoderShape.from_model(q)  # 256 q/k-norm weights are not 3 * hidden * ffn


def test_pdsim_cost_prices_qwen3_32b() -> None:
    res = runner.invoke(app, ["cost", "--model", "qwen3-32b", "--tp", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["seconds"] > 0 and out["sources"]["gate_up_gemm"] == "table"


@pytest.mark.slow
def test_pdsim_run_serves_qwen3_32b() -> None:
    args = ["run", "llama70b-h200", "--set", "deployments.0.model=qwen3-32b",
            "--set", "cluster.servers=1", "--set", "cluster.tp=2", "--set", "workload.rate=4",
            "--set", "workload.duration=2s", "--json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["requests"]["completed"] == out["requests"]["total"] > 0


# -- mixture of experts and MLA ----------------------------------------------------------------
MIXTRAL = ("family: mixtral, n_layers: 2, hidden: 64, heads: 4, kv_heads: 2, n_experts: 8, "
           "top_k: 2, moe_ffn: 96, vocab: 100")  # fmt: skip


def test_moe_block_counts_every_expert_but_runs_top_k() -> None:
    m = one(MIXTRAL)
    attn = 2 * 64 * 64 + 2 * 64 * 32  # q, o + k, v (head_dim 16, 2 KV heads)
    expert = 3 * 64 * 96
    router = 64 * 8
    block = attn + router + 8 * expert + 2 * 64
    assert m.param_count == 2 * block + 2 * 100 * 64 + 64
    assert m.layers[1].flops_per_token == 2.0 * (attn + router + 2 * expert)
    assert (m.layers[1].experts, m.layers[1].expert_bytes) == (8, 2 * expert)
    assert (m.n_experts, m.top_k, m.moe_layers, m.expert_bytes) == (8, 2, 2, 2 * expert)
    assert m.active_param_bytes == m.param_bytes - 2 * 6 * 2 * expert
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # dense attention: unchanged


def test_dense_first_layers_and_layer_step() -> None:
    m = one(MIXTRAL.replace("n_layers: 2", "n_layers: 6")
            + ", ffn: 128, first_dense_layers: 1, moe_layer_step: 2")  # fmt: skip
    # blocks 0..5: block 0 dense (first), then MoE where (i + 1) % 2 == 0: 1, 3, 5
    assert [ly.experts for ly in m.layers[1:-1]] == [0, 8, 0, 8, 0, 8]
    dense = [ly for ly in m.layers[1:-1] if not ly.experts]
    assert {ly.flops_per_token for ly in dense} == {
        2.0 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)
    }


def test_mla_caches_the_latent_and_counts_its_projections() -> None:
    shape = ("family: deepseek_v3, n_layers: 3, hidden: 64, heads: 4, ffn: 128, vocab: 100, "
             "q_lora_rank: 24, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4, "
             "v_head_dim: 8")  # fmt: skip
    m = one(shape, "    kv_dtype_bytes: 1\n")
    q = 64 * 24 + 24 * 4 * 12
    kv = 64 * (16 + 4) + 16 * 4 * (8 + 8)
    o = 4 * 8 * 64
    block = q + kv + o + 3 * 64 * 128 + 2 * 64 + 24 + 16
    assert m.param_count == 3 * block + 2 * 100 * 64 + 64
    assert m.layers[1].flops_per_token == 2.0 * (q + kv + o + 3 * 64 * 128)
    assert m.kv_bytes_per_token == 3 * (16 + 4) * 1  # latent + rotary key, 1 byte each
    assert m.mla and m.head_dim == 12


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        (MIXTRAL.replace("top_k: 2", "top_k: 9"), "top_k"),
        (MIXTRAL.replace("moe_ffn: 96", "moe_ffn: 0"), "moe_ffn"),
        (MIXTRAL + ", first_dense_layers: 1", "ffn must be >= 1"),
        (MIXTRAL + ", n_shared_experts: 1", "shared_ffn"),
        ("family: llama, n_layers: 1, hidden: 64, heads: 4, ffn: 8, vocab: 9, top_k: 2", "n_experts"),
        ("family: llama, n_layers: 1, hidden: 64, heads: 4, ffn: 8, vocab: 9, v_head_dim: 2",
         "kv_lora_rank"),
    ],
)  # fmt: skip
def test_inconsistent_moe_and_mla_shapes_name_the_entry(shape: str, match: str) -> None:
    with pytest.raises(InputError, match=rf"x\.yaml: models\[0\]: .*{match}"):
        one(shape)


def test_moe_and_mla_get_op_tables_or_the_roofline() -> None:
    m = one(MIXTRAL)
    assert isinstance(iteration_cost(load_profile("h200-sxm"), m), MoeRoofline)  # no tables
    assert isinstance(iteration_cost(load_profile("h200-sxm-vllm"), m), OpCostModel)
    s = DecoderShape.from_model(m)
    assert (s.n_moe_layers, s.n_dense_layers, s.n_experts, s.top_k) == (2, 0, 8, 2)
    mla = one("family: deepseek_v3, n_layers: 1, hidden: 64, heads: 4, ffn: 8, vocab: 9, "
              "kv_lora_rank: 16, qk_rope_head_dim: 4, v_head_dim: 8")  # fmt: skip
    for profile in ("h200-sxm", "h200-sxm-vllm"):  # MLA is priced: roofline or op model
        c, k, _, _ = iteration_cost(load_profile(profile), mla).work(0, 0.0, 0, 4, 4096.0)
        assert c + k > 0
    # the op model's MLA decode reads each sequence's latent once for all heads: 4 heads
    # and 1 head read the same 4096 x (16 + 4) latent elements
    cm = OpCostModel(load_profile("h200-sxm-vllm"), mla)
    assert cm.mla is not None and not cm.mla.module_tables  # no table of these dimensions
    assert cm.kv_elem_bytes == 2.0 and mla.kv_heads == 1


def without_experts(m: ModelSpec, experts_read: float) -> ModelSpec:
    """``m`` with every expert layer's bytes cut to ``experts_read`` experts (the reference)."""
    layers = []
    for ly in m.layers:
        cut = ly.experts * ly.expert_bytes - round(experts_read * ly.expert_bytes)
        layers.append(ly.model_copy(update={"param_bytes": ly.param_bytes - cut}))
    return m.model_copy(update={"layers": layers})


def test_moe_roofline_reads_the_experts_a_batch_touches(cat) -> None:
    prof = load_profile("h200-sxm")
    m = cat["qwen3-30b-a3b"]  # 128 experts, top 8, 48 expert layers
    cost = iteration_cost(prof, m, tp=2, gpus_per_server=8)
    c8, k8, f8, b8 = cost.work(0, 0.0, 0, 8, 8 * 1024.0)
    # 8 tokens x top-8 of 128: 128 * (1 - (120/128)^8) = 51.6 experts per layer, < 8 * 8
    touched = 128 * (1 - (120 / 128) ** 8)
    ref = roofline_pass(prof, without_experts(m, touched), tp=2, gpus_per_server=8)
    assert b8 == pytest.approx(ref.work(0, 0.0, 0, 8, 8 * 1024.0)[3], rel=1e-9)
    upper = roofline_pass(prof, without_experts(m, 64), tp=2, gpus_per_server=8)
    assert b8 < upper.work(0, 0.0, 0, 8, 8 * 1024.0)[3]
    # FLOPs count the top-k experts whatever the batch touches: the plain roofline's
    full = roofline_pass(prof, m, tp=2, gpus_per_server=8)
    assert f8 == full.work(0, 0.0, 0, 8, 8 * 1024.0)[2]
    # a large batch touches every expert: the whole model's weights
    big = (4096, 4096.0**2, 1, 0, 0.0)
    assert cost.work(*big)[3] == pytest.approx(full.work(*big)[3], rel=1e-6)
    # more tokens never read fewer bytes or take less time
    prices = [cost.work(0, 0.0, 0, n, n * 1024.0) for n in (1, 2, 8, 64, 512)]
    assert all(a[3] <= b[3] and a[0] <= b[0] for a, b in itertools.pairwise(prices))
    assert sum(s for _, s, _ in cost.breakdown(0, 0.0, 0, 8, 8 * 1024.0)) == pytest.approx(c8 + k8)


def test_dense_entries_expand_as_before(cat) -> None:
    """The extra fields leave a dense model's layers as they were (the trace hashes depend on
    them): no experts, all FLOPs active."""
    for m in cat.values():
        if m.kind == "decoder" and not m.n_experts:
            assert all(ly.experts == 0 == ly.expert_bytes for ly in m.layers)
            assert m.active_param_bytes == m.param_bytes and m.top_k == 0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6),
    hidden=st.integers(4, 64),
    heads_kv=st.sampled_from([(4, 4), (4, 2), (8, 1)]),
    hd=st.sampled_from([4, 8]),
    ek=st.sampled_from([(4, 1), (8, 2), (16, 4)]),
    moe_ffn=st.integers(1, 50),
    ffn=st.integers(1, 50),
    shared=st.integers(0, 40),
    first=st.integers(0, 3),
    step=st.integers(1, 3),
    flags=st.tuples(*[st.booleans()] * 6),
)
def test_moe_shapes_match_reference(
    n: int,
    hidden: int,
    heads_kv: tuple[int, int],
    hd: int,
    ek: tuple[int, int],
    moe_ffn: int,
    ffn: int,
    shared: int,
    first: int,
    step: int,
    flags: tuple[bool, ...],
) -> None:
    """Parameters, active FLOPs and expert layers of random MoE shapes against the
    arithmetic written out here."""
    heads, kv = heads_kv
    e, k = ek
    qkv_bias, o_bias, sinks, qk_norm, rbias, ebias = flags
    first = min(first, n)
    shape = (
        f"family: llama, n_layers: {n}, hidden: {hidden}, heads: {heads}, kv_heads: {kv}, "
        f"head_dim: {hd}, ffn: {ffn}, vocab: 7, n_experts: {e}, top_k: {k}, "
        f"moe_ffn: {moe_ffn}, first_dense_layers: {first}, moe_layer_step: {step}, "
        f"qkv_bias: {str(qkv_bias).lower()}, o_bias: {str(o_bias).lower()}, "
        f"attention_sinks: {str(sinks).lower()}, qk_norm: {str(qk_norm).lower()}, "
        f"router_bias: {str(rbias).lower()}, expert_bias: {str(ebias).lower()}"
    )
    if shared:
        shape += f", n_shared_experts: 1, shared_ffn: {shared}"
    m = one(shape)
    attn_w = 2 * hidden * heads * hd + 2 * hidden * kv * hd
    extra = 2 * hidden + qk_norm * 2 * hd + qkv_bias * (heads + 2 * kv) * hd
    extra += o_bias * hidden + sinks * heads
    total = 2 * 7 * hidden + hidden
    for i in range(n):
        moe = i >= first and (i + 1) % step == 0
        layer = m.layers[1 + i]
        if moe:
            one_expert = 3 * hidden * moe_ffn + ebias * (2 * moe_ffn + hidden)
            mlp = e * one_expert + hidden * e + rbias * e + 3 * hidden * shared
            active = hidden * e + k * 3 * hidden * moe_ffn + 3 * hidden * shared
            assert (layer.experts, layer.expert_bytes) == (e, 2 * one_expert)
        else:
            mlp = active = 3 * hidden * ffn
            assert layer.experts == 0
        assert layer.flops_per_token == 2.0 * (attn_w + active)
        total += attn_w + extra + mlp
    assert m.param_count == total


def test_explicit_expert_layers_need_top_k() -> None:
    base = (
        "models:\n  - name: m\n    kind: decoder\n{top}    layers:\n"
        "      - {{name: b0, param_bytes: 800, expert_bytes: 100, experts: 8, attention: true}}\n"
    )
    m = parse_catalogue(base.format(top="    top_k: 2\n"), "x.yaml")["m"]
    assert (m.top_k, m.n_experts, m.active_param_bytes) == (2, 8, 200)
    for top in ("", "    top_k: 9\n"):
        with pytest.raises(InputError, match=r"x\.yaml: models\[0\]: .*top_k in 1\.\.8"):
            parse_catalogue(base.format(top=top), "x.yaml")
