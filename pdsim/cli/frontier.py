"""``pdsim frontier SCENARIO``: tokens/s/GPU against tokens/s/user over tp x max_num_seqs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from engine.errors import InputError
from engine.limits import MAX_REQUEST_RATE
from pdsim.cli.common import (
    SchedulerOption,
    WorkersOption,
    blame_override,
    check_out_dir,
    check_out_kind,
    check_same_inputs,
    console,
    err_console,
    float_option,
    inputs_digest,
    int_option,
    note_local_processes,
    out_path,
    result_name,
    user_errors,
)
from pdsim.cli.plan import check_emit, write_emitted
from pdsim.cli.sweep import run_progress

if TYPE_CHECKING:
    from sim.study.frontier import FrontierResult
    from sim.study.planspec import SloCfg

#: the percentiles an objective may name (``--percentile``)
_PCTS = ("p50", "p90", "p99", "mean")


def _ints(option: str, text: str, lo: int, hi: int) -> list[int]:
    """``text`` as comma-separated distinct integers in ``[lo, hi]``; InputError naming
    ``option`` otherwise."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or any(not lo <= v <= hi for v in vals) or len(set(vals)) != len(vals):
        raise InputError(
            f"{text!r}: allowed: distinct integers {lo}..{hi}, comma-separated", source=option
        )
    return vals


def _slo(ttft: str | None, tpot: str | None, e2e: str | None, pct: str) -> SloCfg:
    """The objectives (each at percentile ``pct`` over all requests); InputError naming the
    option with a bad duration or when none is given."""
    from engine.configfile import validate_model
    from sim.study.planspec import SloCfg

    if pct not in _PCTS:
        raise InputError(f"{pct!r}; allowed: {', '.join(_PCTS)}", source="--percentile")
    given = {k: v for k, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)) if v is not None}
    if not given:
        raise InputError("give at least one of --ttft, --tpot, --e2e (a duration like 30ms)")
    for k, v in given.items():
        try:
            validate_model(SloCfg, {k: {pct: {"all": v}}}, f"--{k}")
        except InputError as err:
            raise InputError(f"{v!r} is not a duration (e.g. 30ms, 1s)", source=f"--{k}") from err
    return validate_model(SloCfg, {k: {pct: {"all": v}} for k, v in given.items()}, "slo")


