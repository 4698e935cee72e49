"""pdsim's op-level step times vs aiconfigurator's own estimate of the same step.

Needs the ``[aic]`` extra (``pip install -e '.[aic]'``); without it the script says so and
prints ``{"skipped": ...}`` as its last line. Points: Llama-3.1-8B at TP=1 on the shipped
``h200-sxm-vllm`` profile, decode steps (batch 1, 8, 32, 128 x context 512, 2048, 8192) and
one-prompt prefills (128 .. 8192 tokens); pdsim's :meth:`sim.serving.opcost.OpCostModel.iteration_time`
vs aiconfigurator's ``predict_decode_latency`` / ``predict_prefill_latency`` (vLLM backend,
h200_sxm). Also prints, not scored, Llama-3.1-70B at TP=8. The model shapes are given here
explicitly (the public Llama-3.1 configurations), not read from the catalogue.

Mixture of experts (issue 37): the catalogue's ``qwen3-30b-a3b`` at TP=1 and ``mixtral-8x7b``
at TP=2 (experts split by TP, ``ep = 1``), decode steps (batch 1, 16, 64, 256 x context 1024,
4096) and one-prompt prefills (512, 2048, 8192), priced by the simulator's own
:func:`sim.serving.itercost.iteration_cost` (op tables, expert tables at aiconfigurator's
default routing skew 1.2) against aiconfigurator's estimate of the same step for the same
Hugging Face config (its shipped copy).

Last line: ``{"median_abs_error": ..., "worst_abs_error": ..., "points": ...,
"tp8_70b_median_abs_error": ..., "tp8_70b_worst_abs_error": ...,
"moe_median_abs_error": ..., "moe_worst_abs_error": ..., "moe_points": ...}`` (errors are
``|pdsim / reference - 1|``; the ``moe_`` figures over both MoE models). Targets: median <=
0.05, worst <= 0.15.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from sim.serving.costmodel import load_profile
from sim.serving.itercost import iteration_cost
from sim.serving.models import LlamaShape, ModelEntry, ModelSpec, build_model, load_catalogue
from sim.serving.opcost import OpCostModel

SHAPES: dict[str, tuple[str, LlamaShape]] = {
    "llama-3.1-8b": (
        "meta-llama/Meta-Llama-3.1-8B",
        LlamaShape(family="llama", n_layers=32, hidden=4096, heads=32, kv_heads=8,
                   ffn=14336, vocab=128256),
    ),
    "llama-3.1-70b": (
        "meta-llama/Meta-Llama-3.1-70B",
        LlamaShape(family="llama", n_layers=80, hidden=8192, heads=64, kv_heads=8,
                   ffn=28672, vocab=128256),
    ),
}  # fmt: skip
BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 2048, 8192)
PROMPTS = (128, 256, 512, 1024, 2048, 4096, 8192)
#: catalogue name -> (aiconfigurator's shipped config file, tp)
MOE: dict[str, tuple[str, int]] = {
    "qwen3-30b-a3b": ("Qwen--Qwen3-30B-A3B_config.json", 1),
    "mixtral-8x7b": ("mistralai--Mixtral-8x7B-v0.1_config.json", 2),
}
MOE_BATCHES = (1, 16, 64, 256)
MOE_CONTEXTS = (1024, 4096)
MOE_PROMPTS = (512, 2048, 8192)
ROUTING_SKEW = 1.2  # aiconfigurator's default power-law exponent of expert popularity


def model(name: str) -> ModelSpec:
    """The ModelSpec of ``name`` built from its explicit shape."""
    return build_model(ModelEntry(name=name, kind="decoder", dtype_bytes=2, shape=SHAPES[name][1]))


def compare(name: str, tp: int, reference: Any) -> list[dict[str, Any]]:
    """Rows ``{phase, batch, tokens, pdsim_ms, reference_ms, ratio}`` for one model and TP."""
    cm = OpCostModel(load_profile("h200-sxm-vllm"), model(name), tp=tp)
    rows = []
    for b in BATCHES:
        for c in CONTEXTS:
            ours = cm.iteration_time(0, 0, 0, b, float(b * c)) * 1e3
            ref = reference.predict_decode_latency(b, c, 2)
            rows.append(
                {"phase": "decode", "batch": b, "tokens": c, "pdsim_ms": ours, "reference_ms": ref}
            )
    for p in PROMPTS:
        ours = cm.iteration_time(p, p * p, 1, 0, 0.0) * 1e3
        ref = reference.predict_prefill_latency(1, p)
        rows.append(
            {"phase": "prefill", "batch": 1, "tokens": p, "pdsim_ms": ours, "reference_ms": ref}
        )
    for r in rows:
        r["ratio"] = r["pdsim_ms"] / r["reference_ms"]
    return rows


def compare_moe(name: str, tp: int, reference: Any) -> list[dict[str, Any]]:
    """Rows as :func:`compare` for a catalogue MoE model, priced by ``iteration_cost``."""
    spec = load_catalogue()[name]
    cost = iteration_cost(
        load_profile("h200-sxm-vllm"), spec, tp=tp, gpus_per_server=8, routing_skew=ROUTING_SKEW
    )

    def ms(*args: Any) -> float:
        c, k, _, _ = cost.work(*args)
        return (c + k) * 1e3

    rows = []
    for b in MOE_BATCHES:
        for c in MOE_CONTEXTS:
            ours = ms(0, 0.0, 0, b, float(b * c))
            ref = reference.predict_decode_latency(b, c, 2)
            rows.append(
                {"phase": "decode", "batch": b, "tokens": c, "pdsim_ms": ours, "reference_ms": ref}
            )
    for p in MOE_PROMPTS:
        ours = ms(p, float(p * p), 1, 0, 0.0)
        ref = reference.predict_prefill_latency(1, p)
        rows.append(
            {"phase": "prefill", "batch": 1, "tokens": p, "pdsim_ms": ours, "reference_ms": ref}
        )
    for r in rows:
        r["ratio"] = r["pdsim_ms"] / r["reference_ms"]
    return rows


def moe_reference(engine: Any, config_file: str, tp: int, workdir: Path) -> Any:
    """aiconfigurator's engine for its shipped copy of a Hugging Face config (a local model
    directory, so nothing is downloaded), experts split by TP."""
    import aiconfigurator_core

    src = Path(aiconfigurator_core.__file__).parent / "model_configs" / config_file
    model_dir = workdir / config_file.removesuffix("_config.json")
    model_dir.mkdir()
    shutil.copy(src, model_dir / "config.json")
    return engine.compile(str(model_dir), "h200_sxm", "vllm", tp_size=tp, moe_tp_size=tp)


def report(title: str, rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Print a table; return (median, worst) of |ratio - 1|."""
    print(title)
    print(f"{'phase':8} {'batch':>5} {'tokens':>6} {'pdsim ms':>10} {'aic ms':>10} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['phase']:8} {r['batch']:5d} {r['tokens']:6d} {r['pdsim_ms']:10.4f} "
            f"{r['reference_ms']:10.4f} {r['ratio']:7.4f}"
        )
    errs = [abs(r["ratio"] - 1) for r in rows]
    med, worst = statistics.median(errs), max(errs)
    print(f"median |ratio-1| {med:.4f}, worst {worst:.4f}, points {len(rows)}\n")
    return med, worst


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    try:
        import logging

        logging.disable(logging.WARNING)  # the package logs every fallback table it loads
        from aiconfigurator_core.sdk.engine import EngineHandle
    except ImportError:
        msg = "aiconfigurator is not installed: pip install -e '.[aic]' to run this benchmark"
        print(msg)
        print(json.dumps({"skipped": msg}))
        return 0
    figures: dict[str, Any] = {}
    for name, tp, key in (("llama-3.1-8b", 1, ""), ("llama-3.1-70b", 8, "tp8_70b_")):
        ref = EngineHandle.compile(SHAPES[name][0], "h200_sxm", "vllm", tp_size=tp)
        rows = compare(name, tp, ref)
        med, worst = report(
            f"{name}, TP={tp}, h200-sxm-vllm vs aiconfigurator (vllm, h200_sxm)", rows
        )
        figures[f"{key}median_abs_error"] = round(med, 5)
        figures[f"{key}worst_abs_error"] = round(worst, 5)
        if not key:
            figures["points"] = len(rows)
    moe_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config_file, tp) in MOE.items():
            ref = moe_reference(EngineHandle, config_file, tp, Path(tmp))
            rows = compare_moe(name, tp, ref)
            report(f"{name}, TP={tp}, h200-sxm-vllm vs aiconfigurator (vllm, h200_sxm)", rows)
            moe_rows += rows
    errs = [abs(r["ratio"] - 1) for r in moe_rows]
    print(f"MoE, both models: median |ratio-1| {statistics.median(errs):.4f}, worst "
          f"{max(errs):.4f}, points {len(errs)}")  # fmt: skip
    figures["moe_median_abs_error"] = round(statistics.median(errs), 5)
    figures["moe_worst_abs_error"] = round(max(errs), 5)
    figures["moe_points"] = len(errs)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
