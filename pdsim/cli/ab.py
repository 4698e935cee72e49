"""``pdsim ab SCENARIO --a K=V --b K=V --seeds N``: paired A/B runs with bootstrap CIs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from engine.errors import InputError
from engine.limits import MAX_SEED
from pdsim.cli.common import (
    MAX_RESAMPLES,
    SchedulerOption,
    WorkersOption,
    blame_override,
    check_out_dir,
    check_out_kind,
    check_same_inputs,
    console,
    err_console,
    int_option,
    out_path,
    result_name,
    user_errors,
)
from pdsim.cli.format import fmt_value
from pdsim.cli.sweep import failures_table, run_progress
from sim.study.sweep.spec import SEEDS_HELP, parse_seed_option

#: below this many paired seeds ``pdsim ab`` warns that its intervals are unreliable
MIN_SEEDS = 10


def ab(
    scenario: Annotated[
        str,
        typer.Argument(
            metavar="SCENARIO", help="Scenario YAML file, or a shipped scenario's name."
        ),
    ],
    a: Annotated[
        list[str] | None,
        typer.Option("--a", metavar="KEY=VALUE", help="Side A override (repeatable)."),
    ] = None,
    b: Annotated[
        list[str] | None,
        typer.Option("--b", metavar="KEY=VALUE", help="Side B override (repeatable)."),
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", metavar="SEEDS", help=SEEDS_HELP)] = "20",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Override for both sides (repeatable)."),
    ] = None,
    variant: Annotated[
        str | None,
        typer.Option(
            "--variant", metavar="NAME", help="Use one of the scenario's variants as base."
        ),
    ] = None,
    workers: WorkersOption = 1,
    scheduler: SchedulerOption = None,
    resamples: Annotated[
        int,
        typer.Option(
            "--resamples",
            parser=int_option(100, MAX_RESAMPLES),
            metavar="N",
            help="Bootstrap resamples (100..100,000).",
        ),
    ] = 2000,
    boot_seed: Annotated[
        int,
        typer.Option(
            "--boot-seed", parser=int_option(0, MAX_SEED), metavar="N", help="Bootstrap RNG seed."
        ),
    ] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            parser=out_path,
            help="Output folder (default runs/ab-NAME-HASH, HASH of the inputs); a folder "
            "holding another A/B's results is refused.",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Run A and B with the same seeds; print B - A per headline metric with a 95% CI."""
    from sim.shipped import resolve_scenario
    from sim.study.ab import ab_digest, ab_points, run_ab

    with user_errors():
        if out is not None:
            check_out_dir(out)
        path = resolve_scenario(scenario)
        seed_ls = parse_seed_option(seeds)
        base = list(set_ or [])
        if resamples < 100:
            raise InputError(f"--resamples {resamples}: use at least 100")
        if boot_seed < 0:
            raise InputError(f"--boot-seed {boot_seed}: allowed: an integer >= 0")
        try:
            points = ab_points(path, list(a or []), list(b or []), seed_ls, base, variant)
        except InputError as err:
            raise _blame_side(err, list(a or []), list(b or []), base) from None
        if len(seed_ls) < MIN_SEEDS:
            err_console.print(
                f"warning: --seeds {seeds}: {len(seed_ls)} paired seeds; intervals from fewer "
                f"than {MIN_SEEDS} are wide and unstable (use --seeds {MIN_SEEDS} or more)",
                soft_wrap=True,
            )
        digest = ab_digest(*points, resamples, boot_seed)
        folder = out if out is not None else Path("runs") / result_name("ab", path.stem, digest)
        check_out_dir(folder)
        check_out_kind(folder, "A/B")
        check_same_inputs(folder, "ab.json", "inputs_hash", digest, "--out")
        with run_progress(f"A/B {path.stem}", quiet) as prog:
            res = run_ab(
                path, list(a or []), list(b or []), seed_ls, folder,
                base=base, variant=variant, workers=workers, scheduler=scheduler,
                resamples=resamples, boot_seed=boot_seed, progress=prog, points=points,
                inputs_hash=digest,
            )  # fmt: skip
    wide = Console(highlight=False, width=max(console.width, 132))
    t = Table(
        title=f"B - A over {len(seed_ls)} paired seeds (95% bootstrap CI, {resamples} resamples)",
        header_style="bold",
    )
    for c in ("metric", "n", "A", "B", "B - A", "95% CI", "B/A - 1", "95% CI (rel)", "verdict"):
        t.add_column(c, justify="left" if c in ("metric", "verdict") else "right")
    for d in res.diffs:
        style = "green" if d.verdict == "B better" else "red" if d.verdict == "B worse" else ""

        def f(v: object, m: str = d.metric) -> str:
            return fmt_value(m, v)

        t.add_row(
            d.metric, str(d.n), f(d.mean_a), f(d.mean_b), f(d.diff),
            f"[{f(d.ci_low)}, {f(d.ci_high)}]", fmt_rel(d.rel),
            "-" if d.rel is None else f"[{fmt_rel(d.rel_low)}, {fmt_rel(d.rel_high)}]",
            f"[{style}]{d.verdict}[/]" if d.verdict and style else (d.verdict or "-"),
        )  # fmt: skip
    console.print(f"A: {' '.join(a or []) or '(scenario as is)'}")
    console.print(f"B: {' '.join(b or []) or '(scenario as is)'}")
    wide.print(t)
    console.print(
        "verdicts only where the interval excludes zero; B/A - 1: relative effect (ratio of "
        "the means over the seeds) with its own bootstrap interval"
    )
    if res.failed:
        err_console.print(failures_table(res.failed))
    console.print(f"results: {res.folder} (ab.json, ab.parquet, runs.parquet, ab.png)")
    if res.failed:
        raise typer.Exit(code=1)


def fmt_rel(v: float | None) -> str:
    """A relative effect (a fraction) as a signed percentage; ``-`` for none."""
    return "-" if v is None else f"{v * 100:+.1f}%"


def _blame_side(err: InputError, a: list[str], b: list[str], base: list[str]) -> InputError:
    """An error an override caused, named by its option (``--a``, ``--b`` or ``--set``): an
    error found while building side B is blamed on ``--b`` (or ``--set``), never ``--a``."""
    from sim.study.ab import SideError

    text = str(err)
    sides = {"A": [("--a", a)], "B": [("--b", b)]}
    pairs = sides.get(err.side, [*sides["A"], *sides["B"]]) if isinstance(err, SideError) else []
    for option, overrides in [*pairs, ("--set", base)]:
        for o in overrides:
            if text.startswith((f"--set {o}:", f"--set {o!r}:")):
                return InputError(option + text[len("--set") :])
        blamed = blame_override(err, overrides, option)
        if blamed is not err:
            return blamed
    return err
