"""The attention tables' layout: every (batch, x) knot of a table is timed on a call of that
knot's own shapes, batch outer, decode then prefill for each head layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwbench.opprobe as op
from engine.kv.storage import KVStorage
from sim.serving.opcost import TableOrigin

ORG = TableOrigin(device="cpu", framework="numpy", measured_at="2026-12-01", source="test")
Seen = tuple[str, int, int, int, int, int]


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[Seen]:
    """Replace the timed kernels by recorders of their shapes, and the timer by one call
    whose result is the 1-based index of what that call recorded (tables take
    positive times only)."""
    seen: list[Seen] = []

    def decode(
        q: Any, store: KVStorage, tables: Sequence[Sequence[int]], lens: list[int], **_: Any
    ) -> int:
        assert len(tables) == len(lens) == q.shape[0]
        assert len(set(lens)) == 1 and all(
            len(t) * 16 >= n for t, n in zip(tables, lens, strict=True)
        )
        seen.append(("decode", q.shape[0], q.shape[1], store.layout.kv_heads, lens[0] - 1, 0))
        return len(seen)

    def prefill(
        xp: Any, q: Any, k: Any, v: Any, lens: list[int], store: KVStorage, tables: Any
    ) -> int:
        assert q.shape[0] == k.shape[0] == sum(lens) and len(set(lens)) == 1
        assert k.shape[1] == store.layout.kv_heads
        seen.append(("prefill", len(lens), q.shape[1], k.shape[1], lens[0], len(tables)))
        return len(seen)

    def median(fn: Callable[[], object], *_: Any) -> float:
        return float(fn())  # type: ignore[arg-type]

    monkeypatch.setattr(op, "paged_decode_attention", decode)
    monkeypatch.setattr(op, "prefill_attention", prefill)
    monkeypatch.setattr(op, "_median", median)
    return seen


knots = st.lists(st.integers(1, 40), min_size=1, max_size=3, unique=True).map(sorted)


@settings(max_examples=15)
@given(
    layouts=st.lists(st.sampled_from([(4, 4), (8, 2), (2, 1)]), min_size=1, max_size=2),
    axes=st.tuples(knots, knots, knots, knots),
)
def test_every_knot_is_timed_on_its_own_shapes(
    layouts: list[tuple[int, int]], axes: tuple[list[int], ...]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        seen = _recording(mp)
        d_batch, d_ctx, p_batch, p_tokens = (tuple(a) for a in axes)
        grid = replace(
            op.OpGrid.tiny(),
            layouts=tuple(layouts),
            head_dim=8,
            decode_batch=d_batch,
            decode_context=d_ctx,
            prefill_batch=p_batch,
            prefill_tokens=p_tokens,
        )
        tables = op.attention_tables(np, grid, ORG)
    phases = [(t.phase, t.heads, t.kv_heads) for t in tables]
    assert phases == [(p, h, kv) for h, kv in layouts for p in ("decode", "prefill")]
    for t in tables:
        batches, xs = (d_batch, d_ctx) if t.phase == "decode" else (p_batch, p_tokens)
        assert t.curves.batch == list(batches) and t.curves.x == [list(xs)] * len(batches)
        assert t.head_dim == 8 and t.kv_dtype == "fp32"
        for i, b in enumerate(batches):
            for j, x in enumerate(xs):
                got = seen[int(t.curves.latency_s[i][j]) - 1]
                tables_n = b if t.phase == "prefill" else 0
                assert got == (t.phase, b, t.heads, t.kv_heads, x, tables_n)
    assert len(seen) == len(layouts) * (len(d_batch) * len(d_ctx) + len(p_batch) * len(p_tokens))


def test_decode_call_attends_over_the_new_token() -> None:
    """The decode step scatters the step's K/V (both ``kn``) at position ``ctx`` before it
    attends over ``ctx + 1`` tokens; every other slot is empty (zero keys and values), so
    each head's output is ``kn`` weighted by its softmax share ``e^s / (e^s + ctx)``."""
    ctx, heads, dim = 5, 2, 8
    out = np.asarray(op._decode_point(np, np.random.default_rng(0), dim)(heads, heads, 1, ctx)())
    rng = np.random.default_rng(0)  # the point's draws, in its order
    q = rng.standard_normal((1, heads, dim), dtype=np.float32)
    kn = rng.standard_normal((1, heads, dim), dtype=np.float32)
    s = (q * kn).sum(axis=-1, keepdims=True) / np.sqrt(dim)
    want = np.exp(s) / (np.exp(s) + ctx) * kn
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
