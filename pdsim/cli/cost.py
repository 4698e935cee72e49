"""``pdsim cost``: the step time of one iteration, op by op, from the op-level cost model.

``pdsim cost --model M --profile P --tp N --phase prefill|decode --batch B --context C``
prices one iteration of a replica of ``N`` GPUs with :class:`sim.serving.opcost.OpCostModel`:
``decode`` is one token for each of ``B`` sequences holding ``C`` tokens of context each;
``prefill`` is ``B`` prompts of ``C`` tokens each in one pass. It prints a table (op,
seconds, share, source: measured table or roofline) or, with ``--json``, one JSON object on
the last line: ``{"seconds": ..., "ops": {op: seconds}, "sources": {op: source}, ...}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from engine.errors import InputError
from engine.limits import MAX_TOKENS
from pdsim.cli.common import MAX_BATCH, console, int_option, user_errors

PHASES = ("prefill", "decode")


def cost(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name in the catalogue.")],
    profile: Annotated[
        str,
        typer.Option("--profile", "-p", help="Profile name (e.g. h200-sxm-vllm) or JSON file."),
    ] = "h200-sxm-vllm",
    tp: Annotated[
        int,
        typer.Option(
            "--tp",
            parser=int_option(1, 512),
            metavar="N",
            help="Tensor-parallel GPUs of the replica.",
        ),
    ] = 1,
    phase: Annotated[str, typer.Option("--phase", help="prefill or decode.")] = "decode",
    batch: Annotated[
        int,
        typer.Option(
            "--batch",
            "-b",
            parser=int_option(1, MAX_BATCH),
            metavar="N",
            help="Sequences in the step.",
        ),
    ] = 1,
    context: Annotated[
        int,
        typer.Option(
            "--context",
            "-c",
            parser=int_option(1, MAX_TOKENS),
            metavar="N",
            help="Tokens per sequence (prompt or KV context).",
        ),
    ] = 2048,
    models: Annotated[
        Path | None, typer.Option("--models", help="Extra model catalogue YAML.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object as the last line.")
    ] = False,
) -> None:
    """Print the time of one prefill or decode iteration as a table of ops."""
    from sim.serving.costmodel import load_profile
    from sim.serving.models import load_catalogue
    from sim.serving.opcost import OpCostModel

    with user_errors():
        if phase not in PHASES:
            raise InputError(f"--phase {phase!r} not allowed; allowed: {', '.join(PHASES)}")
        catalogue = load_catalogue(models)
        if model not in catalogue:
            raise InputError(
                f"--model {model!r} not in the catalogue; allowed: {', '.join(catalogue)}"
            )
        prof = load_profile(profile)
        cm = OpCostModel(prof, catalogue[model], tp=tp)
        if phase == "decode":
            args = (0, 0, 0, batch, float(batch * context))
        else:
            args = (batch * context, batch * context * context, batch, 0, 0.0)
        ops = cm.iteration_breakdown(*args)
    total = sum(op.seconds for op in ops)
    if as_json:
        print(
            json.dumps(
                {
                    "seconds": total,
                    "ops": {op.name: op.seconds for op in ops},
                    "sources": {op.name: op.source for op in ops},
                    "model": model,
                    "profile": prof.name,
                    "tp": tp,
                    "phase": phase,
                    "batch": batch,
                    "context": context,
                }
            )
        )
        return
    table = Table(title=f"{model} on {prof.name}, tp={tp}: {phase}, batch {batch} x {context}")
    for col in ("op", "ms", "share", "source"):
        table.add_column(col, justify="left" if col in ("op", "source") else "right")
    for op in ops:
        share = op.seconds / total if total else 0.0
        table.add_row(op.name, f"{op.seconds * 1e3:.4f}", f"{share:6.1%}", op.source)
    table.add_row("total", f"{total * 1e3:.4f}", "100.0%", "")
    console.print(table)
