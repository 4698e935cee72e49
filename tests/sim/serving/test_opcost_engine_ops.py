"""How the op model prices pdsim's own engine: measured elementwise tables (norm,
activation, embedding) instead of the roofline, and q/k/v and gate/up as separate GEMMs
(``EngineTerms.split_projections``), each against a hand computation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.serving.costmodel import Profile, load_profile
from sim.serving.models import LlamaShape, ModelEntry, ModelSpec, build_model
from sim.serving.opcost import (
    ElementwiseTable,
    EngineTerms,
    GemmTable,
    Grid3,
    OpCostModel,
    OpsProfile,
    RooflineTerms,
    TableOrigin,
)

L, H, HEADS, KVH, FFN, VOCAB = 2, 64, 4, 2, 128, 100
HD = H // HEADS
ORG = TableOrigin(device="cpu", framework="numpy", measured_at="2026-12-01", source="test")


def fp32_model() -> ModelSpec:
    shape = LlamaShape(
        family="llama", n_layers=L, hidden=H, heads=HEADS, kv_heads=KVH, ffn=FFN, vocab=VOCAB
    )
    return build_model(ModelEntry(name="tiny32", kind="decoder", dtype_bytes=4, shape=shape))


def ew(op: str, per_element: float, floor: float) -> ElementwiseTable:
    """A linear table: ``floor + per_element * elements`` at knots 64..4096."""
    knots = [64, 256, 1024, 4096]
    return ElementwiseTable(
        origin=ORG,
        op=op,  # type: ignore[arg-type]
        elements=knots,
        latency_s=[floor + per_element * e for e in knots],
    )


# a GEMM table linear in n (exact under interpolation): seconds = 1e-6 * (1 + n / 64)
N_KNOTS = [16, 32, 64, 128, 256]


def gemm_secs(n: int) -> float:
    return 1e-6 * (1 + n / 64)


def profile(split: bool, tables: bool) -> Profile:
    grid = Grid3(
        m=[1, 1024],
        n=N_KNOTS,
        k=[64, 128],
        latency_s=[[[gemm_secs(n)] * 2 for n in N_KNOTS] for _ in range(2)],
    )
    ops = OpsProfile(
        roofline=RooflineTerms(op_floor_s=1e-6, fused=["rope"]),
        gemm=[GemmTable(origin=ORG, dtype="fp32", grid=grid)],
        elementwise=[
            ew("norm", 1e-9, 5e-6),
            ew("activation", 2e-9, 3e-6),
            ew("embedding", 0.5e-9, 2e-6),
        ]
        if tables
        else [],
        engine=EngineTerms(fused_iterations=False, split_projections=split),
    )
    return load_profile("h200-sxm").model_copy(update={"ops": ops})


def test_elementwise_table_lookup_by_hand() -> None:
    t = ew("norm", 1e-9, 5e-6)
    assert t.lookup(64) == (pytest.approx(5e-6 + 64e-9), False)
    assert t.lookup(640)[0] == pytest.approx(5e-6 + 640e-9)  # linear between knots
    assert t.lookup(10) == (pytest.approx(5e-6 + 64e-9), False)  # the first knot below
    secs, extra = t.lookup(8192)  # linear growth beyond the last knot
    assert extra and secs == pytest.approx((5e-6 + 4096e-9) * 2)


def test_elementwise_table_rejects_bad_knots() -> None:
    with pytest.raises(ValueError, match="ascending"):
        ElementwiseTable(origin=ORG, op="norm", elements=[4, 2], latency_s=[1e-6, 1e-6])
    with pytest.raises(ValueError, match="one value > 0"):
        ElementwiseTable(origin=ORG, op="norm", elements=[2, 4], latency_s=[1e-6])


def test_two_tables_for_one_elementwise_op_are_rejected() -> None:
    with pytest.raises(ValueError, match="two tables"):
        OpsProfile(elementwise=[ew("norm", 1e-9, 1e-6), ew("norm", 2e-9, 1e-6)])


@given(t=st.integers(1, 32))  # within the knots (4096 elements)
def test_norms_activation_embedding_come_from_the_tables(t: int) -> None:
    ops = OpCostModel(profile(split=True, tables=True), fp32_model()).iteration_ops(
        t, t * t, 1, 0, 0.0
    )
    norm = 5e-6 + 1e-9 * max(t * H, 64)
    assert ops["input_norm"] == pytest.approx(L * norm)
    assert ops["post_attn_norm"] == pytest.approx(L * norm)
    assert ops["final_norm"] == pytest.approx(norm)
    assert ops["activation"] == pytest.approx(L * (3e-6 + 2e-9 * max(t * FFN, 64)))
    assert ops["embedding"] == pytest.approx(2e-6 + 0.5e-9 * max(t * H, 64))
    assert ops["rope"] == 0.0  # the engine runs no rope: fused, 0 s


def test_without_tables_the_roofline_prices_norms() -> None:
    cost = OpCostModel(profile(split=True, tables=False), fp32_model())
    ops = cost.iteration_ops(8, 64, 1, 0, 0.0)
    assert ops["input_norm"] == pytest.approx(L * cost.elementwise_time(8, 2 * H, 2 * H))
    src = {o.name: o.source for o in cost.iteration_breakdown(8, 64, 1, 0, 0.0)}
    assert src["input_norm"] == "roofline"


@pytest.mark.parametrize("split", [False, True])
def test_split_projections_price_each_gemm(split: bool) -> None:
    cost = OpCostModel(profile(split=split, tables=True), fp32_model())
    ops = cost.iteration_ops(0, 0, 0, 4, 64.0)
    if split:  # q (n = 64), k and v (n = 32 each); gate and up (n = 128 each)
        qkv = gemm_secs(HEADS * HD) + 2 * gemm_secs(KVH * HD)
        gate_up = 2 * gemm_secs(FFN)
    else:  # one merged GEMM each: n = 128 and n = 256
        qkv = gemm_secs((HEADS + 2 * KVH) * HD)
        gate_up = gemm_secs(2 * FFN)
    assert ops["qkv_gemm"] == pytest.approx(L * qkv)
    assert ops["gate_up_gemm"] == pytest.approx(L * gate_up)
    assert ops["down_gemm"] == pytest.approx(L * gemm_secs(H))
    # split GEMMs pay one floor each: 1e-6 more per extra call
    merged = OpCostModel(profile(split=False, tables=True), fp32_model()).iteration_ops(
        0, 0, 0, 4, 64.0
    )
    extra = (ops["qkv_gemm"] + ops["gate_up_gemm"]) - (merged["qkv_gemm"] + merged["gate_up_gemm"])
    assert extra == pytest.approx(L * 3e-6 if split else 0.0)


def test_iteration_time_equals_the_breakdown_with_tables() -> None:
    cost = OpCostModel(profile(split=True, tables=True), fp32_model())
    for args in ((16, 256, 1, 0, 0.0), (0, 0, 0, 3, 90.0), (32, 600, 2, 0, 0.0)):
        assert cost.iteration_time(*args) == pytest.approx(sum(cost.iteration_ops(*args).values()))
