"""Chaos runs: many random-fault seeds of one scenario, checked; replay files for failures.

:func:`run_chaos` runs :func:`sim.study.recording.run_checked` once per seed on the scenario with the
control plane and the random fault process switched on (``faults.enabled`` and
``faults.random.enabled``; the scenario's own ``faults.random`` knobs and schedule are kept).
Each seed gives one row: safety violations and liveness violations found (apart:
:func:`sim.control.runcheckers.is_liveness`), availability (fraction of requests answered within
their SLO), requests lost (shed or never answered), degraded results, faults applied, the
trace hash, and the replay file written for it (every failing seed; every seed with
``all_replays``).

Execution: in-process when ``workers <= 1`` and no ``scheduler``; otherwise on Dask through
:func:`sim.study.sweep.daskclient.dask_client` (the project's one way to get a client): a
``LocalCluster`` of ``workers`` single-threaded processes, or the existing scheduler at
``scheduler``; without the ``dist`` extra, an ``InputError`` naming it. Seeds are independent, so the rows do not depend on how
they were run (rows come back sorted by seed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import InputError
from sim.control.runcheckers import is_liveness
from sim.scenario import Scenario, resolved_dict, validate
from sim.study.recording import run_checked, write_replay


def parse_seeds(text: str) -> list[int]:
    """``"1-500"``, ``"7"`` or ``"1,2,10-12"`` -> sorted distinct seeds (InputError else)."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo < 0 or hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                v = int(part)
                if v < 0:
                    raise ValueError
                out.add(v)
        except ValueError:
            raise InputError(
                f"--seeds {text!r}: {part!r} is not a seed or range; allowed: N, A-B (0 <= A <= B)"
                ", comma-separated"
            ) from None
    return sorted(out)


def chaos_scenario(sc: Scenario) -> Scenario:
    """``sc`` with the control plane and the random fault process on."""
    data = resolved_dict(sc)
    data["faults"]["enabled"] = True
    data["faults"]["random"]["enabled"] = True
    out = validate(data, source=sc.source)
    out.name = sc.name
    return out


def run_seed(
    data: dict[str, Any], source: str, seed: int, replay_dir: str | None, all_replays: bool
) -> dict[str, Any]:
    """One seed (a plain function of picklable arguments, for Dask workers)."""
    sc = validate(data, source=source)
    out = run_checked(sc, seed)
    row: dict[str, Any] = {
        "seed": seed,
        "ok": out.ok,
        "violations": [f for f in out.findings if not is_liveness(f)],
        "liveness": [f for f in out.findings if is_liveness(f)],
        "availability": out.availability,
        "requests_lost": out.requests_lost,
        "degraded": out.degraded,
        "completed": out.completed,
        "faults": len(out.applied),
        "sim_time": out.sim_time,
        "trace_hash": out.trace_hash,
        "replay": None,
    }
    if replay_dir is not None and (all_replays or not out.ok):
        name = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in sc.name)
        p = write_replay(Path(replay_dir) / f"{name}-seed-{seed}.replay.json", sc, seed, out)
        row["replay"] = str(p)
    return row


def run_chaos(
    sc: Scenario,
    seeds: list[int],
    workers: int = 1,
    scheduler: str | None = None,
    replay_dir: str | Path | None = None,
    all_replays: bool = False,
    progress: Callable[[int, int], None] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every seed (see the module docstring); rows sorted by seed. ``on_row`` is called
    with each row as soon as its seed finishes (to keep finished seeds if stopped)."""
    csc = chaos_scenario(sc)
    data, source = resolved_dict(csc), csc.source
    rdir = None if replay_dir is None else str(replay_dir)
    rows: list[dict[str, Any]] = []
    if workers <= 1 and scheduler is None:
        for i, s in enumerate(seeds):
            rows.append(run_seed(data, source, s, rdir, all_replays))
            if on_row is not None:
                on_row(rows[-1])
            if progress is not None:
                progress(i + 1, len(seeds))
        return rows
    from sim.study.sweep.daskclient import dask_client

    with dask_client(workers, scheduler) as client:
        from dask.distributed import as_completed

        futs = client.map(
            run_seed,
            [data] * len(seeds),
            [source] * len(seeds),
            seeds,
            [rdir] * len(seeds),
            [all_replays] * len(seeds),
            pure=False,
        )
        for i, fut in enumerate(as_completed(futs)):
            rows.append(fut.result())
            if on_row is not None:
                on_row(rows[-1])
            if progress is not None:
                progress(i + 1, len(seeds))
    return sorted(rows, key=lambda r: r["seed"])


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over seeds: failing seeds, safety and liveness violations, mean availability,
    requests lost, faults."""
    avail = [r["availability"] for r in rows if r["availability"] is not None]
    return {
        "seeds": len(rows),
        "failing_seeds": [r["seed"] for r in rows if not r["ok"]],
        "violations": sum(len(r["violations"]) for r in rows),
        "liveness_violations": sum(len(r.get("liveness", [])) for r in rows),
        "mean_availability": sum(avail) / len(avail) if avail else None,
        "min_availability": min(avail) if avail else None,
        "requests_lost": sum(r["requests_lost"] for r in rows),
        "degraded": sum(r["degraded"] for r in rows),
        "faults_applied": sum(r["faults"] for r in rows),
    }
