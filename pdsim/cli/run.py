"""``pdsim run SCENARIO``: simulate a scenario, print a summary, write the run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine.errors import InputError
from engine.limits import MAX_SEED
from pdsim.cli.common import (
    check_out_dir,
    check_out_kind,
    console,
    err_console,
    int_option,
    is_run_folder,
    load_scenario_arg,
    out_path,
    user_errors,
)
from pdsim.cli.format import summary_rows


def _table(title: str, s: dict[str, Any]) -> Table:
    """Every figure of summary ``s`` with its unit (:func:`pdsim.cli.format.summary_rows`)."""
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in summary_rows(s):
        t.add_row(k, v)
    return t


def run(
    scenario: Annotated[
        str,
        typer.Argument(
            metavar="SCENARIO", help="Scenario YAML file, or a shipped scenario's name."
        ),
    ],
    seed: Annotated[
        int,
        typer.Option(
            "--seed", parser=int_option(0, MAX_SEED), metavar="N", help="Root random seed."
        ),
    ] = 0,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override a field, e.g. cluster.servers=8 (YAML value).",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out", metavar="DIR", parser=out_path, help="Folder that receives the run folder."
        ),
    ] = Path("runs"),
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No progress bar or table; print the run folder.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the summary as one JSON object on the last line of stdout."
        ),
    ] = False,
) -> None:
    """Simulate SCENARIO and write its run folder (config, summary, Parquet records, plots)."""
    from pdsim.cli.chaos import run_or_report  # checker violations -> report + replay
    from sim.runner import format_claim

    with user_errors():
        check_out_dir(out)
        if is_run_folder(out):
            raise InputError(
                f"--out {out}: is a run folder; --out takes the folder that holds run folders "
                f"(e.g. {out.parent})"
            )
        check_out_kind(out, "run")  # a sweep, A/B, plan or chaos folder holds no run folders
        sc = load_scenario_arg(scenario, list(set_ or []))
        if quiet or as_json or not err_console.is_terminal:
            result = run_or_report(sc, seed, out)
        else:
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            ) as bar:
                task = bar.add_task(sc.name, total=1.0)

                def prog(frac: float, label: str) -> None:
                    bar.update(task, completed=frac, description=label)

                result = run_or_report(sc, seed, out, progress=prog)
    s = result.summary
    if not quiet:
        wide = Console(highlight=False, width=max(console.width, 120))
        if "variants" in s:
            for name, vs in s["variants"].items():
                wide.print(_table(f"{sc.name} / {name}", vs))
        else:
            wide.print(_table(sc.name, s))
        for c in result.claims:
            console.print(format_claim(c))
        from pdsim.cli.chaos import fault_lines  # the faults section (issue 5), if any

        for line in fault_lines(s):
            console.print(line)
        console.print(f"trace hash: {result.trace_hash}")
    for w in _warnings(s):
        err_console.print(f"warning: {w}")
    console.print(f"run folder: {result.out_dir}" if not quiet else str(result.out_dir))
    if as_json:
        typer.echo(json.dumps({**s, "run_folder": str(result.out_dir)}, default=str))
    unfinished = _unfinished(s)
    if unfinished:
        reason = _stop_reason(s) or "the run ended"
        err_console.print(f"error: {unfinished} requests unfinished: {reason}")
        raise typer.Exit(3)


def _runs(s: dict[str, Any]) -> list[dict[str, Any]]:
    return list(s["variants"].values()) if "variants" in s else [s]


def _warnings(s: dict[str, Any]) -> list[str]:
    """The summary's warnings, and why requests were rejected when some were."""
    out = [w for r in _runs(s) for w in r.get("warnings", [])]
    for r in _runs(s):
        n = int(r["requests"].get("rejected", 0))
        why = r.get("rejected_reasons") or {}
        parts = [f"{why[k]} {text}" for k, text in REJECT_TEXT.items() if why.get(k)]
        if n:
            out.append(f"{n} requests rejected (they can never run): {'; '.join(parts) or '?'}")
    return out


#: the reasons of ``summary.rejected_reasons`` (:meth:`sim.cluster.Cluster.rejected_reasons`)
REJECT_TEXT = {
    "too_long": "longer (prompt + output) than the model's context window",
    "kv_too_large": "need more KV than a replica holds in all",
}


def _unfinished(s: dict[str, Any]) -> int:
    return sum(int(r["requests"]["unfinished"]) for r in _runs(s))


def _stop_reason(s: dict[str, Any]) -> str | None:
    return next((r["stop_reason"] for r in _runs(s) if r.get("stop_reason")), None)
