"""The hot loop's iteration price (``sim.serving.iterprice``): the roofline pass by hand, and
the pricer's direct path the same float as the cost model's public ``iteration_work``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.costmodel import CostModel, load_profile
from sim.serving.iterprice import IterPricer, RooflinePass
from sim.serving.models import load_catalogue
from sim.serving.opcost import OpCostModel

CAT = load_catalogue()


class _Wrapped:
    """An iteration cost that is not a :class:`RooflinePass` (priced through ``work``)."""

    def __init__(self, cost: RooflinePass) -> None:
        self.tp, self.pp = cost.tp, cost.pp
        self.work = cost.work
        self.breakdown = cost.breakdown


_ARGS = st.tuples(
    st.integers(0, 8192),  # prefill tokens
    st.floats(0.0, 8192.0**2),  # their squared lengths
    st.integers(0, 8),  # prompts that end
    st.integers(0, 256),  # decoding sequences
    st.floats(0.0, 256 * 8192.0),  # their context
)


@pytest.mark.parametrize(
    ("profile", "model", "tp", "pp"),
    [
        ("a100-80gb", "llama-2-7b", 1, 1),
        ("h200-sxm", "llama-3.1-70b", 8, 1),
        ("h200-sxm", "llama-3.1-70b", 4, 2),
    ],
)
@settings(max_examples=60, deadline=None)
@given(args=_ARGS)
def test_direct_path_is_the_iteration_costs_price_bit_for_bit(
    profile: str, model: str, tp: int, pp: int, args: tuple[int, float, int, int, float]
) -> None:
    cost = CostModel(load_profile(profile), CAT[model], tp=tp, pp=pp, gpus_per_server=8)
    assert isinstance(cost.iteration, RooflinePass)
    direct = IterPricer(cost.iteration, False, 2e-5)
    wrapped = IterPricer(_Wrapped(cost.iteration), False, 2e-5)
    assert direct.roof is cost.iteration and wrapped.roof is None
    assert direct.iter_cost(*args) == wrapped.iter_cost(*args)
    c, k, f, b = cost.iteration.work(*args)
    if args[0] > 0:  # decode-only prices come from the interpolated memo
        assert direct.iter_cost(*args) == (c + k + 2e-5, f, b)


def test_op_tables_price_through_the_iteration_cost() -> None:
    cost = CostModel(load_profile("h200-sxm-vllm"), CAT["llama-3.1-8b"])
    ops = cost.iteration
    assert isinstance(ops, OpCostModel)
    pricer = IterPricer(ops, False, 0.0)
    c, k, f, b = ops.work(512, 512.0**2, 1, 8, 8 * 1024.0)
    assert pricer.iter_cost(512, 512.0**2, 1, 8, 8 * 1024.0) == (c + k, f, b)
    assert c == ops.iteration_time(512, 512.0**2, 1, 8, 8 * 1024.0) and k == 0.0


def _pass(**kw: Any) -> RooflinePass:
    base: dict[str, Any] = dict(
        tp=2,
        pp=2,
        flop_rate=1e12,
        hbm_bandwidth=1e9,
        overhead=1e-5,
        launch=1e-4,
        attn_flops_per_ctx=100.0,
        kv_bytes_per_token_layer=10.0,
        kv_replication=1,
        hidden=64,
        dtype_bytes=2,
        act_bytes=2,
        n_allreduce=5,
        link=(1e-6, 1e8),
    )
    base.update(kw)
    # per TP rank: an embedding lookup, two attention layers, the LM head
    groups = [
        (0.0, 1e6, False, True, False, 1),
        (1e6, 4e6, True, False, False, 2),
        (2e6, 1e6, False, False, True, 1),
    ]
    return RooflinePass(groups, **base)


def test_roofline_pass_by_hand() -> None:
    # 100 prompt tokens (sq 1e4, one prompt ends) and 3 decodes holding 600 tokens of context
    compute, coll, flops, nbytes = _pass().work(100, 1e4, 1, 3, 600.0)
    tokens, sampled = 103.0, 4.0
    attn_f = (0.5 * 100 * 1e4 + 100 * 600) / 2  # causal prefill half, decode, per rank
    kv_b = 10.0 * (100 + 600) / 2
    emb = (0.0, min(1e6, tokens * 64 * 2 / 2))  # a lookup reads one row per token
    att = (1e6 * tokens + attn_f, 4e6 + kv_b)
    head = (2e6 * sampled, 1e6)  # logits for sampled tokens only
    per_rank = [(emb, 1), (att, 2), (head, 1)]
    t = sum(n * (max(f / 1e12, b / 1e9) + 1e-5) for (f, b), n in per_rank)
    assert compute == pytest.approx(t + 1e-4 * 2)  # one launch per PP stage
    act = tokens * 64 * 2
    ring = 2 * (2 - 1) * (1e-6 + act / 2 / 1e8)  # one all-reduce over 2 GPUs
    assert coll == pytest.approx(5 * ring + (1e-6 + act / 2 / 1e8))  # + one PP hand-off
    assert flops == pytest.approx(2 * sum(n * f for (f, _), n in per_rank))
    assert nbytes == pytest.approx(2 * sum(n * b for (_, b), n in per_rank))


def test_no_tokens_cost_nothing_and_one_gpu_has_no_collectives() -> None:
    assert _pass().work(0, 0.0, 0, 0, 0.0) == (0.0, 0.0, 0.0, 0.0)
    one = _pass(tp=1, pp=1)
    assert one.work(10, 100.0, 1, 0, 0.0)[1] == 0.0
    assert one.allreduce_time(1e6) == 0.0 and one.handoff_time(10.0) == 0.0
