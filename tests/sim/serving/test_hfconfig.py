"""``config.json`` -> catalogue entry (sim.serving.hfconfig, ``pdsim model import``): every
family's parameter count against an independent count straight from the config's fields and
against the published total; the shipped MoE entries; expert activation of a decode batch;
errors that name the field."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.serving.hfconfig import HF_FAMILIES, entry_from_config
from sim.serving.models import (
    ModelEntry,
    ModelSpec,
    build_model,
    expected_experts,
    load_catalogue,
)

HF = Path(__file__).parents[2] / "data" / "hf"
runner = CliRunner()


def config(name: str) -> dict[str, Any]:
    return json.loads((HF / f"{name}.json").read_text())


def imported(cfg: dict[str, Any], dtype: str | None = None) -> ModelSpec:
    return build_model(ModelEntry.model_validate(entry_from_config(cfg, "m", dtype)))


def reference_params(cfg: dict[str, Any]) -> int:
    """The checkpoint's parameter count from the config's own fields, written out per
    architecture as its modelling code allocates the weights (no catalogue code)."""
    c = cfg.get("text_config", cfg)
    t = cfg["model_type"]
    h, n, heads, vocab = (c[k] for k in ("hidden_size", "num_hidden_layers",
                                          "num_attention_heads", "vocab_size"))  # fmt: skip
    if t == "deepseek_v3":
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        attn = h * c["q_lora_rank"] + c["q_lora_rank"] + c["q_lora_rank"] * heads * qk
        attn += h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]
        attn += c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])
        attn += heads * c["v_head_dim"] * h
    else:
        hd = c.get("head_dim") or h // heads
        kv = c["num_key_value_heads"]
        attn = 2 * h * heads * hd + 2 * h * kv * hd
        if t == "qwen2" or c.get("attention_bias"):
            attn += heads * hd + 2 * kv * hd
        if c.get("attention_bias"):
            attn += h
        if t in ("qwen3", "qwen3_moe"):
            attn += 2 * hd
        if t == "gpt_oss":
            attn += heads  # sinks
    layers = []
    for i in range(n):
        norms = 2 * h
        if t in ("llama", "qwen2", "qwen3"):
            mlp = 3 * h * c["intermediate_size"]
        elif t == "mixtral":
            mlp = c["num_local_experts"] * (3 * h * c["intermediate_size"] + h)
        elif t == "qwen3_moe":
            mlp = c["num_experts"] * (3 * h * c["moe_intermediate_size"] + h)
        elif t == "gpt_oss":  # fused gate_up (2f x h + 2f bias), down (h x f + h bias), router
            f = c["intermediate_size"]
            mlp = c["num_local_experts"] * (2 * f * h + 2 * f + f * h + h + h + 1)
        elif t == "llama4":
            f = c["intermediate_size"]
            mlp = c["num_local_experts"] * (3 * h * f + h) + 3 * h * f
        else:  # deepseek_v3
            if i < c["first_k_dense_replace"]:
                mlp = 3 * h * c["intermediate_size"]
            else:
                f = c["moe_intermediate_size"]
                mlp = c["n_routed_experts"] * (3 * h * f + h + 1)  # + router row, bias
                mlp += 3 * h * f * c["n_shared_experts"]
        layers.append(attn + mlp + norms)
    head = 0 if c.get("tie_word_embeddings") else vocab * h
    return sum(layers) + vocab * h + h + head


# file, published total parameters, half-width of the published figure's rounding
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, 0.005e9),
    ("qwen2.5-7b", 7.61e9, 0.01e9),  # "7.61B" (model card), 7.62B on the Hub page
    ("qwen3-32b", 32.76e9, 0.005e9),
    ("mixtral-8x7b", 46.7e9, 0.05e9),
    ("qwen3-30b-a3b", 30.5e9, 0.05e9),
    ("qwen3-235b-a22b", 235.09e9, 0.005e9),
    ("deepseek-v3", 671e9, 0.5e9),  # without the 14e9 multi-token-prediction module
    ("gpt-oss-120b", 116.8e9, 0.05e9),
    ("llama-4-scout", None, 0.0),  # published 109e9 includes the vision encoder
]


@pytest.mark.parametrize(("name", "published", "rounding"), PUBLISHED)
def test_parameter_count_matches_the_config(name: str, published: float | None,
                                            rounding: float) -> None:  # fmt: skip
    cfg = config(name)
    m = imported(cfg)
    ref = reference_params(cfg)
    assert m.param_count == pytest.approx(ref, rel=1e-3)
    if published is not None:
        assert abs(m.param_count - published) <= max(1e-3 * published, rounding)


def test_every_family_has_a_fixture() -> None:
    assert {config(row[0])["model_type"] for row in PUBLISHED} == set(HF_FAMILIES)


def test_shipped_moe_entries_are_the_imported_configs() -> None:
    cat = load_catalogue()
    for name in ("deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"):
        m, ref = cat[name], imported(config(name))
        assert m.layers == ref.layers and m.kv_bytes_per_token == ref.kv_bytes_per_token
        assert m.param_count == reference_params(config(name))
    ds = cat["deepseek-v3"]
    assert (ds.dtype_bytes, ds.kv_dtype_bytes) == (1, 2)  # the config's fp8 quantisation
    assert ds.kv_bytes_per_token == 61 * (512 + 64) * 2  # MLA latent + rotary key, bf16
    assert [ly.experts for ly in ds.layers[1:5]] == [0, 0, 0, 256]  # 3 dense layers first
    mx = cat["mixtral-8x7b"]  # 12.9e9 active of 46.7e9 (Mistral AI)
    assert mx.active_param_bytes / 2 == pytest.approx(12.9e9, abs=0.05e9)


def test_active_flops_count_top_k_experts_only() -> None:
    m = imported(config("mixtral-8x7b"))
    h, f = 4096, 14336
    attn = 2 * h * h + 2 * h * 1024
    assert m.layers[1].flops_per_token == 2.0 * (attn + 8 * h + 2 * 3 * h * f)


# -- expert activation of a batch --------------------------------------------------------------
def enumerated_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Mean distinct experts over every way ``tokens`` tokens each pick ``top_k`` experts."""
    picks = list(itertools.combinations(range(n_experts), top_k))
    total = count = 0
    for choice in itertools.product(picks, repeat=tokens):
        total += len(set(itertools.chain.from_iterable(choice)))
        count += 1
    return total / count


