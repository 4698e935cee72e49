"""``pdsim chaos SCENARIO --seeds 1-500``: random-fault seeds under the checkers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sim.cli.common import console, err_console, user_errors


def chaos(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds: N, A-B or a comma list.")] = "1-20",
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Dask LocalCluster workers (1: in-process).")
    ] = 1,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="Address of a running Dask scheduler.")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a field: KEY.PATH=VALUE (YAML value)."),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Folder for chaos.json and the replay files.")
    ] = Path("runs/chaos"),
    all_replays: Annotated[
        bool, typer.Option("--all-replays", help="Write a replay file for every seed.")
    ] = False,
) -> None:
    """Run random-fault SEEDS of SCENARIO with every checker on. Prints one row per failing
    seed and the totals, writes OUT/chaos.json and a replay file per failing seed; exits 1
    when any seed found a violation."""
    from sim.chaos import aggregate, parse_seeds, run_chaos
    from sim.scenario import load_scenario

    with user_errors():
        sc = load_scenario(scenario, list(set_ or []))
        seed_list = parse_seeds(seeds)

        def prog(done: int, total: int) -> None:
            if done == total or done % 50 == 0:
                err_console.print(f"{done}/{total} seeds", highlight=False)

        rows = run_chaos(sc, seed_list, workers, scheduler, out / "replays", all_replays, prog)
    agg = aggregate(rows)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "chaos.json.tmp"
    tmp.write_text(json.dumps({"scenario": sc.name, "totals": agg, "seeds": rows}, indent=1))
    tmp.replace(out / "chaos.json")
    t = Table(title=f"chaos: {sc.name}", header_style="bold")
    for col in ("seed", "violations", "availability", "lost", "degraded", "faults", "replay"):
        t.add_column(col)
    shown = [r for r in rows if not r["ok"]] or rows[:5]
    for r in shown:
        t.add_row(
            str(r["seed"]),
            "; ".join(r["violations"] + r.get("liveness", []))[:120] or "0",
            "-" if r["availability"] is None else f"{r['availability']:.3f}",
            str(r["requests_lost"]),
            str(r["degraded"]),
            str(r["faults"]),
            r["replay"] or "-",
        )
    console.print(t)
    ma = agg["mean_availability"]
    console.print(
        f"seeds: {agg['seeds']}  failing: {len(agg['failing_seeds'])}  "
        f"violations: {agg['violations']}  liveness violations: "
        f"{agg['liveness_violations']}  mean availability: "
        f"{'-' if ma is None else f'{ma:.4f}'}  requests lost: {agg['requests_lost']}  "
        f"degraded: {agg['degraded']}  faults applied: {agg['faults_applied']}"
    )
    console.print(str(out / "chaos.json"))
    if agg["failing_seeds"]:
        raise typer.Exit(code=1)


def fault_lines(s: dict[str, Any]) -> list[str]:
    """Readable lines for a run summary's ``faults`` section (``pdsim run`` prints them)."""
    f = s.get("faults")
    if not f:
        return []
    i, d, r = f["integrity"], f["degradation"], f["raft"]
    te = f["time_to_elect_s"]
    rec = f["recovery_time_s"]
    return [
        f"faults applied: {f['applied']}  violations: {len(f['violations'])}"
        + "".join(f"\n  violation: {v}" for v in f["violations"]),
        f"availability (answered within SLO): {f['availability']:.4f}  requests lost: "
        f"{f['requests_lost']}  degraded results: {d['degraded_results']}",
        "time to elect a new leader: "
        + (", ".join(f"{t:.3f}s" for t in te) if te else "-")
        + f"  replication recovered in: {'-' if rec is None else f'{rec:.3f}s'}",
        f"integrity: injected {i['injected']}, detected {i['detected']} "
        f"({i['detected_by_scrub']} by scrub), reads refused {i['reads_refused']}, repaired "
        f"{i['repaired']}, corrupted chunks used {i['corrupted_chunks_used']}",
        f"degradation: replica retries {d['replica_retries']}, object-store fallbacks "
        f"{d['object_store_fallbacks']}, migrated {d['migrated']}, shed {d['shed_on_failure']}",
        f"raft: {r['leaders']} leaders, {r['acked_writes']} acked writes, {r['messages']} "
        f"messages ({r['dropped']} dropped)",
    ]


def run_or_report(sc: Any, seed: int, out: Path, **kwargs: Any) -> Any:
    """``run_scenario`` for ``pdsim run``; a run stopped by a checker prints the violation and
    where its replay file went, and exits 1 (no traceback)."""
    from sim.checkers import CheckerViolation
    from sim.raft import SafetyViolation
    from sim.replay import violation_report
    from sim.runner import run_scenario

    try:
        return run_scenario(sc, seed, out, **kwargs)
    except (CheckerViolation, SafetyViolation) as exc:
        err_console.print(violation_report(sc, seed, exc, out), soft_wrap=True, markup=False)
        raise typer.Exit(code=1) from None
