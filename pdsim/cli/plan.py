"""``pdsim plan PLAN.yaml``: smallest/cheapest cluster for a load, highest load for a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from engine.errors import InputError
from engine.limits import MAX_INT, MAX_REQUEST_RATE
from pdsim.cli.common import (
    SchedulerOption,
    WorkersOption,
    blame_override,
    check_out_dir,
    check_out_kind,
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
from pdsim.cli.format import fmt_value
from pdsim.cli.sweep import run_progress
from sim.study.sweep.spec import SEEDS_HELP, parse_seed_option

if TYPE_CHECKING:
    import pandas as pd

    from sim.study.planspec import PlanFile


def plan(
    plan_file: Annotated[
        str,
        typer.Argument(
            metavar="PLAN",
            help="Plan YAML file (scenario, slo, search), or a shipped plan's name.",
        ),
    ],
    qps: Annotated[
        list[float] | None,
        typer.Option(
            "--qps",
            parser=float_option(0, MAX_REQUEST_RATE, open_lo=True),
            metavar="QPS",
            help="Load to size for (repeatable; replaces qps).",
        ),
    ] = None,
    size: Annotated[
        list[int] | None,
        typer.Option(
            "--size",
            parser=int_option(1, MAX_INT),
            metavar="N",
            help="Size to find the max load of (repeatable).",
        ),
    ] = None,
    p99: Annotated[
        list[str] | None,
        typer.Option(
            "--p99",
            metavar="CLASS=DURATION",
            help="P99 end-to-end SLO, e.g. high=500ms (repeatable; replaces the file's P99 "
            "end-to-end limits, slo.p99 and slo.e2e.p99).",
        ),
    ] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", metavar="SEEDS", help=SEEDS_HELP)] = None,
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
            help="Output folder (default runs/plan-NAME-HASH, HASH of the plan with the "
            "options); a folder holding another plan's results is refused.",
        ),
    ] = None,
    emit: Annotated[
        str | None,
        typer.Option(
            "--emit",
            metavar="ENGINE",
            help="Also write the launch command of the chosen deployment: vllm (vllm-serve.sh: "
            "tp, pp, max sequences, token budget, GPU memory share, prefix caching).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress or table.")] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the result as one JSON object on the last line."),
    ] = False,
) -> None:
    """Answer a capacity question by bisection over runs (several seeds per probe).

    Exit status 1 when a compare plan finds no deployment that meets the SLOs (the output
    names the tightest limit that failed and the best figure reached)."""
    from sim.shipped import resolve_scenario
    from sim.study.plan import run_plan
    from sim.study.planreport import plan_json
    from sim.study.planspec import plan_from_file

    with user_errors():
        check_emit(emit)
        if out is not None:
            check_out_dir(out)
        path = resolve_scenario(plan_file, "plan")
        spec, scen = plan_from_file(path)
        spec = _with_options(spec, path, qps, size, seeds, set_, p99)
        report_spec = spec.model_dump(mode="json")
        digest = inputs_digest([report_spec, scen.read_text("utf-8")])
        folder = out if out is not None else Path("runs") / result_name("plan", path.stem, digest)
        check_out_dir(folder)
        check_out_kind(folder, "plan")
        _check_same_plan(folder, report_spec)
        note_local_processes(workers, scheduler)
        with run_progress(f"plan {path.stem}", quiet or as_json, batches=True) as prog:
            try:
                res = run_plan(
                    spec, scen, folder, workers=workers, scheduler=scheduler,
                    run_progress=prog, source=str(path),
                    progress=None if quiet or as_json else (
                        lambda s: err_console.print(f"probe {s}")
                    ),
                )  # fmt: skip
            except InputError as err:
                raise _blame(err, p99, set_) from None
    if not quiet and not res.frontier.empty:
        if res.compare is None:
            _print_frontier(res.frontier, spec)
        else:
            _print_columns(res.frontier)
    for a in [*res.answers, *res.notes]:
        console.print(a)
    console.print(f"results: {res.folder} (plan.json, frontier.csv, frontier.png)")
    if emit is not None:
        with user_errors():
            _emit_plan(res, spec, scen)
    if as_json:
        typer.echo(json.dumps(plan_json(res)))
    if res.compare is not None and res.compare.get("choice") == "none":
        raise typer.Exit(1)  # no deployment meets the SLOs: the answers say why


def _with_options(
    spec: PlanFile,
    path: Path,
    qps: list[float] | None,
    size: list[int] | None,
    seeds: str | None,
    set_: list[str] | None,
    p99: list[str] | None,
) -> PlanFile:
    """The plan of ``path`` with the command-line options applied (each replaces its field;
    ``--set`` adds to the plan's own overrides), validated again; an error in an option is
    blamed on that option."""
    from engine.configfile import validate_model
    from sim.scenario import parse_override
    from sim.study.planspec import PlanFile

    upd: dict[str, object] = {}
    if qps:
        upd["qps"] = list(qps)
    if size:
        upd["sizes"] = list(size)
    if seeds is not None:
        seed_ls = parse_seed_option(seeds)
        if seed_ls != list(range(len(seed_ls))):
            raise InputError(f"--seeds {seeds}: a plan takes N (seeds 0..N-1)")
        upd["seeds"] = len(seed_ls)
    if set_:
        extra = {}
        for text in set_:
            key, value = parse_override(text)
            extra[".".join(key)] = value
        upd["set"] = {**spec.set, **extra}
    data = spec.model_dump()
    data.update(upd)
    if p99:
        slo = dict(data["slo"])
        # the option is the P99 end-to-end limit: the file's, in either spelling, goes
        slo["e2e"] = {pct: per for pct, per in slo["e2e"].items() if pct != "p99"}
        slo["p99"] = {}
        for text in p99:
            if "=" not in text:
                raise InputError(f"--p99 {text!r}: expected CLASS=DURATION, e.g. high=500ms")
            k, v = text.split("=", 1)
            slo["p99"][k.strip()] = v.strip()
        data["slo"] = slo
    try:
        return validate_model(PlanFile, data, f"{path} (with the command-line options)")
    except InputError as err:
        given = {"qps": ("--qps", [f"{q:g}" for q in qps or []])}
        given["sizes"] = ("--size", [str(n) for n in size or []])
        raise _blame(err, p99, set_, given) from None


def _print_frontier(df: pd.DataFrame, spec: PlanFile) -> None:
    """The frontier as a compact table (one row per question x alternative): the answer,
    its GPUs and cost, the busiest resource at the boundary probe (the last one that failed,
    or the answer when none did) and the share of that probe's seeds that passed.
    Every column (each resource's utilisation, the reasons) is in frontier.csv."""
    t = Table(title="frontier (every column: frontier.csv)", header_style="bold")
    alts = [k for k in spec.alternatives if k in df.columns]
    cost = "cost/h" if spec.gpu_hour_cost is not None else "cost"  # per hour, or in `costs` units
    heads = ["question", *alts, "QPS", "size", "GPUs", cost, "busiest", "boundary: seeds passed"]
    for c in heads:
        t.add_column(c, justify="left" if c in ("question", "busiest") else "right")
    for r in df.to_dict("records"):
        sat = r.get("saturates_first")
        busiest = f"{sat} {r[f'util_{sat}']:.0%}" if isinstance(sat, str) else "-"
        t.add_row(
            str(r["question"]),
            *[str(r[k]) for k in alts],
            _num(r.get("qps"), "{:,.4g}"),
            _num(r.get("size"), "{:.0f}"),
            _num(r.get("gpus"), "{:.0f}"),
            _num(r.get("cost"), "{:,.4g}"),
            busiest,
            f"{r['boundary_size']} @ {r['boundary_qps']:g} QPS: {r['boundary_pass_fraction']:.0%}",
        )
    console.print(t)


def _print_columns(df: pd.DataFrame) -> None:
    """Every column of a compare plan's frontier (sim.study.disaggcompare)."""
    t = Table(title="frontier", header_style="bold")
    cols = [c for c in df.columns if not c.startswith("boundary_")]
    for c in cols:
        t.add_column(c, justify="right")
    for r in df[cols].itertuples(index=False):
        t.add_row(*[_cell(c, v) for c, v in zip(cols, r, strict=True)])
    Console(highlight=False, width=max(console.width, 160)).print(t)


def _cell(col: str, v: object) -> str:
    if isinstance(v, float) and col.startswith("util_"):
        return fmt_value("utilisation", v)
    if isinstance(v, float) and col == "qps":
        return f"{v:,.1f}"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return str(v)


def _num(v: object, fmt: str) -> str:
    """``v`` formatted, ``-`` when missing (None, or NaN in a frame)."""
    return "-" if v is None or v != v else fmt.format(v)


def _blame(
    err: InputError,
    p99: list[str] | None,
    set_: list[str] | None,
    options: dict[str, tuple[str, list[str]]] | None = None,
) -> InputError:
    """A plan error caused by an option blamed on that option, not the file: ``--p99``,
    ``--set``, or one of ``options`` (plan field -> the option and its values given)."""
    where = err.where or ""
    text = str(err)
    if p99 and (where.startswith("slo.p99") or ": slo.p99" in text):
        where = where or "slo.p99"
        msg = text.split(f"{where}: ", 1)[-1]
        return InputError(msg, source=f"--p99 {' '.join(p99)}", where=where)
    for field, (option, values) in (options or {}).items():
        if values and (where == field or where.startswith(f"{field}[")):
            msg = text.split(f"{where}: ", 1)[-1]
            return InputError(msg, source=" ".join(f"{option} {v}" for v in values))
    return blame_override(err, list(set_ or []))


def _check_same_plan(folder: Path, spec: dict[str, object]) -> None:
    """:class:`InputError` when ``folder`` holds the results of a different plan."""
    try:
        old = json.loads((folder / "plan.json").read_text("utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(old, dict) and old.get("spec") not in (None, spec):
        raise InputError(
            f"--out {folder}: holds plan.json of another plan (its spec differs); give another "
            "folder or leave out --out"
        )


#: engines whose launch command ``--emit`` writes
EMIT_ENGINES = ("vllm",)


def check_emit(emit: str | None) -> None:
    """:class:`InputError` naming ``--emit`` and the engines allowed for any other value."""
    if emit is not None and emit not in EMIT_ENGINES:
        raise InputError(f"{emit!r}; allowed: {', '.join(EMIT_ENGINES)}", source="--emit")


def write_emitted(folder: Path, sc: object) -> None:
    """Write and print ``vllm-serve.sh`` for the deployment scenario ``sc``."""
    from sim.study.emit import vllm_command
    from sim.study.sweep.resultcache import write_atomic

    text = vllm_command(sc)
    write_atomic(folder / "vllm-serve.sh", text)
    console.print(text.rstrip("\n"), markup=False)
    console.print(f"launch command: {folder / 'vllm-serve.sh'}")


def _emit_plan(res: Any, spec: PlanFile, scen: Path) -> None:
    """``--emit vllm`` of a plan: the chosen min-size answer's deployment; InputError when
    the plan has none (no min-size question, none met the SLOs, or a compare plan)."""
    from sim.study.planreport import chosen_row
    from sim.study.sweep.spec import build_points, override_text

    row = chosen_row(res)
    if row is None:
        raise InputError(
            "no deployment to emit: the plan has no passing min-size answer (compare plans "
            "are not emitted yet)",
            source="--emit vllm",
        )
    grid = {k: [row[k]] for k in spec.alternatives}
    grid[spec.size_key] = [int(row["size"])]
    grid[spec.qps_key] = [row["qps"]]
    base = [override_text(k, v) for k, v in spec.set.items()]
    sc = build_points(scen, grid, [0], base, spec.variant, source="plan")[0].scenario
    write_emitted(res.folder, sc)
