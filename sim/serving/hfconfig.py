"""A Hugging Face ``config.json`` read into a model-catalogue entry.

:func:`entry_from_config` maps the fields of a model's ``config.json`` (a mapping) onto the
catalogue schema of :mod:`sim.serving.models` (a decoder ``shape``), for the architectures in
:data:`HF_FAMILIES` (the ``model_type`` field): dense ``llama``, ``qwen2`` (q/k/v biases),
``qwen3`` (q/k RMSNorm, ``head_dim`` apart from ``hidden / heads``); mixture-of-experts
``mixtral``, ``qwen3_moe``, ``gpt_oss`` (attention and expert biases, attention sinks),
``llama4`` (text model, from ``text_config``; shared expert, interleaved dense layers) and
``deepseek_v3`` (MLA, shared expert, first dense layers). The entry's parameter count is the
checkpoint's, counted as docs/models.md states (DeepSeek-V3 without its multi-token-prediction
module, Llama 4 without its vision encoder).

:func:`catalogue_text` writes entries as catalogue YAML, :func:`append_text` adds one to an
existing catalogue file's text. Every problem is an :class:`engine.errors.InputError` naming
the source and the field: an unsupported ``model_type`` lists the supported ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from engine.errors import InputError

#: the ``model_type`` values :func:`entry_from_config` reads
HF_FAMILIES = (
    "llama",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
    "llama4",
)
#: ``--dtype`` values and the bytes of a stored weight each means
DTYPES = {"bf16": 2, "fp8": 1}


class _Fields:
    """Typed reads of one config mapping; errors name ``source`` and the field."""

    def __init__(self, cfg: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.cfg = cfg
        self.source = source
        self.prefix = prefix

    def _err(self, key: str, why: str) -> InputError:
        return InputError(why, source=self.source, where=self.prefix + key)

    def integer(self, key: str, default: int | None = None, low: int = 1) -> int:
        """The integer ``key`` (>= ``low``); ``default`` when absent or null (required if None)."""
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise self._err(key, "missing; the importer needs it")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self._err(key, f"{value!r}: must be an integer >= {low}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        """The boolean ``key``; ``default`` when absent or null."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._err(key, f"{value!r}: must be true or false")
        return value

    def text(self, key: str, default: str = "") -> str:
        """The string ``key``; ``default`` when absent or null."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._err(key, f"{value!r}: must be a string")
        return value

    def unsupported(self, key: str, why: str) -> InputError:
        """An error for a value the importer does not model."""
        return self._err(key, f"{self.cfg.get(key)!r}: {why}")


def _text_config(cfg: Mapping[str, Any], source: str) -> tuple[_Fields, str]:
    """The fields of the text model (Llama 4 nests it under ``text_config``) and its family."""
    top = _Fields(cfg, source)
    family = top.text("model_type")
    if family == "llama4_text":
        family = "llama4"
    if family not in HF_FAMILIES:
        shown = repr(family) if family else "missing"
        raise InputError(
            f"{shown}: unsupported architecture; supported: {', '.join(HF_FAMILIES)}",
            source=source,
            where="model_type",
        )
    inner = cfg.get("text_config")
    if family == "llama4" and inner is not None:
        if not isinstance(inner, Mapping):
            raise InputError("must be a mapping", source=source, where="text_config")
        return _Fields(inner, source, "text_config."), family
    return top, family


def _attention(f: _Fields, family: str) -> dict[str, Any]:
    """The attention fields of the shape (GQA or MLA)."""
    heads = f.integer("num_attention_heads")
    out: dict[str, Any] = {"heads": heads}
    if family == "deepseek_v3":
        out["q_lora_rank"] = f.integer("q_lora_rank", default=0, low=0)
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            out[key] = f.integer(key, low=0 if key == "qk_nope_head_dim" else 1)
        return out
    out["kv_heads"] = f.integer("num_key_value_heads", default=heads)
    head_dim = f.cfg.get("head_dim")
    if head_dim is not None:
        out["head_dim"] = f.integer("head_dim")
    bias = f.flag("attention_bias", default=family == "gpt_oss")
    out["qkv_bias"] = bias or family == "qwen2"
    out["o_bias"] = bias
    out["qk_norm"] = family in ("qwen3", "qwen3_moe")
    if family == "gpt_oss":
        out["attention_sinks"] = True
        out["sliding_window"] = f.integer("sliding_window", default=0, low=0)
    return out


def _mlp(f: _Fields, family: str, n_layers: int) -> dict[str, Any]:
    """The MLP / mixture-of-experts fields of the shape."""
    if family in ("llama", "qwen2", "qwen3"):
        if f.flag("mlp_bias"):
            raise f.unsupported("mlp_bias", "MLP biases are not modelled; allowed: false")
        return {"ffn": f.integer("intermediate_size")}
    if family in ("mixtral", "gpt_oss"):
        out = {
            "n_experts": f.integer("num_local_experts"),
            "top_k": f.integer("num_experts_per_tok"),
            "moe_ffn": f.integer("intermediate_size"),
        }
        if family == "gpt_oss":
            out |= {"router_bias": True, "expert_bias": True}
        return out
    if family == "qwen3_moe":
        if f.cfg.get("mlp_only_layers"):
            raise f.unsupported("mlp_only_layers", "dense layers by index are not modelled")
        step = f.integer("decoder_sparse_step", default=1)
        out = {
            "n_experts": f.integer("num_experts"),
            "top_k": f.integer("num_experts_per_tok"),
            "moe_ffn": f.integer("moe_intermediate_size"),
            "moe_layer_step": step,
        }
        return out | ({"ffn": f.integer("intermediate_size")} if step > 1 else {})
    if family == "llama4":
        step = f.integer("interleave_moe_layer_step", default=1)
        inner = f.integer("intermediate_size")
        out = {
            "n_experts": f.integer("num_local_experts"),
            "top_k": f.integer("num_experts_per_tok"),
            "moe_ffn": inner,
            "n_shared_experts": 1,
            "shared_ffn": inner,
            "moe_layer_step": step,
        }
        return out | ({"ffn": f.integer("intermediate_size_mlp")} if step > 1 else {})
    # deepseek_v3
    if f.integer("moe_layer_freq", default=1) != 1:
        raise f.unsupported("moe_layer_freq", "only 1 (every layer past the dense ones)")
    moe_ffn = f.integer("moe_intermediate_size")
    shared = f.integer("n_shared_experts", default=0, low=0)
    first = f.integer("first_k_dense_replace", default=0, low=0)
    out = {
        "n_experts": f.integer("n_routed_experts"),
        "top_k": f.integer("num_experts_per_tok"),
        "moe_ffn": moe_ffn,
        "n_shared_experts": shared,
        "shared_ffn": shared * moe_ffn,
        "first_dense_layers": min(first, n_layers),
        "router_bias": f.text("topk_method", default="noaux_tc") == "noaux_tc",
    }
    return out | ({"ffn": f.integer("intermediate_size")} if first > 0 else {})


def _dtype(cfg: Mapping[str, Any], dtype: str | None) -> tuple[int, str]:
    """``(dtype_bytes, why)``: ``dtype`` when given, else fp8 for a checkpoint quantised to fp8
    (or mxfp4, rounded up to a whole byte), else bf16."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise InputError(f"--dtype {dtype!r} not allowed; allowed: {', '.join(DTYPES)}")
        return DTYPES[dtype], f"--dtype {dtype}"
    quant = cfg.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method == "fp8":
        return 1, "fp8 checkpoint"
    if method == "mxfp4":
        return 1, "mxfp4 checkpoint, counted as 1 byte a weight"
    return 2, "bf16"


