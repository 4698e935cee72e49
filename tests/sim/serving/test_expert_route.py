"""The expert routers and popularity counts (sim.serving.expertroute)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.expertroute import Popularity, ZipfRouter


def test_eight_token_decode_batch_activates_at_most_eight_times_top_k() -> None:
    """Qwen3-30B-A3B's shape (48 layers x 128 experts, top-8): 8 tokens touch at most 64
    experts per layer, at least 8, all distinct and in range."""
    r = ZipfRouter(48, 128, 8, 1.2, np.random.default_rng(0))
    for step in range(20):
        for experts in r.route(step, 8):
            assert 8 <= len(experts) <= 8 * 8
            assert len(set(experts.tolist())) == len(experts)
            assert experts.min() >= 0 and experts.max() < 128


@settings(max_examples=60, deadline=None)
@given(
    n_experts=st.integers(1, 64),
    k_frac=st.floats(0, 1),
    tokens=st.integers(0, 600),
    exponent=st.floats(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_active_experts_within_bounds(
    n_experts: int, k_frac: float, tokens: int, exponent: float, seed: int
) -> None:
    k = max(1, round(k_frac * n_experts))
    r = ZipfRouter(3, n_experts, k, exponent, np.random.default_rng(seed))
    for experts in r.route(0, tokens):
        assert len(experts) <= min(n_experts, tokens * k)
        assert len(experts) >= (k if tokens else 0)
        assert np.all(np.diff(experts) > 0)  # sorted, distinct


def test_top1_pick_frequencies_follow_zipf() -> None:
    """With top_k = 1 each token picks one expert with probability rank ** -s / H: over
    20,000 single-token draws each expert's frequency is within 4 standard errors."""
    r = ZipfRouter(1, 16, 1, 1.0, np.random.default_rng(7))
    p = r.probabilities()[0]
    ranks = np.argsort(-p)
    h = sum(1.0 / i for i in range(1, 17))
    assert np.allclose(np.sort(p)[::-1], [1.0 / (i * h) for i in range(1, 17)])
    counts = np.zeros(16)
    n = 20_000
    for _ in range(n):
        counts[r.route(0, 1)[0]] += 1
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(counts / n - p) <= 4 * se + 1e-12)
    assert ranks[0] == int(np.argmax(counts))


def test_layers_rank_experts_in_their_own_order() -> None:
    r = ZipfRouter(4, 32, 2, 1.0, np.random.default_rng(1))
    tops = {int(np.argmax(row)) for row in r.probabilities()}
    assert len(tops) > 1  # four seeded permutations of 32 experts agree with prob 1/32**3


def test_same_seed_same_draws() -> None:
    a = ZipfRouter(5, 64, 4, 1.1, np.random.default_rng(3))
    b = ZipfRouter(5, 64, 4, 1.1, np.random.default_rng(3))
    for t in (1, 8, 300):
        assert all(np.array_equal(x, y) for x, y in zip(a.route(0, t), b.route(0, t), strict=True))


def test_popularity_likely_by_share_of_iterations() -> None:
    pop = Popularity(2, 6)
    assert pop.likely(0, 0.5) == []
    pop.record(0, np.array([4, 1]))
    pop.record(0, np.array([1, 2]))
    pop.record(0, np.array([5, 4]))
    pop.record(0, np.array([1]))
    # 4 iterations: expert 1 active in 3, 4 in 2, 2 and 5 in 1 each, 0 and 3 never
    assert pop.likely(0, 0.5) == [1, 4]
    assert pop.likely(0, 0.25) == [1, 4, 2, 5]  # ties by id
    assert pop.likely(0, 1.0) == []
    assert pop.likely(1, 0.1) == []
