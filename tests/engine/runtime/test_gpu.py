"""The engine's decoder on CuPy gives NumPy's logits (GPU only; skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import backend
from engine.runtime.model import DecoderConfig, DecoderModel, unpack
from engine.runtime.weights import ResidentWeights

CFG = DecoderConfig("t", n_blocks=2, hidden=128, heads=4, kv_heads=2, ffn=192, vocab=97)


def _logits(xp: object) -> tuple[np.ndarray, np.ndarray]:
    rw = ResidentWeights(4, CFG.layer_bytes(), xp)  # type: ignore[arg-type]
    rw.load()
    layers = [unpack(CFG.layout(i), rw.layer(i, 0.0), xp) for i in range(CFG.n_layers)]  # type: ignore[arg-type]
    m = DecoderModel(CFG, 256, xp)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    st = m.begin([(0, rng.integers(0, CFG.vocab, 21)), (1, rng.integers(0, CFG.vocab, 5))], [])
    for i, w in enumerate(layers):
        m.run_layer(st, i, w)
    first = backend.to_numpy(st.logits_p)
    st = m.begin([], [(0, 3), (1, 4)])
    for i, w in enumerate(layers):
        m.run_layer(st, i, w)
    return first, backend.to_numpy(st.logits_d)


@pytest.mark.gpu
def test_cupy_decoder_matches_numpy() -> None:
    cp = backend.get_backend("cupy")
    for a, b in zip(_logits(cp), _logits(np), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-4)
