"""``pdsim replay FILE [--until T]``: re-run a replay file and compare its trace hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from engine.units import MAX_DURATION
from pdsim.cli.common import console, float_option, user_errors


def replay(
    file: Annotated[
        Path, typer.Argument(metavar="FILE", help="Replay file (written by pdsim chaos or run).")
    ],
    until: Annotated[
        float | None,
        typer.Option(
            "--until",
            parser=float_option(0, MAX_DURATION, open_lo=True),
            metavar="SECONDS",
            help="Stop at this simulated time (s) and dump the state.",
        ),
    ] = None,
) -> None:
    """Re-run FILE with its seed. Without --until: report whether the event-trace hash and
    the applied fault schedule match (exit 1 if not). With --until T: stop at T (after every
    event due at T, a fault at T included) and print the state (Raft replicas, servers, nodes, cuts, faults applied so far) as JSON."""
    from sim.study.recording import replay as do_replay

    with user_errors():
        rep = do_replay(file, until)
    out = rep.outcome
    if until is not None:
        console.print_json(json.dumps(out.state, default=str))
        where = (
            f"stopped at t={out.sim_time:.6f}s"
            if out.sim_time >= until
            else f"the run ended at t={out.sim_time:.6f}s, before --until {until:g}"
        )
        console.print(
            f"{where}; fault schedule so far {'matches' if rep.schedule_matches else 'DIFFERS'}"
        )
        if not rep.schedule_matches:
            raise typer.Exit(code=1)
        return
    for f in out.findings:
        console.print(f"violation: {f}")
    if rep.matches:
        console.print(f"trace hash matches: {rep.got}")
        return
    console.print(
        f"[bold red]MISMATCH[/]: recorded {rep.expected}, replayed {rep.got}; schedule "
        f"{'matches' if rep.schedule_matches else 'differs'}"
    )
    raise typer.Exit(code=1)
