"""Tests for sim.serving.models: the shipped catalogue's sizes and the validation of user catalogues."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.chunks import chunk_model
from engine.errors import InputError
from sim.serving.models import load_catalogue, parse_catalogue


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


# -- current models, checked against hand arithmetic -------------------------------------------
# A Llama-style block has q and o projections (hidden x heads*head_dim each), k and v
# (hidden x kv_heads*head_dim each), a SwiGLU MLP (3 x hidden x ffn) and two RMSNorm vectors
# (2 x hidden); Qwen3 adds RMSNorms on q and k (2 x head_dim). Outside the blocks: the embedding
# (vocab x hidden), the final norm (hidden) and an untied LM head (vocab x hidden).
#
# Llama-3.1-8B: L=32, h=4096, 32 heads, 8 KV heads, head_dim 128, ffn 14336, vocab 128256
#   attention 2*4096*4096 + 2*4096*1024 = 33,554,432 + 8,388,608 =  41,943,040
#   MLP       3*4096*14336                                       = 176,160,768
#   block     41,943,040 + 176,160,768 + 8,192                   = 218,112,000
#   32 blocks = 6,979,584,000; embedding = LM head = 525,336,576; final norm 4,096
#   total 6,979,584,000 + 2*525,336,576 + 4,096                  = 8,030,261,248
# Llama-3.1-70B: L=80, h=8192, 64 heads, 8 KV heads, ffn 28672
#   attention 2*8192*8192 + 2*8192*1024 = 150,994,944; MLP 3*8192*28672 = 704,643,072
#   block 150,994,944 + 704,643,072 + 16,384 = 855,654,400; 80 blocks = 68,452,352,000
#   embedding = LM head = 128256*8192 = 1,050,673,152
#   total 68,452,352,000 + 2,101,346,304 + 8,192                 = 70,553,706,496
# Llama-3.1-405B: L=126, h=16384, 128 heads, 8 KV heads, ffn 53248
#   attention 2*16384^2 + 2*16384*1024 = 570,425,344; MLP 3*16384*53248 = 2,617,245,696
#   block 570,425,344 + 2,617,245,696 + 32,768 = 3,187,703,808; x126 = 401,650,679,808
#   embedding = LM head = 128256*16384 = 2,101,346,304
#   total 401,650,679,808 + 4,202,692,608 + 16,384               = 405,853,388,800
# Qwen3-32B: L=64, h=5120, 64 heads, 8 KV heads, head_dim 128 (64*128 = 8192 != 5120), ffn 25600
#   attention 2*5120*8192 + 2*5120*1024 = 94,371,840; MLP 3*5120*25600 = 393,216,000
#   block 94,371,840 + 393,216,000 + 10,240 + 256 = 487,598,336; x64 = 31,206,293,504
#   embedding = LM head = 151936*5120 = 777,912,320
#   total 31,206,293,504 + 1,555,824,640 + 5,120                 = 32,762,123,264
# KV per token = 2 (K, V) * L * kv_heads * head_dim * KV bytes:
#   8B 2*32*8*128*2 = 131,072; 70B 2*80*8*128*2 = 327,680; 405B 2*126*8*128*2 = 516,096;
#   Qwen3-32B 2*64*8*128*2 = 262,144
CURRENT = [
    # name, parameters, KV bytes per token (bf16), blocks, context window
    ("llama-3.1-8b", 8_030_261_248, 131_072, 32, 131_072),
    ("llama-3.1-70b", 70_553_706_496, 327_680, 80, 131_072),
    ("llama-3.1-405b", 405_853_388_800, 516_096, 126, 131_072),
    ("qwen3-32b", 32_762_123_264, 262_144, 64, 40_960),
]


@pytest.mark.parametrize(("name", "params", "kv", "blocks", "ctx"), CURRENT)
def test_current_models_match_hand_figures(
    cat, name: str, params: int, kv: int, blocks: int, ctx: int
) -> None:
    m = cat[name]
    assert m.param_count == params
    assert m.param_bytes == 2 * params  # bf16
    assert m.kv_bytes_per_token == kv
    assert (m.dtype_bytes, m.kv_dtype_bytes) == (2, 2)
    assert m.n_attention_layers == blocks and m.n_layers == blocks + 2
    assert m.max_context == ctx
    assert m.head_dim == 128 and m.kv_heads == 8


@pytest.mark.parametrize(("name", "params", "kv", "blocks", "ctx"), CURRENT)
def test_fp8_entries_halve_weights_not_kv(
    cat, name: str, params: int, kv: int, blocks: int, ctx: int
) -> None:
    fp8 = cat[f"{name}-fp8"]
    assert (fp8.dtype_bytes, fp8.kv_dtype_bytes) == (1, 2)
    assert fp8.param_bytes == params  # one byte per weight
    assert fp8.param_count == params
    assert fp8.kv_bytes_per_token == kv  # KV stays bf16
    assert fp8.layer_bytes() == [b // 2 for b in cat[name].layer_bytes()]
    assert fp8.max_context == ctx


def test_qwen3_head_dim_is_not_hidden_over_heads(cat) -> None:
    m = cat["qwen3-32b"]
    assert (m.hidden, m.heads, m.head_dim) == (5120, 64, 128)
    assert m.hidden // m.heads == 80 != m.head_dim
    # q projection 5120 x 8192, o 8192 x 5120, k and v 5120 x 1024, MLP 3 x 5120 x 25600
    assert m.layers[1].flops_per_token == 2.0 * (
        2 * 5120 * 8192 + 2 * 5120 * 1024 + 3 * 5120 * 25600
    )
    # 70B in bf16 needs 141.1 GB of weights: more than one 141 GB H200 minus anything else
    assert cat["llama-3.1-70b"].param_bytes == 141_107_412_992


# LLaMA-2 (fp16, vocab 32000, tied: no), same block arithmetic as above:
# 7B:  attention 4*4096^2 = 67,108,864; MLP 3*4096*11008 = 135,266,304; block 202,383,360
#      32 blocks 6,476,267,520 + 2*32000*4096 (262,144,000) + 4,096       = 6,738,415,616
#      KV 2*32*32*128*2 = 524,288 B/token (no GQA)
# 13B: attention 4*5120^2 = 104,857,600; MLP 3*5120*13824 = 212,336,640; block 317,204,480
#      40 blocks 12,688,179,200 + 2*32000*5120 (327,680,000) + 5,120     = 13,015,864,320
#      KV 2*40*40*128*2 = 819,200 B/token
# 70B: block as Llama-3.1-70B, 855,654,400; 80 blocks 68,452,352,000
#      + 2*32000*8192 (524,288,000) + 8,192                               = 68,976,648,192
#      KV 2*80*8*128*2 = 327,680 B/token
# ResNets (fp32, no KV): torchvision's sum(p.numel()) for resnet34/50/101.
OLDER = [
    # name, parameters, bytes per parameter, KV bytes per token, context window
    ("llama-2-7b", 6_738_415_616, 2, 524_288, 4096),
    ("llama-2-13b", 13_015_864_320, 2, 819_200, 4096),
    ("llama-2-70b", 68_976_648_192, 2, 327_680, 4096),
    ("resnet-34", 21_797_672, 4, 0, 0),
    ("resnet-50", 25_557_032, 4, 0, 0),
    ("resnet-101", 44_549_160, 4, 0, 0),
]


@pytest.mark.parametrize(("name", "params", "db", "kv", "ctx"), OLDER)
def test_older_entries_match_hand_figures(
    cat, name: str, params: int, db: int, kv: int, ctx: int
) -> None:
    m = cat[name]
    assert m.param_count == params
    assert m.param_bytes == params * db == sum(m.layer_bytes())
    assert m.kv_bytes_per_token == kv
    assert m.max_context == ctx


def test_every_shipped_model_is_hand_checked(cat) -> None:
    checked = {row[0] for row in OLDER} | {row[0] for row in CURRENT}
    checked |= {f"{row[0]}-fp8" for row in CURRENT}
    # mixture-of-experts entries: against their config.json in test_hfconfig.py
    checked |= {"deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"}
    assert set(cat) == checked


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


# -- dtypes, head_dim and the context window in user catalogues ------------------------------
def _one_llama(shape: str, extra: str = "") -> str:
    return (
        f"models:\n  - name: m\n    kind: decoder\n{extra}    shape: {{family: llama, {shape}}}\n"
    )


def test_kv_dtype_defaults_to_weight_dtype_and_can_differ() -> None:
    shape = "n_layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 100"
    same = parse_catalogue(_one_llama(shape, "    dtype_bytes: 1\n"), "x.yaml")["m"]
    assert (same.dtype_bytes, same.kv_dtype_bytes) == (1, 1)
    assert same.kv_bytes_per_token == 2 * 2 * 2 * 16 * 1  # K,V x 2 layers x 2 heads x 16 dims
    fp8_kv = parse_catalogue(_one_llama(shape, "    kv_dtype_bytes: 1\n"), "x.yaml")["m"]
    assert (fp8_kv.dtype_bytes, fp8_kv.kv_dtype_bytes) == (2, 1)
    assert fp8_kv.kv_bytes_per_token == 2 * 2 * 2 * 16
    assert fp8_kv.param_bytes == 2 * same.param_bytes
    assert same.max_context == 0


def test_explicit_head_dim_and_context() -> None:
    shape = "n_layers: 1, hidden: 48, heads: 4, kv_heads: 2, head_dim: 32, ffn: 8, vocab: 10"
    m = parse_catalogue(_one_llama(shape, "    max_context: 8192\n"), "x.yaml")["m"]
    assert m.head_dim == 32 and m.max_context == 8192
    # q, o: 48 x 128 each; k, v: 48 x 64 each; MLP 3 x 48 x 8; norms 2 x 48
    block = 2 * 48 * 128 + 2 * 48 * 64 + 3 * 48 * 8 + 2 * 48
    assert m.layers[1].param_bytes == 2 * block
    assert m.kv_bytes_per_token == 2 * 1 * 2 * 32 * 2


@pytest.mark.parametrize(
    ("shape", "extra", "match"),
    [
        ("n_layers: 1, hidden: 50, heads: 4, ffn: 8, vocab: 10", "", "give head_dim"),
        ("n_layers: 1, hidden: 64, heads: 4, kv_heads: 3, ffn: 8, vocab: 10", "", "kv_heads 3"),
        (
            "n_layers: 1, hidden: 64, heads: 4, ffn: 8, vocab: 10",
            "    kv_dtype_bytes: 0\n",
            "kv_dtype_bytes",
        ),
        (
            "n_layers: 1, hidden: 64, heads: 4, ffn: 8, vocab: 10",
            "    max_context: -1\n",
            "max_context",
        ),
    ],
)
def test_bad_shapes_name_the_entry(shape: str, extra: str, match: str) -> None:
    with pytest.raises(InputError, match=r"x\.yaml.*models\[0\]") as info:
        parse_catalogue(_one_llama(shape, extra), "x.yaml")
    assert match in str(info.value)


def _reference_params(
    layers: int, hidden: int, heads: int, kv: int, hd: int, ffn: int, vocab: int, tied: bool
) -> int:
    """Parameter count from the matrix list of a Llama block, written independently."""
    matrices = [
        (hidden, heads * hd),  # q
        (hidden, kv * hd),  # k
        (hidden, kv * hd),  # v
        (heads * hd, hidden),  # o
        (hidden, ffn),  # gate
        (hidden, ffn),  # up
        (ffn, hidden),  # down
    ]
    per_block = sum(a * b for a, b in matrices) + hidden + hidden
    head = 0 if tied else vocab * hidden
    return layers * per_block + vocab * hidden + hidden + head


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 6),
    heads_kv=st.sampled_from([(4, 4), (4, 2), (8, 1), (6, 3)]),
    hd=st.sampled_from([8, 16, 24]),
    hidden=st.integers(8, 96),
    ffn=st.integers(1, 200),
    vocab=st.integers(1, 500),
    tied=st.booleans(),
    db=st.sampled_from([1, 2, 4]),
    kvdb=st.sampled_from([1, 2]),
)
def test_llama_shape_matches_reference(
    layers: int,
    heads_kv: tuple[int, int],
    hd: int,
    hidden: int,
    ffn: int,
    vocab: int,
    tied: bool,
    db: int,
    kvdb: int,
) -> None:
    heads, kv = heads_kv
    shape = (
        f"n_layers: {layers}, hidden: {hidden}, heads: {heads}, kv_heads: {kv}, "
        f"head_dim: {hd}, ffn: {ffn}, vocab: {vocab}, tie_embeddings: {str(tied).lower()}"
    )
    extra = f"    dtype_bytes: {db}\n    kv_dtype_bytes: {kvdb}\n"
    m = parse_catalogue(_one_llama(shape, extra), "x.yaml")["m"]
    params = _reference_params(layers, hidden, heads, kv, hd, ffn, vocab, tied)
    assert m.param_count == params
    assert m.param_bytes == params * db
    assert m.kv_bytes_per_token == 2 * layers * kv * hd * kvdb
