"""``pdsim ab SCENARIO --a K=V --b K=V --seeds N``: paired A/B runs with bootstrap CIs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sim.cli.common import console, err_console, user_errors
from sim.cli.sweep import failures_table, run_progress


def _g(x: float) -> str:
    return f"{x:.4g}"


def ab(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    a: Annotated[
        list[str] | None, typer.Option("--a", help="Side A override KEY=VALUE (repeatable).")
    ] = None,
    b: Annotated[
        list[str] | None, typer.Option("--b", help="Side B override KEY=VALUE (repeatable).")
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=2, help="Paired seeds 0..N-1.")] = 20,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override for both sides (repeatable).")
    ] = None,
    variant: Annotated[
        str | None, typer.Option("--variant", help="Use one of the scenario's variants as base.")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Dask workers (1: local).")] = 1,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="Existing Dask scheduler tcp://host:port.")
    ] = None,
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap resamples.")] = 2000,
    boot_seed: Annotated[int, typer.Option("--boot-seed", help="Bootstrap RNG seed.")] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default runs/ab-NAME).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Run A and B with the same seeds; print B - A per headline metric with a 95% CI."""
    from sim.ab import run_ab

    with user_errors():
        folder = out if out is not None else Path("runs") / f"ab-{scenario.stem}"
        with run_progress(f"A/B {scenario.stem}", quiet) as prog:
            res = run_ab(
                scenario, list(a or []), list(b or []), list(range(seeds)), folder,
                base=list(set_ or []), variant=variant, workers=workers, scheduler=scheduler,
                resamples=resamples, boot_seed=boot_seed, progress=prog,
            )  # fmt: skip
    wide = Console(highlight=False, width=max(console.width, 132))
    t = Table(
        title=f"B - A over {seeds} paired seeds (95% bootstrap CI, {resamples} resamples)",
        header_style="bold",
    )
    for c in ("metric", "n", "A", "B", "B - A", "95% CI", "verdict"):
        t.add_column(c, justify="left" if c in ("metric", "verdict") else "right")
    for d in res.diffs:
        style = "green" if d.verdict == "B better" else "red" if d.verdict == "B worse" else ""
        t.add_row(
            d.metric, str(d.n), _g(d.mean_a), _g(d.mean_b), _g(d.diff),
            f"[{_g(d.ci_low)}, {_g(d.ci_high)}]",
            f"[{style}]{d.verdict}[/]" if d.verdict and style else (d.verdict or "-"),
        )  # fmt: skip
    console.print(f"A: {' '.join(a or []) or '(scenario as is)'}")
    console.print(f"B: {' '.join(b or []) or '(scenario as is)'}")
    wide.print(t)
    console.print("verdicts only where the interval excludes zero")
    if res.failed:
        err_console.print(failures_table(res.failed))
    console.print(str(res.folder))
    if res.failed:
        raise typer.Exit(code=1)