def entry_from_config(
    cfg: Mapping[str, Any], name: str, dtype: str | None = None, source: str = "config.json"
) -> dict[str, Any]:
    """The catalogue entry (a ``models:`` item, plain data) of the model ``cfg`` describes,
    named ``name``, with weights of ``dtype`` (``bf16``/``fp8``; None: from the config's
    ``quantization_config``, else bf16) and, for fp8 weights, a bf16 KV cache.

    Raises :class:`InputError` naming ``source`` and the field for an unsupported
    ``model_type`` (listing :data:`HF_FAMILIES`), a missing or ill-typed field, or a value the
    importer does not model."""
    if not name:
        raise InputError("--name must not be empty")
    f, family = _text_config(cfg, source)
    n_layers = f.integer("num_hidden_layers")
    shape: dict[str, Any] = {"family": family, "n_layers": n_layers}
    shape["hidden"] = f.integer("hidden_size")
    shape |= _attention(f, family)
    shape |= _mlp(f, family, n_layers)
    shape["vocab"] = f.integer("vocab_size")
    shape["tie_embeddings"] = f.flag("tie_word_embeddings")
    defaults = {"moe_layer_step": 1}  # and every false flag or 0
    shape = {
        k: v for k, v in shape.items() if k == "tie_embeddings" or (v and defaults.get(k) != v)
    }
    dtype_bytes, why = _dtype(cfg, dtype)
    entry: dict[str, Any] = {"name": name, "kind": "decoder", "dtype_bytes": dtype_bytes}
    if dtype_bytes == 1:
        entry["kv_dtype_bytes"] = 2
    entry["max_context"] = f.integer("max_position_embeddings", default=0, low=0)
    entry["shape"] = shape
    entry["notes"] = _notes(entry, family, why, source)
    return entry


