"""``pdsim chaos SCENARIO --seeds 1-500``: random-fault seeds under the checkers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pdsim.cli.common import (
    MAX_WORKERS,
    check_out_dir,
    check_out_kind,
    check_same_inputs,
    console,
    err_console,
    int_option,
    load_scenario_arg,
    out_path,
    result_name,
    user_errors,
)
from sim.study.sweep.resultcache import write_atomic
from sim.study.sweep.spec import SEEDS_HELP, parse_seed_option


def chaos(
    scenario: Annotated[
        str,
        typer.Argument(
            metavar="SCENARIO", help="Scenario YAML file, or a shipped scenario's name."
        ),
    ],
    seeds: Annotated[str, typer.Option("--seeds", metavar="SEEDS", help=SEEDS_HELP)] = "1-20",
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            parser=int_option(1, MAX_WORKERS),
            metavar="N",
            help="Dask LocalCluster workers (1: in-process).",
        ),
    ] = 1,
    scheduler: Annotated[
        str | None,
        typer.Option("--scheduler", metavar="ADDR", help="Address of a running Dask scheduler."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Override a field (YAML value)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            parser=out_path,
            help="Folder for chaos.json, seeds.jsonl and the replay files (default "
            "runs/chaos-NAME-HASH, HASH of the resolved scenario); a folder holding another "
            "scenario's chaos results is refused.",
        ),
    ] = None,
    all_replays: Annotated[
        bool, typer.Option("--all-replays", help="Write a replay file for every seed.")
    ] = False,
) -> None:
    """Run random-fault SEEDS of SCENARIO with every checker on. Prints a row per failing
    seed (the first 5 seeds when none fails) and the totals, writes OUT/chaos.json (every
    seed finished in OUT, earlier runs' too) and a replay file per failing seed; exits 1
    when any seed found a violation. Each seed's row is appended to OUT/seeds.jsonl as it finishes: after Ctrl-C, the same command resumes
    and runs only the seeds not yet finished."""
    from sim.scenario import config_hash
    from sim.study.chaos import aggregate, chaos_scenario, run_chaos

    with user_errors():
        if out is not None:
            check_out_dir(out)
        seed_list = parse_seed_option(seeds)
        sc = load_scenario_arg(scenario, list(set_ or []))
        digest = config_hash(chaos_scenario(sc), 0)
        folder = out if out is not None else Path("runs") / result_name("chaos", sc.name, digest)
        check_out_dir(folder)
        check_out_kind(folder, "chaos")
        check_same_inputs(folder, "chaos.json", "config_hash", digest, "--out")
        done = _finished(folder / "seeds.jsonl", digest)
        # --all-replays runs again (identically) a finished seed that has no replay file
        todo = [s for s in seed_list if s not in done or (all_replays and not done[s]["replay"])]
        if done and len(todo) < len(seed_list):
            err_console.print(
                f"{len(seed_list) - len(todo)} of {len(seed_list)} seeds already finished in "
                f"{folder / 'seeds.jsonl'}; running the other {len(todo)}"
            )

        def prog(n: int, total: int) -> None:
            if n == total or n % 50 == 0:
                err_console.print(f"{n}/{total} seeds", highlight=False)

        def keep(row: dict[str, Any]) -> None:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "seeds.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({**row, "config_hash": digest}) + "\n")

        try:
            new = run_chaos(
                sc, todo, workers, scheduler, folder / "replays", all_replays, prog, on_row=keep
            )
        except KeyboardInterrupt:
            kept = len(_finished(folder / "seeds.jsonl", digest))
            err_console.print(
                f"{kept} finished seeds kept in {folder / 'seeds.jsonl'}; run the same command "
                "again to resume",
                soft_wrap=True,
            )
            raise typer.Exit(code=130) from None
    finished = {**done, **{r["seed"]: r for r in new}}
    rows = [finished[s] for s in sorted(set(seed_list) & set(finished))]
    agg = aggregate(rows)
    # chaos.json: every seed finished in the folder (an earlier run's seeds are kept)
    every = [finished[s] for s in sorted(finished)]
    report = {"scenario": sc.name, "config_hash": digest, "totals": aggregate(every)}
    write_atomic(folder / "chaos.json", json.dumps({**report, "seeds": every}, indent=1) + "\n")
    t = Table(title=f"chaos: {sc.name}", header_style="bold")
    for col in ("seed", "violations", "availability", "lost", "degraded", "faults", "replay"):
        t.add_column(col)
    shown = [r for r in rows if not r["ok"]] or rows[:5]
    for r in shown:
        t.add_row(
            str(r["seed"]),
            "; ".join(r["violations"] + r.get("liveness", []))[:120] or "0",
            "-" if r["availability"] is None else f"{r['availability'] * 100:.2f} %",
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
        f"{'-' if ma is None else f'{ma * 100:.2f} %'}  requests lost: {agg['requests_lost']}  "
        f"degraded: {agg['degraded']}  faults applied: {agg['faults_applied']}"
    )
    console.print(f"results: {folder / 'chaos.json'}")
    if agg["failing_seeds"]:
        raise typer.Exit(code=1)


def _finished(path: Path, digest: str) -> dict[int, dict[str, Any]]:
    """Rows of ``seeds.jsonl`` for config ``digest``, by seed (a torn last line is skipped)."""
    rows: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text("utf-8").splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("config_hash") == digest:
            row.pop("config_hash")
            rows[int(row["seed"])] = row
    return rows


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
    from sim.control.raft import SafetyViolation
    from sim.control.runcheckers import CheckerViolation
    from sim.runner import run_scenario
    from sim.simenv import SimulationStalled
    from sim.study.recording import violation_report

    try:
        return run_scenario(sc, seed, out, **kwargs)
    except (CheckerViolation, SafetyViolation) as exc:
        err_console.print(violation_report(sc, seed, exc, out), soft_wrap=True, markup=False)
        raise typer.Exit(code=1) from None
    except SimulationStalled as exc:  # a runtime guard (sim.simenv): exit 1, say why
        err_console.print(f"error: {sc.name}, seed {seed}: {exc}", soft_wrap=True, markup=False)
        raise typer.Exit(code=1) from None