def frontier(
    scenario: Annotated[
        str, typer.Argument(metavar="SCENARIO", help="Scenario YAML, or a shipped scenario's name.")
    ],
    tp: Annotated[
        str, typer.Option("--tp", metavar="LIST", help="Tensor-parallel degrees, e.g. 2,4,8.")
    ] = "1,2,4,8",
    ep: Annotated[
        str | None,
        typer.Option(
            "--ep",
            metavar="LIST",
            help="Expert-parallel degrees of a mixture-of-experts model, e.g. 1,8 (each must "
            "divide or be a multiple of every --tp; default: the scenario's).",
        ),
    ] = None,
    max_num_seqs: Annotated[
        str,
        typer.Option(
            "--max-num-seqs", metavar="LIST", help="replica.max_num_seqs values, e.g. 16,64,256."
        ),
    ] = "8,16,32,64,128,256",
    disagg: Annotated[
        str | None,
        typer.Option(
            "--disagg",
            metavar="LIST",
            help="Disaggregated deployments too, PxTP+DxTP each (e.g. 1x4+1x4,2x2+2x2: "
            "prefill replicas x tp + decode replicas x tp), crossed with --max-num-seqs.",
        ),
    ] = None,
    max_num_batched_tokens: Annotated[
        str | None,
        typer.Option(
            "--max-num-batched-tokens",
            metavar="LIST",
            help="replica.max_num_batched_tokens values (default: the scenario's).",
        ),
    ] = None,
    ttft: Annotated[
        str | None, typer.Option("--ttft", metavar="DURATION", help="TTFT objective, e.g. 1s.")
    ] = None,
    tpot: Annotated[
        str | None, typer.Option("--tpot", metavar="DURATION", help="TPOT objective, e.g. 30ms.")
    ] = None,
    e2e: Annotated[
        str | None,
        typer.Option("--e2e", metavar="DURATION", help="End-to-end latency objective, e.g. 5s."),
    ] = None,
    percentile: Annotated[
        str,
        typer.Option(
            "--percentile",
            metavar="PCT",
            help="Percentile of every objective: p50, p90, p99 or mean.",
        ),
    ] = "p50",
    min_user_tps: Annotated[
        float,
        typer.Option(
            "--min-user-tps",
            parser=float_option(0, 1e6),
            metavar="X",
            help="Choose the best tokens/s/GPU among points whose median user gets >= X tokens/s.",
        ),
    ] = 0.0,
    qps_lo: Annotated[
        float,
        typer.Option(
            "--qps-lo",
            parser=float_option(0, MAX_REQUEST_RATE, open_lo=True),
            metavar="QPS",
            help="Lowest load searched, requests/s.",
        ),
    ] = 0.5,
    qps_hi: Annotated[
        float,
        typer.Option(
            "--qps-hi",
            parser=float_option(0, MAX_REQUEST_RATE, open_lo=True),
            metavar="QPS",
            help="Highest load searched, requests/s.",
        ),
    ] = 200.0,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            parser=float_option(0, 0.5, open_lo=True),
            metavar="X",
            help="Stop a load bisection when its bracket is narrower than X x its top.",
        ),
    ] = 0.03,
    seeds: Annotated[
        int,
        typer.Option("--seeds", parser=int_option(1, 100), metavar="N", help="Seeds per probe."),
    ] = 1,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Scenario override (repeatable)."),
    ] = None,
    workers: WorkersOption = 1,
    scheduler: SchedulerOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            parser=out_path,
            help="Output folder (default runs/frontier-NAME-HASH).",
        ),
    ] = None,
    emit: Annotated[
        str | None,
        typer.Option(
            "--emit",
            metavar="ENGINE",
            help="Also write the chosen point's launch command: vllm (vllm-serve.sh).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress or table.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as one JSON object on the last line.")
    ] = False,
) -> None:
    """The Pareto frontier of tokens/s/GPU against tokens/s/user: each tp (x ep) x max_num_seqs at
    the highest load meeting the objectives (bisection per configuration); writes
    frontier.csv and frontier.png (SLO line, chosen point)."""
    from sim.scenario import parse_override
    from sim.study.frontier import run_frontier

    with user_errors():
        check_emit(emit)
        if out is not None:
            check_out_dir(out)
        sc = _load(scenario, set_)
        grid: dict[str, list[int]] = {
            "cluster.tp": _ints("--tp", tp, 1, 512),
            "cluster.replica.max_num_seqs": _ints("--max-num-seqs", max_num_seqs, 1, 10_000_000),
        }
        if ep is not None:
            eps = _ints("--ep", ep, 1, 512)
            for t in grid["cluster.tp"]:
                bad = [e for e in eps if e % t and t % e]
                if bad:
                    raise InputError(
                        f"{bad[0]} neither divides nor is a multiple of tp {t}; allowed: "
                        "expert-parallel degrees that divide or are multiples of every --tp",
                        source="--ep",
                    )
            grid["cluster.ep"] = eps
        if max_num_batched_tokens is not None:
            grid["cluster.replica.max_num_batched_tokens"] = _ints(
                "--max-num-batched-tokens", max_num_batched_tokens, 1, 1_000_000_000
            )
        slo = _slo(ttft, tpot, e2e, percentile)
        shapes = _shapes(disagg)
        if not qps_lo < qps_hi:
            raise InputError(f"{qps_lo:g}: must be below --qps-hi {qps_hi:g}", source="--qps-lo")
        overrides: dict[str, Any] = {}
        for text in set_ or []:
            key, value = parse_override(text)
            overrides[".".join(key)] = value
        path = Path(sc["path"])
        digest = inputs_digest([path.read_text("utf-8"), grid, slo.model_dump(mode="json"),
                                overrides, qps_lo, qps_hi, tolerance, seeds,
                                [str(x) for x in shapes]])  # fmt: skip
        folder = (
            out if out is not None else Path("runs") / result_name("frontier", path.stem, digest)
        )
        check_out_dir(folder)
        check_out_kind(folder, "frontier")
        check_same_inputs(folder, "frontier.json", "inputs", digest, "--out")
        note_local_processes(workers, scheduler)
        talk = not (quiet or as_json)
        with run_progress(f"frontier {path.stem}", not talk, batches=True) as prog:
            try:
                res = run_frontier(
                    path, grid, slo, folder, size=sc["servers"], qps_range=(qps_lo, qps_hi),
                    tolerance=tolerance, seeds=seeds, overrides=overrides,
                    min_user_tps=min_user_tps, disagg=shapes, record={"inputs": digest},
                    workers=workers, scheduler=scheduler,
                    progress=(lambda s: err_console.print(f"probe {s}")) if talk else None,
                    run_progress=prog,
                )  # fmt: skip
            except InputError as err:
                raise blame_override(err, list(set_ or [])) from None
    if not quiet:
        _print(res)
    if emit is not None:
        with user_errors():
            _emit(res, path, grid, overrides, sc["servers"])
    if as_json:
        typer.echo(json.dumps(_json(res)))
    if res.chosen is None:
        raise typer.Exit(1)  # no configuration meets the objectives: the rows say why


