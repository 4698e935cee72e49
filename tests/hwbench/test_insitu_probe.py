"""Op tables timed in place: the hook changes no result, each op is counted once, every
knot is served at its own shapes, and the tables divide the op seconds as documented; the
engine's causal prefill attention (what the prefill table times) is causal attention."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import platform
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.runtime.model as model_mod
from engine.runtime.heap import keep_freed_memory
from engine.runtime.model import DecoderConfig, DecoderModel, IterationState
from hwbench.insitu_probe import PROBE_BLOCKS, OpTimer, insitu_tables, probe_config
from hwbench.opprobe import OpGrid, origin

CFG = DecoderConfig("t", n_blocks=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=64)


def _weights(cfg: DecoderConfig, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {n: rng.standard_normal(s, dtype=np.float32) * 0.1 for n, s in cfg.layout(i)}
        for i in range(cfg.n_layers)
    ]


def _serve(m: DecoderModel, w: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """A prefill iteration of two prompts, then two decode iterations; all logits."""
    out = []
    st_ = m.begin([(0, np.arange(5) % 64), (1, np.arange(9) % 64)], [])
    for layer in range(CFG.n_layers):
        m.run_layer(st_, layer, w[layer])
    out.append(st_.logits_p)
    for tok in (3, 7):
        st_ = m.begin([], [(0, tok), (1, tok + 1)])
        for layer in range(CFG.n_layers):
            m.run_layer(st_, layer, w[layer])
        out.append(st_.logits_d)
    return out


def test_timing_the_ops_changes_no_result() -> None:
    w = _weights(CFG, 0)
    plain = _serve(DecoderModel(CFG, 256), w)
    timed_model = DecoderModel(CFG, 256)
    timer = OpTimer(itertools.count().__next__)  # type: ignore[arg-type]
    timed_model.op = timer
    timed = _serve(timed_model, w)
    for a, b in zip(plain, timed, strict=True):
        np.testing.assert_array_equal(a, b)
    names = set(timer.take())
    assert names == {
        "embedding", "input_norm", "qkv_gemm", "attention_prefill", "attention_decode",
        "o_gemm", "residual_add", "post_attn_norm", "gate_up_gemm", "activation",
        "down_gemm", "final_norm", "lm_head",
    }  # fmt: skip


def test_timer_counts_an_op_once_and_not_the_ops_inside_it() -> None:
    ticks = iter(range(0, 1000, 5))  # each clock read 5 s after the last
    timer = OpTimer(lambda: float(next(ticks)))
    assert timer("outer", lambda: timer("inner", lambda: 2) + 1) == 3
    timer("outer", lambda: None)
    assert timer.take() == {"outer": 10.0}  # two calls, one start/end pair each
    assert timer.take() == {}


@settings(max_examples=6, deadline=None)
@given(
    batches=st.lists(st.integers(1, 4), min_size=1, max_size=2, unique=True).map(sorted),
    ctxs=st.lists(st.integers(1, 40), min_size=1, max_size=2, unique=True).map(sorted),
    tokens=st.lists(st.integers(1, 24), min_size=1, max_size=2, unique=True).map(sorted),
)
def test_every_knot_is_served_at_its_shapes_and_the_tables_divide_as_documented(
    batches: list[int], ctxs: list[int], tokens: list[int]
) -> None:
    """On a clock that advances one tick per read, every timed op takes one tick: an
    attention point is one op per block over the blocks (1), a norm point a norm and a
    residual add per call (2), activation and embedding one op per call (1). The decode
    attention of knot (b, c) is served to b sequences of c + 1, c + 2, ... tokens."""
    grid = replace(
        OpGrid.tiny(), layouts=((2, 1),), head_dim=8, decode_batch=tuple(batches),
        decode_context=tuple(ctxs), prefill_batch=(1, 2), prefill_tokens=tuple(tokens),
        warmup=1, repeats=2,
    )  # fmt: skip
    seen: list[tuple[int, int]] = []
    real = model_mod.paged_decode_attention

    def recording(q: Any, store: Any, tables: Any, lens: Any, **kw: Any) -> Any:
        lens = np.asarray(lens)
        assert len(set(lens.tolist())) == 1
        seen.append((q.shape[0], int(lens[0])))
        return real(q, store, tables, lens, **kw)

    clock = itertools.count()
    org = origin(np, dt.datetime(2026, 12, 2, tzinfo=dt.UTC), "test")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_mod, "paged_decode_attention", recording)
        got = insitu_tables(np, grid, org, clock=lambda: float(next(clock)))
    cfg = probe_config(2, 1, 8)
    steps = grid.warmup + grid.repeats
    want = [
        (b, c + 1 + i)
        for b in batches
        for c in ctxs
        for i in range(steps)
        for _ in range(PROBE_BLOCKS)
    ]
    assert seen == want  # once per block of each iteration
    assert [(t.phase, t.heads, t.kv_heads) for t in got.attention] == [
        ("decode", 2, 1), ("prefill", 2, 1)
    ]  # fmt: skip
    dec, pre = got.attention
    assert dec.curves.batch == batches and dec.curves.x == [ctxs] * len(batches)
    assert pre.curves.batch == [1, 2] and pre.curves.x == [tokens] * 2
    for t in got.attention:
        assert all(v == 1.0 for row in t.curves.latency_s for v in row)
    rows = {*batches, *(b * n for b in (1, 2) for n in tokens)}
    ew = {t.op: t for t in got.elementwise}
    assert ew["norm"].elements == sorted(r * cfg.hidden for r in rows)
    assert ew["activation"].elements == sorted(r * cfg.ffn for r in rows)
    assert ew["embedding"].elements == ew["norm"].elements
    assert set(ew["norm"].latency_s) == {2.0}
    assert set(ew["activation"].latency_s) == set(ew["embedding"].latency_s) == {1.0}


def reference_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Textbook causal attention of one prompt, head by head (GQA: heads share KV heads)."""
    n, heads, dim = q.shape
    g = heads // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for h in range(heads):
        for i in range(n):
            s = np.array([q[i, h] @ k[j, h // g] for j in range(i + 1)]) / math.sqrt(dim)
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ v[: i + 1, h // g]
    return out


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=3), st.sampled_from([(4, 4), (4, 2)]))
def test_engine_prefill_attention_is_causal_attention_and_writes_kv(
    lengths: list[int], layout: tuple[int, int]
) -> None:
    heads, kvh = layout
    dim = 8
    cfg = DecoderConfig("p", 1, heads * dim, heads, kvh, ffn=8, vocab=16)
    m = DecoderModel(cfg, 16 * sum(-(-n // 16) for n in lengths))
    rng = np.random.default_rng(sum(lengths))
    total = sum(lengths)
    q = rng.standard_normal((total, heads, dim), dtype=np.float32)
    k = rng.standard_normal((total, kvh, dim), dtype=np.float32)
    v = rng.standard_normal((total, kvh, dim), dtype=np.float32)
    for sid, n in enumerate(lengths):
        m.kv.allocate(sid, n)
    st_ = IterationState([(sid, np.zeros(n, dtype=np.int64)) for sid, n in enumerate(lengths)], [])
    got = m._attend_prefill(st_, 0, q, k, v).reshape(total, heads, dim)
    kd, _ = m.store.raw(0)
    lo = 0
    for sid, n in enumerate(lengths):
        want = reference_causal(q[lo : lo + n], k[lo : lo + n], v[lo : lo + n])
        np.testing.assert_allclose(got[lo : lo + n], want, rtol=2e-4, atol=2e-5)
        np.testing.assert_array_equal(kd[m.kv.block_table(sid)[0], 0], k[lo])  # K at its slot
        lo += n


def test_the_allocator_regime_is_set_once_on_glibc() -> None:
    first = keep_freed_memory()
    assert keep_freed_memory() is first
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert first is True
