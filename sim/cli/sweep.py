"""``pdsim sweep``: many runs over a grid of overrides x seeds, cached, on Dask if asked."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine.errors import InputError
from sim.cli.common import console, err_console, user_errors


@contextlib.contextmanager
def run_progress(label: str, quiet: bool = False) -> Iterator[Any]:
    """A rich progress bar over runs; yields a ``progress(done, total)`` callback."""
    if quiet:
        yield None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def prog(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield prog


def failures_table(failed: list[dict[str, Any]]) -> Table:
    """Failed runs with the config that failed and the error."""
    t = Table(title="failed runs", header_style="bold red")
    for c in ("config hash", "seed", "params", "error"):
        t.add_column(c)
    for r in failed:
        params = ", ".join(f"{k}={v!r}" for k, v in r.get("params", {}).items())
        t.add_row(str(r["config_hash"]), str(r["seed"]), params or "-", str(r.get("error")))
    return t


def _overview(df: Any, keys: list[str]) -> Table:
    cols = [
        c
        for c in ("throughput.achieved_rps", "latency.e2e.p99", "hit_rate.hbm", "slo_attainment")
        if c in df.columns
    ]
    ok = df[df["status"] == "ok"]
    t = Table(title="mean over seeds", header_style="bold")
    for k in [*keys, "runs", *cols]:
        t.add_column(k, justify="right")
    if ok.empty:
        return t
    groups = ok.groupby(keys, sort=False, dropna=False) if keys else [((), ok)]
    for gk, g in groups:
        gvals = gk if isinstance(gk, tuple) else (gk,)
        means = [f"{g[c].astype(float).mean():.4g}" for c in cols]
        t.add_row(*[str(v) for v in gvals], str(len(g)), *means)
    return t


def sweep(
    sweep_file: Annotated[
        Path | None, typer.Argument(help="Sweep YAML file (scenario, set, grid, seeds).")
    ] = None,
    scenario: Annotated[
        Path | None, typer.Option("--scenario", help="Scenario to sweep when no sweep file.")
    ] = None,
    grid: Annotated[
        list[str] | None,
        typer.Option("--grid", help="KEY=V1,V2,... (repeatable; values are YAML)."),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", min=1, help="Seeds 0..N-1 (overrides the file).")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Base override KEY=VALUE (repeatable).")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="1: in-process; N: Dask LocalCluster.")
    ] = 1,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="Existing Dask scheduler tcp://host:port.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Sweep folder (default runs/sweep-NAME).")
    ] = None,
    max_runs: Annotated[
        int | None,
        typer.Option("--max-runs", min=0, help="Start at most N new runs (rerun to resume)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar or tables.")] = False,
) -> None:
    """Run a sweep; results go to OUT/results.parquet, each run cached under OUT/runs/."""
    from sim.sweep import build_points, execute, parse_grid, seed_list
    from sim.sweep.spec import load_sweep_file, override_text, resolve_scenario_path

    with user_errors():
        extra = [parse_grid(g) for g in grid or []]
        if (sweep_file is None) == (scenario is None):
            raise InputError("give either a sweep file or --scenario (exactly one)")
        if sweep_file is not None:
            spec = load_sweep_file(sweep_file)
            scen = resolve_scenario_path(spec.scenario, sweep_file.parent)
            g = dict(spec.grid)
            over = [override_text(k, v) for k, v in spec.set.items()]
            seed_src: int | list[int] = spec.seeds
            variant, source, name = spec.variant, str(sweep_file), sweep_file.stem
        else:
            assert scenario is not None
            scen, g, over, seed_src = scenario, {}, [], 1
            variant, source, name = None, "--grid", scenario.stem
        g.update(dict(extra))
        over += list(set_ or [])
        seed_ls = seed_list(seeds if seeds is not None else seed_src, source)
        points = build_points(scen, g, seed_ls, over, variant, source=source)
        folder = out if out is not None else Path("runs") / f"sweep-{name}"
        with run_progress(f"sweep {name}", quiet) as prog:
            res = execute(
                points, folder, workers=workers, scheduler=scheduler, max_runs=max_runs,
                progress=prog,
            )  # fmt: skip
    if not quiet:
        console.print(_overview(res.frame, list(g)))
    console.print(
        f"{res.total} runs: {res.ran} run now, {res.cached} from cache, "
        f"{len(res.failed)} failed, {res.missing} not started"
    )
    if res.missing:
        console.print(f"stopped after {res.ran} new runs; run the same command again to resume")
    if res.failed:
        err_console.print(failures_table(res.failed))
    console.print(str(res.parquet))
    if res.failed:
        raise typer.Exit(code=1)
