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
    req, thr, util = s["requests"], s["throughput"], s["utilisation"]

    def pct(d: dict[str, Any], scale: float, unit: str) -> str:
        return " / ".join(
            _fmt(None if d.get(k) is None else d[k] * scale, unit) for k in ("p50", "p99")
        )

    rows = [
        (
            "requests done / shed / rejected / unfinished",
            f"{req['completed']} / {req['shed']} / {req['rejected']} / {req['unfinished']}",
        ),
        ("preemptions", str(req["preemptions"])),
        ("simulated time", _fmt(s["sim_time_s"], " s")),
        (
            "offered / achieved (steady window)",
            f"{_fmt(thr['offered_rps'])} / {_fmt(thr['achieved_rps'], ' req/s')}",
        ),
        ("overloaded", "YES" if s["overloaded"] else "no"),
        ("goodput under SLO", _fmt(s["goodput_rps"], " req/s")),
        ("E2E p50 / p99", pct(lat.get("e2e", {}), 1.0, " s")),
        ("TTFT p50 / p99", pct(lat.get("ttft", {}), 1e3, " ms")),
        ("TPOT p50 / p99", pct(lat.get("tpot", {}), 1e3, " ms")),
    ]
    hr = s["hit_rate"]
    rows.append(("weight HBM hit rate (per access)", _fmt(hr.get("hbm"))))
    rows.append(("param-wait share of busy time", _fmt(s["param_wait_share"])))
    rows.append(
        (
            "utilisation busy / tokens / MFU / MBU",
            " / ".join(_fmt(util[k]) for k in ("busy", "token_budget", "mfu", "mbu")),
        )
    )
    rows.append(
        (
            "utilisation PCIe / NIC / PS NIC",
            " / ".join(_fmt(util[k]) for k in ("pcie", "nic", "ps_nic")),
        )
    )
    rows.append(("replicas / GPUs", f"{s['replicas']} / {s['gpus']}"))
    rows.append(("peak HBM per replica", _fmt(s["peak_hbm_bytes_per_replica"] / 2**30, " GiB")))
    rows.append(("events per request", _fmt(s["events_per_request"])))
    for cls, c in s.get("per_class", {}).items():
        rows.append(
            (
                f"class {cls}: E2E p99 (shed)",
                f"{_fmt(c['latency']['e2e']['p99'], ' s')} ({c['shed']})",
            )
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
    for w in _warnings(s):
        err_console.print(f"warning: {w}")
    unfinished = _unfinished(s)
    if unfinished:
        reason = _stop_reason(s) or "the run ended"
        err_console.print(f"error: {unfinished} requests unfinished: {reason}")
        raise typer.Exit(3)


def _runs(s: dict[str, Any]) -> list[dict[str, Any]]:
    return list(s["variants"].values()) if "variants" in s else [s]


def _warnings(s: dict[str, Any]) -> list[str]:
    return [w for r in _runs(s) for w in r.get("warnings", [])]


def _unfinished(s: dict[str, Any]) -> int:
    return sum(int(r["requests"]["unfinished"]) for r in _runs(s))


def _stop_reason(s: dict[str, Any]) -> str | None:
    return next((r["stop_reason"] for r in _runs(s) if r.get("stop_reason")), None)