@pytest.mark.parametrize(("e", "k", "t"), [(4, 1, 3), (4, 2, 2), (5, 2, 3), (6, 3, 2), (3, 3, 2)])
def test_expected_experts_is_the_mean_over_all_routings(e: int, k: int, t: int) -> None:
    assert expected_experts(e, k, t) == pytest.approx(enumerated_experts(e, k, t))


@given(e=st.integers(1, 512), k=st.integers(1, 16), t=st.integers(0, 10_000))
def test_expected_experts_bounds(e: int, k: int, t: int) -> None:
    k = min(k, e)
    x = expected_experts(e, k, t)
    assert 0.0 <= x <= min(e, t * k)
    assert x >= min(k, e) * (t > 0)  # one token already runs k experts
    assert expected_experts(e, k, t + 1) >= x


def test_an_8_token_decode_batch_activates_at_most_8_times_top_k_experts() -> None:
    cat = load_catalogue()
    for name in ("deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"):
        m = cat[name]
        per_layer = expected_experts(m.n_experts, m.top_k, 8)
        assert per_layer <= min(8 * m.top_k, m.n_experts)
        touched = m.touched_expert_bytes(8)
        assert touched <= 8 * m.top_k * m.expert_bytes * m.moe_layers
        assert touched == pytest.approx(per_layer * m.expert_bytes * m.moe_layers)
    mx = cat["mixtral-8x7b"]  # 8 tokens x top-2 of 8 experts: nearly all of them
    assert mx.touched_expert_bytes(8) == pytest.approx(8 * (1 - 0.75**8) * mx.expert_bytes * 32)
    assert math.isclose(mx.touched_expert_bytes(0), 0.0)


# -- import errors and options -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"model_type": "bert"}, "model_type: 'bert': unsupported architecture; supported: llama"),
        ({"model_type": None}, "model_type: missing: unsupported architecture"),
        ({"num_hidden_layers": None}, "num_hidden_layers: missing"),
        ({"hidden_size": "4096"}, "hidden_size: '4096': must be an integer >= 1"),
        ({"num_local_experts": True}, "num_local_experts: True: must be an integer"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings: 'no': must be true or false"),
        ({"num_experts_per_tok": 9}, "impossible shape: .*top_k"),
    ],
)
def test_bad_configs_name_the_field(change: dict[str, Any], where: str) -> None:
    cfg = config("mixtral-8x7b") | change
    with pytest.raises(InputError, match=rf"^cfg\.json: .*{where}"):
        entry_from_config(cfg, "m", source="cfg.json")


def test_unmodelled_values_are_refused() -> None:
    with pytest.raises(InputError, match="mlp_only_layers: \\[3\\]"):
        entry_from_config(config("qwen3-30b-a3b") | {"mlp_only_layers": [3]}, "m")
    with pytest.raises(InputError, match=r"text_config\.num_local_experts: missing"):
        cfg = config("llama-4-scout")
        del cfg["text_config"]["num_local_experts"]
        entry_from_config(cfg, "m")
    with pytest.raises(InputError, match="--dtype 'int4' not allowed; allowed: bf16, fp8"):
        entry_from_config(config("qwen3-32b"), "m", dtype="int4")


