"""Tests for sim.models: the shipped catalogue's sizes and the validation of user catalogues."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.chunks import chunk_model
from engine.errors import InputError
from sim.models import load_catalogue, parse_catalogue


@pytest.fixture(scope="module")
def cat():
    return load_catalogue()


@pytest.mark.parametrize(
    ("name", "params", "tol"),
    [
        ("llama-2-7b", 6.74e9, 0.02),
        ("llama-2-13b", 13.0e9, 0.02),
        ("llama-2-70b", 69e9, 0.02),
        ("resnet-50", 25.6e6, 0.03),
        ("resnet-34", 21.8e6, 0.03),
        ("resnet-101", 44.5e6, 0.03),
    ],
)
def test_parameter_counts(cat, name: str, params: float, tol: float) -> None:
    assert cat[name].param_count == pytest.approx(params, rel=tol)


def test_decoder_structure(cat) -> None:
    m = cat["llama-2-7b"]
    assert m.kind == "decoder" and m.dtype_bytes == 2
    assert m.n_layers == 34 and m.n_attention_layers == 32
    assert m.layers[0].name == "embedding" and m.layers[-1].name == "lm_head"
    assert m.layers[0].param_bytes == 32000 * 4096 * 2
    assert (m.heads, m.kv_heads, m.head_dim, m.hidden) == (32, 32, 128, 4096)
    assert m.kv_bytes_per_token == 2 * 32 * 4096 * 2  # K and V, 32 layers, fp16
    # ~2 FLOPs per parameter per token, minus the FLOP-free embedding lookup
    assert m.flops_per_token == pytest.approx(2 * (m.param_count - 32000 * 4096), rel=0.001)
    assert m.param_bytes == sum(m.layer_bytes())


def test_gqa_shrinks_kv(cat) -> None:
    big = cat["llama-2-70b"]
    assert big.kv_heads == 8 and big.head_dim == 128
    assert big.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert big.kv_bytes_per_token < cat["llama-2-13b"].kv_bytes_per_token


def test_resnet50_bytes_flops_and_layering(cat) -> None:
    m = cat["resnet-50"]
    assert m.kind == "cnn" and m.kv_bytes_per_token == 0
    assert m.param_bytes == pytest.approx(102e6, rel=0.03)  # fp32
    assert m.flops_per_sample == pytest.approx(2 * 4.1e9, rel=0.03)  # 4.1 G multiply-adds
    assert 10 <= m.n_layers <= 20
    assert 10 <= cat["resnet-101"].n_layers <= 20
    assert all(layer.flops_per_token == 0 for layer in m.layers)


def test_catalogue_chunks_cleanly(cat) -> None:
    m = cat["resnet-50"]
    table = chunk_model(m.name, m.layer_bytes(), 256 * 1024)
    assert table.total_bytes == m.param_bytes
    assert table.n_layers == m.n_layers


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "extra.yaml"
    p.write_text(text)
    return p


def test_user_catalogue_adds_and_replaces(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        """
models:
  - name: tiny
    kind: decoder
    dtype_bytes: 2
    hidden: 64
    heads: 4
    kv_heads: 4
    head_dim: 16
    kv_bytes_per_token: 512
    layers:
      - {name: b0, param_bytes: "1MiB", flops_per_token: 1.0e6, attention: true}
      - {name: b1, param_bytes: 2048, flops_per_token: 2.0e3}
  - name: resnet-50
    kind: cnn
    dtype_bytes: 2
    shape: {family: resnet, blocks: [3, 4, 6, 3], bottleneck: true}
""",
    )
    cat = load_catalogue(p)
    assert cat["tiny"].param_bytes == 1024 * 1024 + 2048
    assert cat["tiny"].n_attention_layers == 1
    assert cat["resnet-50"].dtype_bytes == 2  # replaced
    assert "llama-2-7b" in cat


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("models:\n  - name: x\n    kind: decoder\n    shap: {}\n", "models[0].shap"),
        ("models:\n  - name: x\n    kind: gpu\n    layers: []\n", "models[0].kind"),
        (
            "models:\n  - name: x\n    kind: decoder\n    layers:\n"
            "      - {name: a, param_bytes: -5}\n",
            "models[0].layers[0].param_bytes",
        ),
        (
            "models:\n  - name: x\n    kind: decoder\n    layers:\n"
            "      - {name: a, param_bytes: 12 GBB}\n",
            "models[0].layers[0].param_bytes",
        ),
        (
            "models:\n  - name: x\n    kind: decoder\n"
            "    shape: {family: llama, n_layers: 2, hidden: 64, heads: 4, ffn: 8, vocab: 10,"
            " hiden: 3}\n",
            "models[0].shape.hiden",
        ),
        ("models:\n  - name: x\n    kind: cnn\n", "models[0]"),
        ("models: [\n", "line"),
    ],
)
def test_bad_yaml_names_file_and_field(tmp_path: Path, text: str, where: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_catalogue(p)
    msg = str(info.value)
    assert msg.startswith(str(p))
    assert where in msg


def test_duplicate_names_and_missing_file(tmp_path: Path) -> None:
    text = (
        "models:\n"
        "  - {name: a, kind: cnn, layers: [{name: l, param_bytes: 4}]}\n"
        "  - {name: a, kind: cnn, layers: [{name: l, param_bytes: 4}]}\n"
    )
    with pytest.raises(InputError, match=r"models\[1\]\.name"):
        parse_catalogue(text, "x.yaml")
    with pytest.raises(InputError, match=r"nope\.yaml"):
        load_catalogue(tmp_path / "nope.yaml")