def _notes(entry: dict[str, Any], family: str, why: str, source: str) -> str:
    """One line: where the entry comes from and its sizes (``InputError`` for a shape the
    catalogue refuses, naming ``source``)."""
    from pydantic import ValidationError

    from sim.serving.models import ModelEntry, build_model

    try:
        spec = build_model(ModelEntry.model_validate(entry))
    except (ValueError, ValidationError) as err:
        raise InputError(f"the config gives an impossible shape: {err}", source=source) from None
    total = spec.param_count / 1e9
    active = spec.active_param_bytes / spec.dtype_bytes / 1e9
    sizes = f"{total:.2f}e9 parameters"
    if spec.n_experts:
        sizes += f", {active:.2f}e9 active"
    return (
        f"imported from a {family} config.json ({why}); {sizes}; "
        f"KV {spec.kv_bytes_per_token:,} B/token"
    )


def default_name(path: str | Path) -> str:
    """The model name for a config file given directly as a catalogue: the folder holding a
    ``config.json`` (a Hub snapshot folder is named after the model), else the file's stem;
    lower case."""
    p = Path(path)
    return (p.parent.name if p.name == "config.json" and p.parent.name else p.stem).lower()


def is_hf_config(raw: Mapping[str, Any]) -> bool:
    """``raw`` is a Hugging Face config (it has ``model_type`` and no ``models`` list)."""
    return "model_type" in raw and "models" not in raw


def catalogue_text(entries: list[dict[str, Any]]) -> str:
    """Catalogue YAML of ``entries`` (a complete file: ``models:`` and the entries, each
    shape on one flow-style mapping)."""
    return str(
        yaml.safe_dump({"models": entries}, sort_keys=False, default_flow_style=None, width=76)
    )


def append_text(existing: str, entry: dict[str, Any]) -> str:
    """``existing`` catalogue text with ``entry`` appended to its ``models:`` list, in the
    indentation of its first item; the caller checks the result parses to the old entries
    plus ``entry`` (a flow-style list cannot be appended to this way)."""
    item = catalogue_text([entry]).split("\n", 1)[1]  # the lines after "models:"
    m = re.search(r"^( *)- ", existing, flags=re.MULTILINE)
    indent = m.group(1) if m else ""
    lines = [indent + line if line else line for line in item.splitlines()]
    sep = "" if existing.endswith("\n") or not existing else "\n"
    return existing + sep + "\n".join(lines) + "\n"
