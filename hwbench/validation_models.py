"""The setup both sides of the validation share: models, capacities, chunking, pin rule.

The engine (:mod:`hwbench.validation_engine`) and the simulator
(:mod:`hwbench.validation_scenario`) serve a :class:`hwbench.workloads.ValidationWorkload`
on the same model with the same capacities; this module is where those are defined:

* the models -- the catalogue's LLaMA-2-7B shape scaled down (:func:`decoder_config`: the
  small decoder, or the large one that spills a 32 MiB last-level cache) and a dense no-KV
  network (:func:`dense_config`); :func:`sim_catalogue` is a one-model simulator catalogue
  with exactly the engine model's bytes and FLOPs per layer (checked when it is built);
* the capacities (:class:`Sizes`): the HBM weight cache is ``hbm_fraction`` of the model,
  the KV budget three times it, host memory twice the model and the SSD four times it;
* the chunking (:data:`CHUNK_BYTES`) and the pin rule (:data:`HOLD_PINS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.runtime.model import DecoderConfig, DenseConfig
from hwbench.workloads import ValidationWorkload
from sim.serving.models import ModelSpec, load_catalogue, parse_catalogue

__all__ = [
    "BASE_MODEL",
    "CHUNK_BYTES",
    "HOLD_PINS",
    "N_BLOCKS",
    "SEED",
    "SHRINK",
    "SHRINK_LARGE",
    "Sizes",
    "catalogue_text",
    "decoder_config",
    "dense_config",
    "model_config",
    "sim_catalogue",
    "sizes",
]

CHUNK_BYTES = 4 * 1024 * 1024  # R30's default: every layer of the tiny models is one chunk
BASE_MODEL = "llama-2-7b"
SHRINK = 16  # hidden, ffn and vocab / SHRINK; heads / (SHRINK // 2); 4 blocks (17 MB)
#: the large decoder's shrink: 67 MB of weights, more than a 32 MiB last-level cache
SHRINK_LARGE = 8
N_BLOCKS = 4
#: the seed of the model's weights
SEED = 7
#: a layer stays pinned until the prefetches planned at its start have landed, in the engine
#: (and in the simulator: scenario field ``prefetch.order: after-pin``)
HOLD_PINS = True


def decoder_config(spec: ModelSpec | None = None, shrink: int = SHRINK) -> DecoderConfig:
    """The catalogue's LLaMA-2-7B shape scaled down by ``shrink`` (hidden/ffn/vocab) with
    ``N_BLOCKS`` blocks; ffn and vocab are read back from the catalogue's layer sizes.
    The name says the shrink when it is not :data:`SHRINK`."""
    spec = spec if spec is not None else load_catalogue()[BASE_MODEL]
    h, heads, kvh, hd = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    attn = 2 * h * heads * hd + 2 * h * kvh * hd
    block = spec.layers[1]
    ffn = round((block.flops_per_token / 2 - attn) / (3 * h))
    vocab = spec.layers[0].param_bytes // (h * spec.dtype_bytes)
    return DecoderConfig(
        name=f"{spec.name}-tiny" if shrink == SHRINK else f"{spec.name}-div{shrink}",
        n_blocks=N_BLOCKS,
        hidden=h // shrink,
        heads=max(1, heads // (shrink // 2)),
        kv_heads=max(1, kvh // (shrink // 2)),
        ffn=ffn // shrink,
        vocab=vocab // shrink,
    )


def model_config(w: ValidationWorkload) -> DecoderConfig | DenseConfig:
    """The engine model of ``w``: the small or the large decoder, or the dense network."""
    if w.model == "dense":
        return dense_config()
    return decoder_config(shrink=SHRINK_LARGE if w.model == "decoder-large" else SHRINK)


def dense_config() -> DenseConfig:
    """The dense no-KV model (CNN-like): five fully connected layers."""
    return DenseConfig("dense-tiny", (512, 1024, 1000, 1000, 1000, 256))


def sim_catalogue(cfg: DecoderConfig | DenseConfig) -> dict[str, ModelSpec]:
    """A one-model catalogue whose layers have exactly the engine model's bytes and FLOPs."""
    return parse_catalogue(catalogue_text(cfg), "<validate>")


def catalogue_text(cfg: DecoderConfig | DenseConfig) -> str:
    """The YAML of :func:`sim_catalogue`. Raises ``AssertionError`` when its bytes per layer
    differ from the engine model's."""
    if isinstance(cfg, DecoderConfig):
        text = (
            f"models:\n  - name: {cfg.name}\n    kind: decoder\n    dtype_bytes: 4\n"
            f"    shape: {{family: llama, n_layers: {cfg.n_blocks}, hidden: {cfg.hidden}, "
            f"heads: {cfg.heads}, kv_heads: {cfg.kv_heads}, ffn: {cfg.ffn}, "
            f"vocab: {cfg.vocab}}}\n"
        )
    else:
        rows = [
            f"      - {{name: fc{i}, param_bytes: {b}, flops_per_sample: {2.0 * a * o}}}"
            for i, (a, o, b) in enumerate(
                zip(cfg.widths, cfg.widths[1:], cfg.layer_bytes(), strict=False)
            )
        ]
        text = f"models:\n  - name: {cfg.name}\n    kind: cnn\n    dtype_bytes: 4\n    layers:\n"
        text += "\n".join(rows) + "\n"
    cat = parse_catalogue(text, "<validate>")
    assert cat[cfg.name].layer_bytes() == cfg.layer_bytes(), "catalogue and engine disagree"
    return text


@dataclass(frozen=True)
class Sizes:
    """Capacities (bytes) both sides use."""

    model: int
    hbm_weights: int
    kv: int
    host: int
    ssd: int


def sizes(w: ValidationWorkload, cfg: DecoderConfig | DenseConfig) -> Sizes:
    """The capacities for serving ``w`` on ``cfg`` (see the module docstring)."""
    total = sum(cfg.layer_bytes())
    hbm_weights = int(total * w.hbm_fraction)
    # KV budget = 3x the weight cache (the simulator's HBM is 4x it, a quarter for weights).
    return Sizes(total, hbm_weights, 3 * hbm_weights, 2 * total, 4 * total)
