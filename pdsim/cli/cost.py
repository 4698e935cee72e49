"""``pdsim cost``: the step time of one iteration, op by op, from the op-level cost model.

``pdsim cost --model M --profile P --tp N --phase prefill|decode --batch B --context C``
prices one iteration of a replica of ``N`` GPUs with the simulator's own iteration cost
(:func:`sim.serving.itercost.iteration_cost`: the profile's op tables, else the roofline):
``decode`` is one token for each of ``B`` sequences holding ``C`` tokens of context each;
``prefill`` is ``B`` prompts of ``C`` tokens each in one pass. ``--ep N`` shards a
mixture-of-experts model's experts over ``N`` GPUs (with ``N > tp``: ``N / tp``
attention-data-parallel replicas, each running a batch like this one), ``--routing-skew``
sets how unevenly tokens pick experts. It prints a table (op,
seconds, share, source: measured table or roofline) or, with ``--json``, one JSON object on
the last line: ``{"seconds": ..., "ops": {op: seconds}, "sources": {op: source}, ...,
"framework_origin": ...}``. The serving framework's overheads (per iteration, per request
admitted, per token sampled) are ops like the kernels, with their provenance printed under
the table (``framework_origin``), or a line saying the profile states none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from engine.errors import InputError
from engine.limits import MAX_TOKENS
from pdsim.cli.common import MAX_BATCH, console, float_option, int_option, user_errors

PHASES = ("prefill", "decode")


def _check_fits(
    spec: Any, prof: Any, tp: int, phase: str, batch: int, context: int, ep: int = 1
) -> None:
    """:class:`InputError` when the step is not one a replica can run: ``context`` beyond the
    model's window; a replica at ``tp`` (experts over ``max(tp, ep)`` GPUs) whose memory plan
    (:func:`sim.serving.gpumemory.plan_replica`, the one ``pdsim run`` uses, at the scenario
    defaults and a token budget of this step's tokens and sequences) does not fit, with ``run``'s message; or the KV of
    ``batch`` sequences of ``context`` tokens above that plan's KV capacity."""
    from sim.sections import GpuCfg
    from sim.serving.gpumemory import ReplicaShape, plan_replica

    if spec.max_context and context > spec.max_context:
        raise InputError(
            f"--context {context}: above {spec.name}'s context window of "
            f"{spec.max_context:,} tokens; allowed: 1..{spec.max_context}"
        )
    gpu = GpuCfg()
    tokens = batch * (context if phase == "prefill" else 1)
    shape = ReplicaShape(
        tp=tp,
        pp=1,
        memory_utilization=gpu.memory_utilization,
        workspace=None,
        tokens=tokens,
        seqs=batch,
        coupled=True,
        weight_cache_fraction=gpu.weight_cache_fraction,
        chunk_size=0,
        ep=ep,
    )
    where = {"tokens": f"--batch {batch}", "tp": f"--tp {tp}"}
    mem = plan_replica(shape, [spec], int(prof.gpu.hbm_bytes), prof.name, where=where)
    kv = batch * context * spec.kv_bytes_per_token
    if kv > mem.kv:
        most = mem.kv // max(context * spec.kv_bytes_per_token, 1)
        raise InputError(
            f"--batch {batch}: the KV of {batch:,} x {context:,} tokens ({kv / 1e9:,.1f} GB) "
            f"does not fit the {mem.kv / 1e9:,.1f} GB a tp={tp} replica of {spec.name} keeps "
            f"for KV on {prof.name} GPUs (weights {mem.weights_gpu / 1e9:.1f} GB and "
            f"workspace {mem.workspace_gpu / 1e9:.1f} GB per GPU first); about {most:,} "
            f"sequences of {context:,} tokens fit"
        )


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
    ep: Annotated[
        int,
        typer.Option(
            "--ep",
            parser=int_option(1, 512),
            metavar="N",
            help="Expert-parallel GPUs of a mixture-of-experts model: a divisor of --tp "
            "(experts split inside the replica) or a multiple (attention data parallelism: "
            "N / tp replicas share the experts, all-to-all dispatch and combine).",
        ),
    ] = 1,
    routing_skew: Annotated[
        float,
        typer.Option(
            "--routing-skew",
            parser=float_option(0.0, 4.0),
            metavar="A",
            help="Power-law exponent of expert popularity (0: balanced routing); picks the "
            "expert table measured nearest and sets the busiest rank's load. Default: 1.2.",
        ),
    ] = 1.2,
    models: Annotated[
        Path | None,
        typer.Option("--models", help="Extra model catalogue YAML, or a config.json."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object as the last line.")
    ] = False,
) -> None:
    """Print the time of one prefill or decode iteration as a table of ops."""
    from sim.serving.costmodel import load_profile
    from sim.serving.itercost import iteration_cost
    from sim.serving.models import load_catalogue

    with user_errors():
        if phase not in PHASES:
            raise InputError(f"--phase {phase!r} not allowed; allowed: {', '.join(PHASES)}")
        catalogue = load_catalogue(models)
        if model not in catalogue:
            raise InputError(
                f"--model {model!r} not in the catalogue; allowed: {', '.join(catalogue)}"
            )
        spec = catalogue[model]
        if spec.kind != "decoder":
            decoders = ", ".join(n for n, m in catalogue.items() if m.kind == "decoder")
            raise InputError(
                f"--model {model!r} is a {spec.kind}; pdsim cost prices decoders "
                f"(allowed: {decoders})"
            )
        prof = load_profile(profile)
        _check_fits(catalogue[model], prof, tp, phase, batch, context, ep)
        cm = iteration_cost(
            prof, spec, tp=tp, gpus_per_server=max(tp, ep, 8), ep=ep, routing_skew=routing_skew
        )
        if phase == "decode":
            args = (0, 0, 0, batch, float(batch * context))
        else:
            args = (batch * context, batch * context * context, batch, 0, 0.0)
        ops = cm.breakdown(*args)
    total = sum(secs for _, secs, _ in ops)
    fw = prof.ops.framework if prof.ops is not None else None
    origin = fw.origin if fw is not None else None
    if as_json:
        print(
            json.dumps(
                {
                    "seconds": total,
                    "ops": {name: secs for name, secs, _ in ops},
                    "sources": {name: src for name, _, src in ops},
                    "model": model,
                    "profile": prof.name,
                    "tp": tp,
                    "ep": ep,
                    "phase": phase,
                    "batch": batch,
                    "context": context,
                    "framework_origin": origin,
                }
            )
        )
        return
    split = f", ep={ep}" if ep > 1 else ""
    title = f"{model} on {prof.name}, tp={tp}{split}: {phase}, batch {batch} x {context}"
    table = Table(title=title)
    for col in ("op", "ms", "share", "source"):
        table.add_column(col, justify="left" if col in ("op", "source") else "right")
    for name, secs, src in ops:
        share = secs / total if total else 0.0
        table.add_row(name, f"{secs * 1e3:.4f}", f"{share:6.1%}", src)
    table.add_row("total", f"{total * 1e3:.4f}", "100.0%", "")
    console.print(table)
    if origin is not None:
        console.print(
            f"framework overheads (iteration_overhead, admission, token_output): {origin}"
        )
    else:
        console.print(
            f"{prof.name} states no framework overheads (ops.framework): admission and "
            "token_output are 0 and marked 'none in profile'"
        )
