"""The engine's models: layouts match the catalogue, paged decode equals a full recompute."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import InputError
from engine.runtime.model import (
    DecoderConfig,
    DecoderModel,
    DenseConfig,
    DenseModel,
    unpack,
)
from engine.runtime.weights import ResidentWeights

CFG = DecoderConfig("t", n_blocks=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=50)


def _layers(cfg: DecoderConfig, seed: int = 3) -> list[dict[str, np.ndarray]]:
    rw = ResidentWeights(seed, cfg.layer_bytes())
    rw.load()
    return [unpack(cfg.layout(i), rw.layer(i, 0.0)) for i in range(cfg.n_layers)]


def _run(model: DecoderModel, layers: list, prefill: list, decode: list):  # type: ignore[type-arg]
    st = model.begin(prefill, decode)
    for i, w in enumerate(layers):
        model.run_layer(st, i, w)
    return st


def test_layer_bytes_match_the_catalogue_llama_shape() -> None:
    from sim.serving.models import parse_catalogue

    text = (
        "models:\n  - name: t\n    kind: decoder\n    dtype_bytes: 4\n"
        "    shape: {family: llama, n_layers: 2, hidden: 64, heads: 4, kv_heads: 2, "
        "ffn: 96, vocab: 50}\n"
    )
    spec = parse_catalogue(text, "<test>")["t"]
    assert spec.layer_bytes() == CFG.layer_bytes()
    assert spec.kv_bytes_per_token == CFG.kv_bytes_per_token


def test_unpack_gives_views_in_layout_order_and_checks_size() -> None:
    flat = np.arange(sum(CFG.layer_bytes()[1:2]) // 4, dtype=np.float32)
    w = unpack(CFG.layout(1), flat)
    assert w["attn_norm"].shape == (64,) and w["attn_norm"][0] == 0
    assert w["wq"][0, 0] == 64  # right after the 64-value norm
    assert np.shares_memory(w["wd"], flat)
    with pytest.raises(ValueError, match="layout needs"):
        unpack(CFG.layout(1), flat[:-1])


def test_bad_shape_is_an_input_error() -> None:
    with pytest.raises(InputError, match="multiple of heads"):
        DecoderConfig("x", 1, hidden=30, heads=4, kv_heads=4, ffn=8, vocab=8)


def test_decode_with_paged_kv_equals_prefill_of_the_whole_sequence() -> None:
    """Logits of a decoded token == logits of the last position of a fresh prefill of the
    prompt plus the tokens decoded so far (KV cache, block tables and attention agree)."""
    layers = _layers(CFG)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, CFG.vocab, n) for n in (5, 17, 33)]  # crosses 16-token blocks
    m = DecoderModel(CFG, 512)
    st = _run(m, layers, [(i, p) for i, p in enumerate(prompts)], [])
    seqs = [list(p) for p in prompts]
    last = [int(np.argmax(st.logits_p[i])) for i in range(3)]
    for _step in range(4):
        for i in range(3):
            seqs[i].append(last[i])
        st = _run(m, layers, [], [(i, last[i]) for i in range(3)])
        ref_model = DecoderModel(CFG, 512)
        ref = _run(ref_model, layers, [(10 + i, np.array(s)) for i, s in enumerate(seqs)], [])
        np.testing.assert_allclose(st.logits_d, ref.logits_p, rtol=2e-4, atol=2e-5)
        last = [int(np.argmax(st.logits_d[i])) for i in range(3)]


def test_batched_prefill_equals_one_prompt_at_a_time() -> None:
    layers = _layers(CFG)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, CFG.vocab, n) for n in (3, 20)]
    both = _run(DecoderModel(CFG, 256), layers, [(0, prompts[0]), (1, prompts[1])], [])
    for i, p in enumerate(prompts):
        one = _run(DecoderModel(CFG, 256), layers, [(0, p)], [])
        np.testing.assert_allclose(both.logits_p[i], one.logits_p[0], rtol=1e-5, atol=1e-6)


def test_release_returns_kv_blocks() -> None:
    m = DecoderModel(CFG, 64)
    layers = _layers(CFG)
    _run(m, layers, [(0, np.arange(40) % CFG.vocab)], [])
    used = m.kv.num_used_blocks
    assert used == 3
    m.release(0)
    assert m.kv.num_used_blocks == 0


def test_dense_model_matches_numpy_reference() -> None:
    cfg = DenseConfig("d", (8, 16, 4))
    rng = np.random.default_rng(2)
    flats = [rng.standard_normal(b // 4).astype(np.float32) for b in cfg.layer_bytes()]
    ws = [unpack(cfg.layout(i), f) for i, f in enumerate(flats)]
    x = rng.standard_normal((5, 8)).astype(np.float32)
    m = DenseModel(cfg)
    y = m.run_layer(m.run_layer(x, 0, ws[0]), 1, ws[1])
    ref = np.maximum(x @ ws[0]["w"] + ws[0]["b"], 0) @ ws[1]["w"] + ws[1]["b"]
    np.testing.assert_allclose(y, ref, rtol=1e-5)
    assert cfg.layer_bytes() == [4 * (8 * 16 + 16), 4 * (16 * 4 + 4)]
