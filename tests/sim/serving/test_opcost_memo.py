"""``OpCostModel.iteration_time``'s memo (token-count part and logits-rows part kept apart) is
exact: after any sequence of calls, each answer equals, bit for bit, the breakdown's sum on a
fresh model -- the fixed ops in the breakdown's order plus the two attention terms."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.costmodel import load_profile
from sim.serving.models import load_catalogue
from sim.serving.opcost import OpCostModel

_CALLS = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 6), st.integers(0, 12), st.integers(0, 900)),
    min_size=1,
    max_size=25,
)


def _reference(cm: OpCostModel, pt: int, sq: int, npr: int, nd: int, ctx: float) -> float:
    """The unmemoised rule: sum of every op but attention and the framework's per-request
    and per-token ops, in order, then the attention, then those two (from the breakdown of
    the iteration itself: admission counts the prompts ending in it, not the sampled rows)."""
    per_call = ("admission", "token_output")
    fixed = sum(
        op.seconds
        for op in cm.iteration_breakdown(pt + nd, pt + nd, npr + nd, 0, 0.0)
        if op.name not in ("attention_prefill", "attention_decode", *per_call)
    )
    attn = cm.prefill_attention_time(pt, sq, npr)[0] + cm.decode_attention_time(nd, ctx)[0]
    own = {op.name: op.seconds for op in cm.iteration_breakdown(pt, sq, npr, nd, ctx)}
    return fixed + cm.shape.n_layers * attn + 0.0 * pt + (own["admission"] + own["token_output"])


SPEC = load_catalogue()["llama-2-7b"]
PROF = load_profile("h200-sxm-vllm")
FRESH = OpCostModel(PROF, SPEC, tp=2)  # only its breakdown and attention terms are used


@settings(max_examples=40, deadline=None)
@given(calls=_CALLS)
def test_memoised_iteration_time_is_the_breakdown_sum_bit_for_bit(calls: list) -> None:
    memo, fresh = OpCostModel(PROF, SPEC, tp=2), FRESH
    for pt, npr, nd, ctx in calls:
        npr = min(npr, pt)  # prompts ending here carry at least one token each
        sq = pt * pt
        if pt + nd == 0:
            continue
        got = memo.iteration_time(pt, sq, npr, nd, float(ctx * nd))
        assert got == _reference(fresh, pt, sq, npr, nd, float(ctx * nd))