def test_dtype_default_and_override() -> None:
    ds = entry_from_config(config("deepseek-v3"), "m")
    assert (ds["dtype_bytes"], ds["kv_dtype_bytes"]) == (1, 2)
    assert entry_from_config(config("deepseek-v3"), "m", dtype="bf16")["dtype_bytes"] == 2
    q = entry_from_config(config("qwen3-32b"), "m", dtype="fp8")
    assert (q["dtype_bytes"], q["kv_dtype_bytes"]) == (1, 2)
    # the imported dense config is the shipped qwen3-32b-fp8, layer for layer
    fp8 = load_catalogue()["qwen3-32b-fp8"]
    assert build_model(ModelEntry.model_validate(q)).layers == fp8.layers


def test_llama4_interleaves_dense_layers() -> None:
    cfg = config("llama-4-scout")
    cfg["text_config"] |= {"interleave_moe_layer_step": 2, "num_local_experts": 128}
    m = imported(cfg)
    assert [ly.experts for ly in m.layers[1:5]] == [0, 128, 0, 128]
    assert m.param_count == reference_params(cfg) - 24 * (128 * (3 * 5120 * 8192 + 5120)
                                                          + 3 * 5120 * 8192) + 24 * (
        3 * 5120 * 16384)  # fmt: skip


# -- catalogue and CLI -------------------------------------------------------------------------
def test_a_config_json_is_a_catalogue(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text((HF / "qwen3-30b-a3b.json").read_text())
    cat = load_catalogue(folder / "config.json")
    assert cat["qwen3-30b-a3b"].layers == load_catalogue()["qwen3-30b-a3b"].layers
    (tmp_path / "bad.json").write_text('{"model_type": "t5"}')
    with pytest.raises(InputError, match=r"bad\.json: model_type: 't5': unsupported"):
        load_catalogue(tmp_path / "bad.json")


def test_cli_prints_a_catalogue_and_appends(tmp_path: Path) -> None:
    res = runner.invoke(app, ["model", "import", str(HF / "mixtral-8x7b.json"), "--name", "mx"])
    assert res.exit_code == 0, res.output
    printed = yaml.safe_load(res.output)
    assert [e["name"] for e in printed["models"]] == ["mx"]
    out = tmp_path / "mine.yaml"
    out.write_text("# my models\nmodels:\n  - name: tiny  # a comment\n    kind: decoder\n"
                   "    shape: {family: llama, n_layers: 1, hidden: 8, heads: 2, ffn: 8, vocab: 9}\n")  # fmt: skip
    res = runner.invoke(app, ["model", "import", str(HF / "qwen3-32b.json"), "--name", "q",
                              "--dtype", "fp8", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.startswith("# my models\n") and "# a comment" in text
    cat = load_catalogue(out)
    assert cat["q"].layers == cat["qwen3-32b-fp8"].layers and "tiny" in cat
    # the same name again, a file that is not a catalogue: refused, nothing written
    res = runner.invoke(app, ["model", "import", str(HF / "qwen3-32b.json"), "--name", "q",
                              "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2 and "already has a model named 'q'" in res.output
    assert out.read_text() == text
    other = tmp_path / "notes.yaml"
    other.write_text("hello: 1\n")
    res = runner.invoke(app, ["model", "import", str(HF / "qwen3-32b.json"), "--name", "q",
                              "--out", str(other)])  # fmt: skip
    assert res.exit_code == 2 and "is not a model catalogue" in res.output
    assert other.read_text() == "hello: 1\n"
    res = runner.invoke(app, ["model", "import", str(tmp_path / "nope.json"), "--name", "q"])
    assert res.exit_code == 2 and "nope.json" in res.output


def test_cost_prices_moe_and_mla_from_tables() -> None:
    res = runner.invoke(app, ["cost", "--model", "mixtral-8x7b", "--tp", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["seconds"] > 0 and out["sources"]["moe_experts"] == "table"
    res = runner.invoke(app, ["cost", "--model", "deepseek-v3", "--tp", "8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["sources"]["attention_decode"] == "table" and out["seconds"] > 0
    res = runner.invoke(app, ["cost", "--model", "mixtral-8x7b", "--tp", "2", "--profile",
                              "h200-sxm", "--json"])  # fmt: skip
    out = json.loads(res.output.strip().splitlines()[-1])
    assert set(out["sources"].values()) <= {"roofline", "not run"}
