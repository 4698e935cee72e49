"""``pdsim plan PLAN.yaml``: smallest/cheapest cluster for a load, highest load for a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sim.cli.common import console, err_console, user_errors
from sim.cli.sweep import run_progress


def plan(
    plan_file: Annotated[Path, typer.Argument(help="Plan YAML file (scenario, slo, search).")],
    qps: Annotated[
        list[float] | None, typer.Option("--qps", help="Load(s) to size for (replaces qps).")
    ] = None,
    size: Annotated[
        list[int] | None, typer.Option("--size", help="Size(s) to find the max load of.")
    ] = None,
    p99: Annotated[
        list[str] | None, typer.Option("--p99", help="CLASS=DURATION P99 SLO (replaces slo.p99).")
    ] = None,
    seeds: Annotated[int | None, typer.Option("--seeds", min=1, help="Seeds 0..N-1.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Scenario override KEY=VALUE.")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Dask workers (1: local).")] = 1,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="Existing Dask scheduler tcp://host:port.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default runs/plan-NAME).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress or table.")] = False,
) -> None:
    """Answer a capacity question by bisection over runs (several seeds per probe)."""
    from engine.configfile import validate_model
    from engine.errors import InputError
    from sim.plan import PlanFile, plan_from_file, run_plan
    from sim.scenario import parse_override

    with user_errors():
        spec, scen = plan_from_file(plan_file)
        upd: dict[str, object] = {}
        if qps:
            upd["qps"] = list(qps)
        if size:
            upd["sizes"] = list(size)
        if seeds is not None:
            upd["seeds"] = seeds
        if set_:
            extra = {}
            for text in set_:
                path, value = parse_override(text)
                extra[".".join(path)] = value
            upd["set"] = {**spec.set, **extra}
        data = spec.model_dump()
        data.update(upd)
        if p99:
            slo = dict(data["slo"])
            slo["p99"] = {}
            for text in p99:
                if "=" not in text:
                    raise InputError(f"--p99 {text!r}: expected CLASS=DURATION, e.g. high=500ms")
                k, v = text.split("=", 1)
                slo["p99"][k.strip()] = v.strip()
            data["slo"] = slo
        spec = validate_model(PlanFile, data, f"{plan_file} (with the command-line options)")
        folder = out if out is not None else Path("runs") / f"plan-{plan_file.stem}"
        with run_progress(f"plan {plan_file.stem}", quiet) as prog:
            res = run_plan(
                spec, scen, folder, workers=workers, scheduler=scheduler, run_progress=prog,
                source=str(plan_file),
                progress=None if quiet else (lambda s: err_console.print(f"probe {s}")),
            )  # fmt: skip
    df = res.frontier
    if not quiet and not df.empty:
        t = Table(title="frontier", header_style="bold")
        cols = [c for c in df.columns if not c.startswith("boundary_")]
        for c in cols:
            t.add_column(c, justify="right")
        for r in df[cols].itertuples(index=False):
            t.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r])
        Console(highlight=False, width=max(console.width, 160)).print(t)
    for a in res.answers:
        console.print(a)
    console.print(str(res.folder))
