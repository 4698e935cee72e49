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
from engine.limits import MAX_INT
from pdsim.cli.common import (
    SchedulerOption,
    WorkersOption,
    check_out_dir,
    check_out_kind,
    console,
    err_console,
    inputs_digest,
    int_option,
    note_local_processes,
    out_path,
    result_name,
    user_errors,
)
from pdsim.cli.format import fmt_value
from sim.study.sweep.spec import SEEDS_HELP, parse_seed_option


@contextlib.contextmanager
def run_progress(label: str, quiet: bool = False, batches: bool = False) -> Iterator[Any]:
    """A rich progress bar over runs; yields a ``progress(done, total)`` callback. None
    when ``quiet`` or stderr is not a terminal (a bar there leaves a blank line behind).

    ``batches``: the callback is fed one batch of runs after another (a plan's probes, each
    counting from 0 to its size); the bar then counts the runs finished over all batches so
    far, with no total (the number of probes a search needs is not known in advance)."""
    if quiet or not err_console.is_terminal:
        yield None
        return
    count = TextColumn("{task.completed:.0f} runs") if batches else MofNCompleteColumn()
    bar_col = [] if batches else [BarColumn()]
    with Progress(
        TextColumn("[bold]{task.description}"),
        *bar_col,
        count,
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)
        # runs of the batches before the current one, and the current one's (done, total)
        before, cur = 0, (0, 0)

        def prog(done: int, total: int) -> None:
            nonlocal before, cur
            if batches:
                if done < cur[0] or total != cur[1]:  # a new batch started
                    before += cur[0]
                cur = (done, total)
                bar.update(task, completed=before + done)
            else:
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
        means = [fmt_value(c, float(g[c].astype(float).mean())) for c in cols]
        t.add_row(*[str(v) for v in gvals], str(len(g)), *means)
    return t


def sweep(
    sweep_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[SWEEP_FILE]", help="Sweep YAML file (scenario, set, grid, seeds)."
        ),
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            "--scenario",
            metavar="SCENARIO",
            help="Scenario file or shipped name to sweep when no sweep file.",
        ),
    ] = None,
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid", metavar="KEY=V1,V2", help="Grid axis (repeatable; values are YAML)."
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option("--seeds", metavar="SEEDS", help=SEEDS_HELP + " Overrides the file."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Base override (repeatable)."),
    ] = None,
    workers: WorkersOption = 1,
    scheduler: SchedulerOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            parser=out_path,
            help="Sweep folder (default runs/sweep-NAME-HASH, HASH of the scenario and base "
            "overrides, so a rerun or a grown grid reuses its cached runs).",
        ),
    ] = None,
    max_runs: Annotated[
        int | None,
        typer.Option(
            "--max-runs",
            parser=int_option(0, MAX_INT),
            metavar="N",
            help="Start at most N new runs (rerun to resume).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar or tables.")] = False,
) -> None:
    """Run a sweep; results go to OUT/results-TAG.parquet (and a plot, sweep-TAG.png; TAG
    names the grid and seeds, so another grid in the same folder keeps the first's results),
    each run cached under OUT/runs/ (shared by the folder's sweeps)."""
    from sim.shipped import resolve_scenario
    from sim.study.plots import sweep_plot
    from sim.study.sweep import build_points, execute, parse_grid, seed_list
    from sim.study.sweep.spec import load_sweep_file, override_text, resolve_scenario_path

    with user_errors():
        if out is not None:
            check_out_dir(out)
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
            scen, g, over, seed_src = resolve_scenario(scenario), {}, [], 1
            variant, source, name = None, "--grid", resolve_scenario(scenario).stem
        g.update(dict(extra))
        over += list(set_ or [])
        seed_ls = parse_seed_option(seeds) if seeds is not None else seed_list(seed_src, source)
        points = build_points(scen, g, seed_ls, over, variant, source=source)
        if out is None:
            digest = inputs_digest([Path(scen).read_text("utf-8"), over, variant])
            folder = Path("runs") / result_name("sweep", name, digest)
        else:
            folder = out
        check_out_dir(folder)
        check_out_kind(folder, "sweep")
        note_local_processes(workers, scheduler)
        with run_progress(f"sweep {name}", quiet) as prog:
            res = execute(
                points, folder, workers=workers, scheduler=scheduler, max_runs=max_runs,
                progress=prog,
            )  # fmt: skip
        png = sweep_plot(res.frame, list(g), folder / f"sweep-{res.tag}.png", f"sweep {name}")
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
    console.print(f"results: {res.parquet}" + (f" (plot: {png})" if png else ""))
    if res.failed:
        raise typer.Exit(code=1)
