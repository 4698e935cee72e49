"""Model catalogue: layer-by-layer parameter bytes and FLOPs of the models the simulator serves.

The shipped catalogue (``sim/data/models.yaml``) describes LLaMA-2-7B/13B/70B, Llama-3.1-8B/
70B/405B and Qwen3-32B decoders (each Llama-3.1 and Qwen3 model also as an ``-fp8`` entry with
1-byte weights), the mixture-of-experts DeepSeek-V3 (MLA), Qwen3-235B-A22B, Qwen3-30B-A3B,
Mixtral-8x7B and gpt-oss-120b, and ResNet-34/50/101, by their public shapes;
:func:`load_catalogue` expands each shape into a :class:`ModelSpec` with one
:class:`LayerSpec` per execution layer (:func:`block_count` is the one count of a decoder
block's weights). A user file of the same schema, or a Hugging Face ``config.json``
(:mod:`sim.serving.hfconfig`), adds models or replaces shipped ones of the same name.
docs/models.md describes every field, how each architecture becomes layers and what is
approximated.

Two byte widths are kept apart: ``dtype_bytes`` is the width of a stored weight (2: bf16/fp16,
1: fp8) and ``kv_dtype_bytes`` the width of a cached K or V element (null: the weights' width).
An fp8 entry stores every weight, embedding and LM head included, in 1 byte; checkpoints that
keep the embedding and LM head in bf16 are 2 * vocab * hidden bytes larger.

YAML schema (unknown keys are errors)::

    models:
      - name: my-decoder            # unique within a file
        kind: decoder               # decoder | cnn
        dtype_bytes: 2              # weights
        kv_dtype_bytes: 2           # KV cache; null: = dtype_bytes
        max_context: 131072         # context window in tokens; 0: not stated
        shape: {family: llama, n_layers: 32, hidden: 4096, heads: 32, kv_heads: 8,
                head_dim: 128, ffn: 14336, vocab: 128256, tie_embeddings: false}
      - name: my-moe                # mixture of experts (and MLA: kv_lora_rank, ...)
        kind: decoder
        shape: {family: mixtral, n_layers: 32, hidden: 4096, heads: 32, kv_heads: 8,
                n_experts: 8, top_k: 2, moe_ffn: 14336, vocab: 32000}
      - name: my-cnn
        kind: cnn
        dtype_bytes: 4
        shape: {family: resnet, blocks: [3, 4, 6, 3], bottleneck: true}
      - name: hand-written          # or list the layers explicitly
        kind: decoder
        dtype_bytes: 2
        hidden: 1024
        heads: 8
        kv_heads: 8
        head_dim: 128
        kv_bytes_per_token: 65536
        layers:
          - {name: block0, param_bytes: "24MiB", flops_per_token: 2.5e7, attention: true}

Conventions: FLOPs count a multiply-accumulate as 2 FLOPs. A decoder layer's
``flops_per_token`` covers its weight matmuls only, and of an expert layer only the router,
the ``top_k`` routed experts and the shared experts a token runs (its ``param_bytes`` hold
every expert); attention over the context (score and value products, ``4 * head_dim *
heads`` FLOPs per context token per attention layer) depends on the context length and is
added by the cost model. Embedding lookups cost no FLOPs. For
ResNets the widely quoted "4.1 GFLOPs" of ResNet-50 is in multiply-accumulates; here
``flops_per_sample`` is about 8.2e9. Parameter counts include batch-norm scale and shift (not
running statistics), matching torchvision's counts.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from engine.configfile import parse_mapping, read_mapping, validate_model
from engine.errors import InputError
from engine.limits import CheckedModel
from engine.units import parse_size
from sim.serving.decoderblock import (
    LlamaShape,
    block_count,
    check_shape,
    expected_experts,
    head_dim_of,
    kv_elements_per_token,
)

Bytes = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]


class LayerSpec(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """One execution layer: weights read together and computed together."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """Layer name, e.g. `block0`."""
    param_bytes: Bytes
    """Weight bytes of the layer, bytes or a size like `24MiB`."""
    flops_per_token: float = Field(default=0.0, ge=0)
    """Decoders: weight-matmul FLOPs per token (a multiply-accumulate is 2 FLOPs)."""
    flops_per_sample: float = Field(default=0.0, ge=0)
    """CNNs: FLOPs per input sample."""
    attention: bool = False
    """Decoder layer with self-attention over the KV cache."""
    experts: int = Field(default=0, ge=0)
    """Mixture-of-experts layer: its routed experts (0: a dense layer)."""
    expert_bytes: Bytes = 0
    """Mixture-of-experts layer: weight bytes of ONE routed expert (included in `param_bytes`)."""


class ModelSpec(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A servable model: its layers in execution order and its attention dimensions."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """Model name (the catalogue key)."""
    kind: Literal["decoder", "cnn"]
    """`decoder` (autoregressive, KV cache) or `cnn` (one pass per sample)."""
    layers: list[LayerSpec] = Field(min_length=1)
    """Execution layers in order (at least one)."""
    kv_bytes_per_token: Bytes = 0
    """KV-cache bytes per token, all layers together; 0 for CNNs."""
    heads: int = Field(default=0, ge=0)
    """Attention (query) heads."""
    kv_heads: int = Field(default=0, ge=0)
    """Key/value heads (GQA: fewer than `heads`)."""
    head_dim: int = Field(default=0, ge=0)
    """Dimension of one attention head."""
    hidden: int = Field(default=0, ge=0)
    """Hidden (model) dimension."""
    dtype_bytes: int = Field(default=2, ge=1, le=8)
    """Bytes per stored weight (1: FP8, 2: FP16/BF16, 4: FP32), 1..8."""
    kv_dtype_bytes: int = Field(default=2, ge=1, le=8)
    """Bytes per cached K or V element (`kv_bytes_per_token` is computed with it), 1..8."""
    max_context: int = Field(default=0, ge=0)
    """Context window in tokens (prompt plus output); 0: not stated (CNNs, old entries)."""
    shape: LlamaShape | None = None
    """The decoder shape the layers were expanded from; null for explicit layers and CNNs."""
    top_k: int = Field(default=0, ge=0)
    """Mixture of experts: routed experts each token runs per expert layer; 0: dense."""

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0: a dense model)."""
        return sum(1 for layer in self.layers if layer.experts)

    @property
    def n_experts(self) -> int:
        """Routed experts of the largest expert layer (0: a dense model)."""
        return max((layer.experts for layer in self.layers), default=0)

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one routed expert of one expert layer (0: a dense model)."""
        return max((layer.expert_bytes for layer in self.layers), default=0)

    @property
    def mla(self) -> bool:
        """Attention is multi-head latent attention (a compressed KV latent is cached)."""
        return self.shape is not None and self.shape.kv_lora_rank > 0

    @property
    def active_param_bytes(self) -> int:
        """Weight bytes one token uses: every layer's, with only ``top_k`` of each expert
        layer's routed experts (= :attr:`param_bytes` for a dense model)."""
        return sum(
            ly.param_bytes - (ly.experts - min(self.top_k, ly.experts)) * ly.expert_bytes
            for ly in self.layers
        )

    def touched_expert_bytes(self, tokens: int) -> float:
        """Expected routed-expert weight bytes a pass of ``tokens`` tokens reads, all layers:
        per expert layer :func:`expected_experts` of its experts, each ``expert_bytes``."""
        return sum(
            expected_experts(ly.experts, self.top_k, tokens) * ly.expert_bytes
            for ly in self.layers
            if ly.experts
        )

    @property
    def param_bytes(self) -> int:
        """Total parameter bytes."""
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def param_count(self) -> int:
        """Total parameters (bytes / dtype_bytes)."""
        return self.param_bytes // self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """Weight-matmul FLOPs per token (decoders), excluding context-dependent attention."""
        return float(sum(layer.flops_per_token for layer in self.layers))

    @property
    def flops_per_sample(self) -> float:
        """FLOPs per sample (CNNs)."""
        return float(sum(layer.flops_per_sample for layer in self.layers))

    @property
    def n_layers(self) -> int:
        """Number of execution layers."""
        return len(self.layers)

    @property
    def n_attention_layers(self) -> int:
        """Number of layers that attend over the KV cache."""
        return sum(1 for layer in self.layers if layer.attention)

    def layer_bytes(self) -> list[int]:
        """Parameter bytes per layer, in order (input for :func:`engine.chunks.chunk_model`)."""
        return [layer.param_bytes for layer in self.layers]