def _emit(
    res: FrontierResult,
    path: Path,
    grid: dict[str, list[int]],
    overrides: dict[str, Any],
    servers: int,
) -> None:
    """``--emit vllm``: the chosen point's deployment (InputError when there is none)."""
    from sim.study.sweep.spec import build_points, override_text

    if res.chosen is None:
        raise InputError("no configuration met the objectives: nothing to emit", source="--emit")
    row = res.frame.iloc[res.chosen]
    if row["family"] != "aggregated":
        raise InputError(
            f"the chosen point is disaggregated ({row['deployment']}): not emitted yet",
            source="--emit vllm",
        )
    point = {k: [int(row[k.split(".")[-1]])] for k in grid}
    point["cluster.servers"] = [servers]
    base = [override_text(k, v) for k, v in overrides.items()]
    sc = build_points(path, point, [0], base, None, source="frontier")[0].scenario
    write_emitted(res.folder, sc)


def _shapes(text: str | None) -> list[Any]:
    """``--disagg``'s deployments (:class:`sim.study.frontier.DisaggShape`); InputError
    naming the option for a malformed one."""
    from sim.study.frontier import DisaggShape

    if text is None:
        return []
    try:
        return [DisaggShape.parse(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError as err:
        raise InputError(str(err), source="--disagg") from None


def _load(text: str, set_: list[str] | None) -> dict[str, Any]:
    """The scenario's path and server count (the frontier's fixed size), validated with
    the overrides."""
    from pdsim.cli.common import load_scenario_arg
    from sim.shipped import resolve_scenario

    sc = load_scenario_arg(text, list(set_ or []))
    return {"path": resolve_scenario(text), "servers": sc.cluster.servers}


def _json(res: FrontierResult) -> dict[str, Any]:
    rows = json.loads(res.frame.to_json(orient="records", double_precision=15))
    chosen = rows[res.chosen] if res.chosen is not None else None
    return {"chosen": chosen, "frontier": rows, "folder": str(res.folder)}


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None or v != v else fmt.format(v)


def _print(res: FrontierResult) -> None:
    """The configurations as a table (frontier ones marked, the chosen one starred), then
    one sentence naming the chosen point."""
    t = Table(title="frontier (every column: frontier.csv)", header_style="bold")
    df = res.frame
    cols = ["deployment", "max_num_seqs", *(["max_num_batched_tokens"] if "max_num_batched_tokens"
            in df.columns else []), "capacity req/s", "tok/s/GPU", "tok/s/user",
            "TTFT p50", "TTFT p99", "TPOT p50", "E2E p99", "frontier"]  # fmt: skip
    for c in cols:
        t.add_column(c, justify="right")
    for r in df.to_dict("records"):
        mark = "chosen *" if r["chosen"] else ("yes" if r["on_frontier"] else "")
        t.add_row(
            str(r["deployment"]), str(r["max_num_seqs"]),
            *([str(r["max_num_batched_tokens"])] if "max_num_batched_tokens" in r else []),
            _num(r["capacity_rps"], "{:.4g}"), _num(r["tokens_per_s_per_gpu"], "{:.1f}"),
            _num(r["tokens_per_s_per_user"], "{:.1f}"), _ms(r["ttft_p50_s"]),
            _ms(r["ttft_p99_s"]), _ms(r["tpot_p50_s"]), _ms(r["e2e_p99_s"]),
            mark if r["capacity_rps"] is not None else str(r["reason"])[:60],
        )  # fmt: skip
    Console(highlight=False, width=max(console.width, 150)).print(t)
    if res.chosen is None:
        console.print("no configuration meets the objectives at the lowest load searched")
    else:
        r = df.iloc[res.chosen]
        console.print(
            f"chosen: {r['deployment']}, max_num_seqs={r['max_num_seqs']}: "
            f"{r['tokens_per_s_per_gpu']:.1f} tokens/s/GPU at {r['tokens_per_s_per_user']:.1f} "
            f"tokens/s/user (capacity {r['capacity_rps']:.4g} req/s on {r['gpus']} GPUs)"
        )
    console.print(f"results: {res.folder} (frontier.csv, frontier.png)")


def _ms(v: Any) -> str:
    """Seconds as ``12.7 ms`` or ``4.36 s`` (:func:`pdsim.cli.format.fmt_seconds`); ``-``
    when missing."""
    from pdsim.cli.format import fmt_seconds

    return "-" if v is None or v != v else fmt_seconds(float(v))
