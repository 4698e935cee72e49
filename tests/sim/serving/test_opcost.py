"""The op-level cost model: op sums against hand-computed rooflines, table interpolation,
all-reduce growth, the fused iteration, and the shipped op-table profiles."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from sim.serving.costmodel import Profile, load_profile, parse_profile
from sim.serving.costmodel import load_profile as load_op_profile
from sim.serving.models import LlamaShape, ModelEntry, ModelSpec, build_model, load_catalogue
from sim.serving.opcost import OP_NAMES, DecoderShape, OpCostModel, OpsProfile, RooflineTerms
from sim.serving.opcost.profiles import OP_PROFILES

# A small decoder: head_dim 16, GQA group 2.
L, H, HEADS, KVH, FFN, VOCAB = 2, 64, 4, 2, 128, 100
HD = H // HEADS


def tiny_model(kv_heads: int = KVH) -> ModelSpec:
    shape = LlamaShape(
        family="llama", n_layers=L, hidden=H, heads=HEADS, kv_heads=kv_heads, ffn=FFN, vocab=VOCAB
    )
    return build_model(ModelEntry(name="tiny", kind="decoder", dtype_bytes=2, shape=shape))


ROOF = RooflineTerms(
    gemm_efficiency=0.5,
    attention_efficiency=0.25,
    memory_efficiency=0.8,
    op_floor_s=1e-6,
    link_efficiency=0.5,
    iteration_overhead_s=2e-5,
)


def roofline_profile(**roof: object) -> Profile:
    """The h200-sxm datasheet profile with a slow GPU (so both roofline sides matter) and no
    op tables."""
    base = load_profile("h200-sxm")
    gpu = base.gpu.model_copy(update={"flops_fp16": 1e12, "hbm_bandwidth": 1e11})
    ops = OpsProfile(roofline=ROOF.model_copy(update=roof))
    return base.model_copy(update={"gpu": gpu, "ops": ops})


# -- hand-computed roofline -----------------------------------------------------------------------
PEAK, BW = 1e12, 1e11


def rl(flops: float, nbytes: float, eff: float) -> float:
    return max(flops / (PEAK * eff), nbytes / (BW * 0.8)) + 1e-6


def gemm(m: int, n: int, k: int) -> float:
    return rl(2.0 * m * n * k, 2.0 * (n * k + m * k + m * n), 0.5)


def elementwise(t: int, din: int, dout: int) -> float:
    return rl(0.0, 2.0 * t * (din + dout), 1.0)


@pytest.mark.parametrize("tp", [1, 2])
def test_op_sums_equal_hand_computed_roofline(tp: int) -> None:
    cm = OpCostModel(roofline_profile(), tiny_model(), tp=tp)
    pt, n_prompts, sq, nd, ctx = 30, 2, 20**2 + 10**2, 3, 3 * 50.0
    ops = cm.iteration_ops(pt, sq, n_prompts, nd, ctx)
    t = pt + nd
    qh, kvh = HEADS // tp, KVH // tp
    ffn = FFN // tp
    link = load_profile("h200-sxm").links.nvlink
    ar = (
        0.0
        if tp == 1
        else 2 * (tp - 1) / tp * t * H * 2 / (link.bandwidth * 0.5) + 2 * (tp - 1) * link.latency
    )
    kv_bytes = 2  # bf16 KV
    expected = {
        "embedding": rl(0, 2 * t * H * 2, 1.0),
        "embedding_allreduce": ar,
        "input_norm": L * elementwise(t, 2 * H, 2 * H),
        "qkv_gemm": L * gemm(t, (qh + 2 * kvh) * HD, H),
        "rope": L * elementwise(t, (qh + kvh) * HD, (qh + kvh) * HD),
        "attention_prefill": L
        * rl(
            4.0 * qh * HD * sq / 2,
            pt * (2 * qh + 2 * kvh) * HD * 2 + pt * 2 * kvh * HD * kv_bytes,
            0.25,
        ),
        "attention_decode": L
        * rl(4.0 * qh * HD * ctx, ctx * 2 * kvh * HD * kv_bytes + nd * 2 * qh * HD * 2, 0.25),
        "o_gemm": L * gemm(t, H, qh * HD),
        "allreduce_attn": L * ar,
        "post_attn_norm": L * elementwise(t, 2 * H, 2 * H),
        "gate_up_gemm": L * gemm(t, 2 * ffn, H),
        "activation": L * elementwise(t, 2 * ffn, ffn),
        "down_gemm": L * gemm(t, H, ffn),
        "allreduce_mlp": L * ar,
        "final_norm": elementwise(t, H, H),
        "lm_head": gemm(n_prompts + nd, VOCAB // tp, H),
        "iteration_overhead": 2e-5,
    }
    assert set(ops) == set(OP_NAMES)
    for name, value in expected.items():
        assert ops[name] == pytest.approx(value, rel=1e-12), name
    assert cm.iteration_time(pt, sq, n_prompts, nd, ctx) == pytest.approx(sum(expected.values()))


def test_sources_say_roofline_without_tables_and_fused_ops_cost_nothing() -> None:
    cm = OpCostModel(roofline_profile(fused=["rope"]), tiny_model(), tp=2)
    by = {op.name: op for op in cm.iteration_breakdown(8, 64, 1, 2, 20.0)}
    assert by["rope"].seconds == 0.0 and by["rope"].source == "fused"
    for name in ("qkv_gemm", "attention_prefill", "attention_decode", "allreduce_attn"):
        assert by[name].source == "roofline" and by[name].seconds > 0
    solo = OpCostModel(roofline_profile(), tiny_model(), tp=1)
    by1 = {op.name: op for op in solo.iteration_breakdown(0, 0, 0, 2, 20.0)}
    assert by1["allreduce_mlp"].source == "not run" and by1["attention_prefill"].seconds == 0


def test_fused_iteration_reads_weights_once_and_logits_only_last_tokens() -> None:
    prof = load_op_profile("h200-sxm-vllm")
    cm = OpCostModel(prof, load_catalogue()["llama-2-7b"])
    prefill = cm.iteration_time(512, 512**2, 1, 0, 0.0)
    decode = cm.iteration_time(0, 0, 0, 16, 16 * 1024.0)
    mixed = cm.iteration_time(512, 512**2, 1, 16, 16 * 1024.0)
    assert max(prefill, decode) < mixed < prefill + decode
    # lm_head sees one row per prompt (its last token), not every prompt token
    ops = cm.iteration_ops(4096, 4096**2, 1, 0, 0.0)
    assert ops["lm_head"] == pytest.approx(cm.gemm_time(1, 32000, 4096, "bf16")[0])
    assert cm.iteration_time(0, 0, 0, 0, 0.0) == 0.0


def test_decode_and_prefill_grow_with_batch_and_context_on_shipped_tables() -> None:
    cm = OpCostModel(load_op_profile("h200-sxm-vllm"), load_catalogue()["llama-2-7b"])
    for b in (1, 8, 64):
        times = [cm.iteration_time(0, 0, 0, b, float(b * c)) for c in (512, 2048, 8192)]
        assert times == sorted(times) and times[0] < times[-1]
    pre = [cm.iteration_time(p, p * p, 1, 0, 0.0) for p in (128, 512, 2048, 8192)]
    assert pre == sorted(pre)


def test_allreduce_grows_with_bytes_and_group_size() -> None:
    cm = OpCostModel(roofline_profile(), tiny_model(), tp=2)
    sizes = [2**i for i in range(10, 31, 2)]
    for g in (2, 4, 8):
        times = [cm.allreduce_time(b, g)[0] for b in sizes]
        assert all(a < b for a, b in itertools.pairwise(times))
    for b in sizes:
        times = [cm.allreduce_time(b, g)[0] for g in (2, 4, 8, 16)]
        assert all(a < b for a, b in itertools.pairwise(times))
    assert cm.allreduce_time(1 << 20, 1)[0] == 0.0
    # the measured tables (vLLM custom all-reduce on H200) grow with size above 256 KiB
    shipped = OpCostModel(load_op_profile("h200-sxm-vllm"), tiny_model(), tp=2)
    for g in (2, 4, 8):
        times = [shipped.allreduce_time(2**i, g) for i in range(18, 31)]
        assert all(src == "table" for _, src in times[:-1])
        secs = [s for s, _ in times]
        assert all(a < b for a, b in itertools.pairwise(secs))


def test_attention_table_of_another_head_count_is_scaled() -> None:
    prof = load_op_profile("h200-sxm-vllm")
    # 4 query / 2 KV heads of dim 16 are not in the tables: head_dim 16 -> roofline
    assert OpCostModel(prof, tiny_model()).decode_attention_time(4, 400.0)[1] == "roofline"

    def model(heads: int, kv_heads: int) -> ModelSpec:
        shape = LlamaShape(family="llama", n_layers=2, hidden=128 * heads, heads=heads,
                           kv_heads=kv_heads, ffn=256, vocab=64)  # fmt: skip
        return build_model(ModelEntry(name=f"m{heads}", kind="decoder", shape=shape))

    # 36 query / 6 KV heads (GQA group 6) is not measured; 48 / 8 (group 6) is
    secs, src = OpCostModel(prof, model(36, 6)).decode_attention_time(8, 8 * 1024.0)
    ref, ref_src = OpCostModel(prof, model(48, 8)).decode_attention_time(8, 8 * 1024.0)
    assert (src, ref_src) == ("table-scaled", "table")
    assert secs == pytest.approx(ref * 36 / 48)


def test_decoder_shape_recovers_mlp_and_vocab() -> None:
    cat = load_catalogue()
    s = DecoderShape.from_model(cat["llama-2-70b"])
    assert (s.n_layers, s.hidden, s.heads, s.kv_heads, s.ffn, s.vocab) == (
        80,
        8192,
        64,
        8,
        28672,
        32000,
    )
    with pytest.raises(InputError, match="resnet-50"):
        DecoderShape.from_model(cat["resnet-50"])
    with pytest.raises(InputError, match="tp=3"):
        OpCostModel(load_profile("h200-sxm"), cat["llama-2-7b"], tp=3)


def test_shipped_op_profiles_load_and_record_their_origin() -> None:
    for name in OP_PROFILES:
        prof = load_op_profile(name)
        assert prof.ops is not None and prof.ops.gemm and prof.ops.attention
        for table in [*prof.ops.gemm, *prof.ops.attention, *prof.ops.all_reduce]:
            assert "aiconfigurator" in table.origin.source
            assert table.origin.device.startswith("NVIDIA")
    for name in ("h200-sxm", "h100-sxm", "a100-80gb"):
        assert load_op_profile(name).source == "datasheet"


def test_ops_section_is_strict() -> None:
    raw = json.loads(load_profile("h200-sxm").model_dump_json())
    raw["ops"] = {"roofline": {"gemm_eficiency": 0.5}}
    with pytest.raises(InputError, match=r"ops\.roofline"):
        parse_profile(json.dumps(raw), "p.json")
    raw["ops"] = {"all_reduce": [{"origin": {"device": "d", "framework": "f",
                  "measured_at": "2026", "source": "s"}, "group": 2, "bytes": [8, 4],
                  "latency_s": [1e-6, 2e-6]}]}  # fmt: skip
    with pytest.raises(InputError, match="ascending"):
        parse_profile(json.dumps(raw), "p.json")


@settings(max_examples=80, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 4096), max_size=4),
    n_decode=st.integers(0, 256),
    mean_ctx=st.floats(1, 32768),
    tp=st.sampled_from([1, 2, 8]),
)
def test_iteration_time_is_the_sum_of_its_ops(
    chunks: list[int], n_decode: int, mean_ctx: float, tp: int
) -> None:
    """The memoised fast path agrees with the op-by-op breakdown (repeated calls included)."""
    cm = SHIPPED_70B[tp]
    args = (sum(chunks), sum(c * c for c in chunks), len(chunks), n_decode, n_decode * mean_ctx)
    for _ in range(2):
        assert cm.iteration_time(*args) == pytest.approx(sum(cm.iteration_ops(*args).values()))


SHIPPED_70B = {
    tp: OpCostModel(load_op_profile("h200-sxm-vllm"), load_catalogue()["llama-2-70b"], tp=tp)
    for tp in (1, 2, 8)
}