class ResNetShape(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A torchvision-style ResNet (v1.5: stride on the 3x3 conv of a bottleneck)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    family: Literal["resnet"]
    """Shape family tag: `resnet`."""
    blocks: list[int] = Field(min_length=1)
    """Residual blocks per stage, e.g. `[3, 4, 6, 3]` for ResNet-50."""
    bottleneck: bool
    """Bottleneck blocks (1x1-3x3-1x1, ResNet-50 and up) rather than basic ones."""
    widths: list[int] = Field(default_factory=lambda: [64, 128, 256, 512])
    """Base channel width per stage (one per entry of `blocks`)."""
    num_classes: int = Field(default=1000, ge=1)
    """Classes of the final fully connected layer."""
    image: int = Field(default=224, ge=32)
    """Input image side in pixels, >= 32."""
    max_layers: int = Field(default=20, ge=3)
    """Blocks are grouped so the model has at most this many execution layers, >= 3."""


class ModelEntry(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """One ``models:`` item in a catalogue file: a shape to expand or explicit layers."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = Field(min_length=1)
    """Model name, unique within a file (a user file replaces a shipped model of that name)."""
    kind: Literal["decoder", "cnn"]
    """`decoder` or `cnn` (must match the shape family)."""
    dtype_bytes: int = Field(default=2, ge=1, le=8)
    """Bytes per stored weight (1: fp8, 2: bf16/fp16, 4: fp32), 1..8."""
    kv_dtype_bytes: int | None = Field(default=None, ge=1, le=8)
    """Bytes per cached K or V element (2: bf16, 1: fp8 KV), 1..8; null: = `dtype_bytes`."""
    max_context: int = Field(default=0, ge=0)
    """Context window in tokens (e.g. 131072 for Llama-3.1); 0: not stated."""
    shape: LlamaShape | ResNetShape | None = Field(default=None, discriminator="family")
    """A shape to expand (`family: llama` or `resnet`); give exactly one of shape and layers."""
    layers: list[LayerSpec] | None = None
    """Explicit layers instead of a shape."""
    kv_bytes_per_token: Bytes = 0
    """Explicit layers: KV bytes per token (decoders), all layers, K and V together."""
    heads: int = Field(default=0, ge=0)
    """Explicit layers: attention heads."""
    kv_heads: int = Field(default=0, ge=0)
    """Explicit layers: key/value heads."""
    head_dim: int = Field(default=0, ge=0)
    """Explicit layers: head dimension."""
    hidden: int = Field(default=0, ge=0)
    """Explicit layers: hidden dimension."""
    top_k: int = Field(default=0, ge=0)
    """Explicit layers with `experts`: routed experts each token runs (1..experts)."""
    notes: str = ""
    """Free text: where the shape comes from."""


class CatalogueFile(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A catalogue YAML file."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    models: list[ModelEntry]
    """The models of the file."""


def _kv_dtype(entry: ModelEntry) -> int:
    return entry.kv_dtype_bytes if entry.kv_dtype_bytes is not None else entry.dtype_bytes


def _llama(entry: ModelEntry, s: LlamaShape) -> ModelSpec:
    db = entry.dtype_bytes
    check_shape(s)
    counts = {moe: block_count(s, moe) for moe in (False, True)}
    layers = [LayerSpec(name="embedding", param_bytes=s.vocab * s.hidden * db)]
    for i in range(s.n_layers):
        moe = s.is_moe_block(i)
        c = counts[moe]
        layers.append(
            LayerSpec(
                name=f"block{i}",
                param_bytes=c.params * db,
                flops_per_token=2.0 * c.active_matmul,
                attention=True,
                experts=s.n_experts if moe else 0,
                expert_bytes=c.expert_params * db,
            )
        )
    head_params = s.hidden + (0 if s.tie_embeddings else s.vocab * s.hidden)  # final norm + head
    layers.append(
        LayerSpec(
            name="lm_head", param_bytes=head_params * db, flops_per_token=2.0 * s.vocab * s.hidden
        )
    )
    mla = s.kv_lora_rank > 0
    return ModelSpec(
        name=entry.name,
        kind="decoder",
        layers=layers,
        kv_bytes_per_token=kv_elements_per_token(s) * _kv_dtype(entry),
        heads=s.heads,
        kv_heads=1 if mla else (s.kv_heads or s.heads),  # MLA: one latent for every head
        head_dim=s.qk_nope_head_dim + s.qk_rope_head_dim if mla else head_dim_of(s),
        hidden=s.hidden,
        dtype_bytes=db,
        kv_dtype_bytes=_kv_dtype(entry),
        max_context=entry.max_context,
        shape=s,
        top_k=s.top_k,
    )


def _resnet(entry: ModelEntry, s: ResNetShape) -> ModelSpec:
    db = entry.dtype_bytes
    if len(s.widths) != len(s.blocks):
        raise ValueError(f"widths has {len(s.widths)} entries but blocks has {len(s.blocks)}")
    expansion = 4 if s.bottleneck else 1

    def conv(k: int, cin: int, cout: int, hw: int) -> tuple[int, int]:
        params = k * k * cin * cout
        return params + 2 * cout, params * hw * hw  # (params incl. batch norm, MACs)

    hw = math.ceil(s.image / 2)  # stem conv, stride 2
    p, m = conv(7, 3, s.widths[0], hw)
    layers = [LayerSpec(name="stem", param_bytes=p * db, flops_per_sample=2.0 * m)]
    hw = math.ceil(hw / 2)  # max-pool, stride 2
    per_layer = math.ceil(sum(s.blocks) / (s.max_layers - 2))
    cin = s.widths[0]
    for stage, (n_blocks, width) in enumerate(zip(s.blocks, s.widths, strict=True)):
        group_p, group_m, group_first = 0, 0, 0
        for b in range(n_blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            out_hw = math.ceil(hw / stride)
            cout = width * expansion
            if s.bottleneck:
                parts = [conv(1, cin, width, hw), conv(3, width, width, out_hw)]
                parts.append(conv(1, width, cout, out_hw))
            else:
                parts = [conv(3, cin, width, out_hw), conv(3, width, width, out_hw)]
            if stride != 1 or cin != cout:
                parts.append(conv(1, cin, cout, out_hw))  # downsample shortcut
            group_p += sum(q for q, _ in parts)
            group_m += sum(q for _, q in parts)
            cin, hw = cout, out_hw
            if (b + 1) % per_layer == 0 or b == n_blocks - 1:
                layers.append(
                    LayerSpec(
                        name=f"stage{stage + 1}.blocks{group_first}-{b}",
                        param_bytes=group_p * db,
                        flops_per_sample=2.0 * group_m,
                    )
                )
                group_p, group_m, group_first = 0, 0, b + 1
    fc = cin * s.num_classes
    layers.append(
        LayerSpec(name="fc", param_bytes=(fc + s.num_classes) * db, flops_per_sample=2.0 * fc)
    )
    return ModelSpec(
        name=entry.name,
        kind="cnn",
        layers=layers,
        dtype_bytes=db,
        kv_dtype_bytes=_kv_dtype(entry),
        max_context=entry.max_context,
    )


def build_model(entry: ModelEntry) -> ModelSpec:
    """Expand one catalogue entry into a :class:`ModelSpec` (``ValueError`` if inconsistent)."""
    if (entry.shape is None) == (entry.layers is None):
        raise ValueError("give exactly one of 'shape' or 'layers'")
    if isinstance(entry.shape, LlamaShape):
        if entry.kind != "decoder":
            raise ValueError("a llama shape needs kind: decoder")
        return _llama(entry, entry.shape)
    if isinstance(entry.shape, ResNetShape):
        if entry.kind != "cnn":
            raise ValueError("a resnet shape needs kind: cnn")
        return _resnet(entry, entry.shape)
    assert entry.layers is not None
    experts = [ly.experts for ly in entry.layers if ly.experts]
    if experts and not 1 <= entry.top_k <= min(experts):
        raise ValueError(f"layers with experts need top_k in 1..{min(experts)}, got {entry.top_k}")
    if not experts and entry.top_k:
        raise ValueError("top_k needs layers with experts")
    return ModelSpec(
        name=entry.name,
        kind=entry.kind,
        layers=entry.layers,
        kv_bytes_per_token=entry.kv_bytes_per_token if entry.kind == "decoder" else 0,
        heads=entry.heads,
        kv_heads=entry.kv_heads,
        head_dim=entry.head_dim,
        hidden=entry.hidden,
        dtype_bytes=entry.dtype_bytes,
        kv_dtype_bytes=_kv_dtype(entry),
        max_context=entry.max_context,
        top_k=entry.top_k,
    )


def parse_catalogue(text: str, source: str) -> dict[str, ModelSpec]:
    """Parse catalogue YAML ``text`` (from ``source``, used in messages) into model specs.

    Raises :class:`InputError` naming ``source`` and the field path on any problem.
    """
    raw = parse_mapping(text, source, "model catalogue")
    return _build_all(validate_model(CatalogueFile, raw, source), source)


def _build_all(parsed: CatalogueFile, source: str) -> dict[str, ModelSpec]:
    """Expand every entry (``InputError`` naming ``source`` for a duplicate or bad entry)."""
    out: dict[str, ModelSpec] = {}
    for i, entry in enumerate(parsed.models):
        if entry.name in out:
            raise InputError(
                f"duplicate model name {entry.name!r}", source=source, where=f"models[{i}].name"
            )
        try:
            out[entry.name] = build_model(entry)
        except (ValueError, ValidationError) as err:
            raise InputError(str(err), source=source, where=f"models[{i}]") from None
    return out


def load_catalogue(extra_path: str | Path | None = None) -> dict[str, ModelSpec]:
    """The shipped catalogue, plus the models of ``extra_path`` if given: a catalogue file of
    the same schema, or a Hugging Face ``config.json`` (one model, named by
    :func:`sim.serving.hfconfig.default_name`); a model of the same name replaces the shipped
    one. Raises :class:`InputError` on a bad file."""
    shipped = resources.files("sim").joinpath("data/models.yaml").read_text(encoding="utf-8")
    out = parse_catalogue(shipped, "sim/data/models.yaml")
    if extra_path is not None:
        from sim.serving import hfconfig

        raw = read_mapping(extra_path, "model catalogue")  # .json: JSON, else YAML
        if hfconfig.is_hf_config(raw):
            name = hfconfig.default_name(extra_path)
            raw = {"models": [hfconfig.entry_from_config(raw, name, source=str(extra_path))]}
        out.update(_build_all(validate_model(CatalogueFile, raw, str(extra_path)), str(extra_path)))
    return out


ModelSpec.model_rebuild()  # resolves the forward reference to LlamaShape
