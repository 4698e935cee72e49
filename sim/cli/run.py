"""``pdsim run SCENARIO``: simulate a scenario, print a summary, write the run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.cli.common import console, err_console, user_errors


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}{unit}"
    return f"{v}{unit}"


def _table(title: str, s: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    lat = s.get("latency", {})
    rows = [
        ("requests (done / shed / rejected)", f"{s['completed']} / {s['shed']} / {s['rejected']}"),
        ("simulated time", _fmt(s["sim_time_s"], " s")),
        ("throughput", _fmt(s["throughput_rps"], " req/s")),
        ("goodput under SLO", _fmt(s["goodput_rps"], " req/s")),
        (
            "latency p50 / p99 / p99.9",
            " / ".join(_fmt(lat.get(k), " s") for k in ("p50", "p99", "p999")),
        ),
        ("TTFT p50 / p99", " / ".join(_fmt(s["ttft"].get(k), " s") for k in ("p50", "p99"))),
        ("TBT p50 / p99", " / ".join(_fmt(s["tbt"].get(k), " s") for k in ("p50", "p99"))),
    ]
    hr = s["hit_rate"]
    rows.append(
        (
            "hit rate hbm/host/nvme/remote/object",
            " / ".join(_fmt(hr.get(k)) for k in ("hbm", "host", "nvme", "remote", "object")),
        )
    )
    rows.append(("param-wait share of busy time", _fmt(s["param_wait_share"])))
    r31 = s["r31"]
    rows.append(("param-load p99", _fmt(r31["param_load_p99_s"], " s")))
    rows.append(("KV fragmentation", _fmt(r31["fragmentation"])))
    rows.append(("compute utilisation", _fmt(r31["compute_utilisation"])))
    rows.append(("network saturation (max NIC)", _fmt(r31["network_saturation"])))
    rows.append(("peak HBM per node", _fmt(s["peak_hbm_bytes_per_node"] / 2**30, " GiB")))
    rows.append(("events per request", _fmt(s["events_per_request"])))
    for cls, c in s.get("per_class", {}).items():
        rows.append(
            (f"class {cls}: p99 latency (shed)", f"{_fmt(c['latency']['p99'], ' s')} ({c['shed']})")
        )
    for k, v in rows:
        t.add_row(k, v)
    return t


def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="Root random seed.")] = 0,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a field: KEY.PATH=VALUE (YAML value)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder that receives the run folder.")] = Path(
        "runs"
    ),
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No progress bar or table; print the run folder.")
    ] = False,
) -> None:
    """Simulate SCENARIO and write its run folder (config, summary, Parquet records, plots)."""
    from sim.cli.chaos import run_or_report  # checker violations -> report + replay
    from sim.runner import format_claim
    from sim.scenario import load_scenario

    with user_errors():
        sc = load_scenario(scenario, list(set_ or []))
        if quiet:
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
        if "variants" in s:
            for name, vs in s["variants"].items():
                console.print(_table(f"{sc.name} / {name}", vs))
        else:
            console.print(_table(sc.name, s))
        for c in result.claims:
            console.print(format_claim(c))
        from sim.cli.chaos import fault_lines  # the faults section (issue 5), if any

        for line in fault_lines(s):
            console.print(line)
        console.print(f"trace hash: {result.trace_hash}")
    console.print(str(result.out_dir))
