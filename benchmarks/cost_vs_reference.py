"""pdsim's op-level step times vs aiconfigurator's own estimate of the same step.

Needs the ``[aic]`` extra (``pip install -e '.[aic]'``); without it the script says so and
prints ``{"skipped": ...}`` as its last line. Points: Llama-3.1-8B at TP=1 on the shipped
``h200-sxm-vllm`` profile, decode steps (batch 1, 8, 32, 128 x context 512, 2048, 8192) and
one-prompt prefills (128 .. 8192 tokens); pdsim's :meth:`sim.serving.opcost.OpCostModel.iteration_time`
vs aiconfigurator's ``predict_decode_latency`` / ``predict_prefill_latency`` (vLLM backend,
h200_sxm). Also prints, not scored, Llama-3.1-70B at TP=8. The model shapes are given here
explicitly (the public Llama-3.1 configurations), not read from the catalogue.

Last line: ``{"median_abs_error": ..., "worst_abs_error": ..., "points": ...,
"tp8_70b_median_abs_error": ..., "tp8_70b_worst_abs_error": ...}`` (errors are
``|pdsim / reference - 1|``). Targets: median <= 0.05, worst <= 0.15.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from sim.serving.costmodel import load_profile
from sim.serving.models import LlamaShape, ModelEntry, ModelSpec, build_model
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
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
