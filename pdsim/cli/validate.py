"""``pdsim validate``: the real engine vs the simulator, three checks on held-out workloads.

``pdsim validate --profile P [--workload W ...] [--backend cpu|gpu] [--json] [--out DIR]`` runs
each workload of :mod:`hwbench.workloads` (all by default; none of them is a calibration
workload) on the engine (NumPy, or CuPy with ``--backend gpu``) ``--repeats`` times and in the
simulator with profile ``P`` (:func:`hwbench.validate.run_suite`), then checks the two models
the simulator is made of apart, and together:

1. **scheduling model** (:mod:`hwbench.schedcheck`): every engine run replayed through the
   simulator with each iteration costing what it took on the engine. Per workload, the
   largest error over the runs of TTFT, TPOT and end-to-end latency, P50 within 2% and P99
   within 5% (:data:`hwbench.schedcheck.SCHED_LIMITS`), and the same batches on both sides
   (a replay whose batch differs stops there and reports it). It does not depend on the
   machine's speed.
2. **cost model** (:mod:`hwbench.costcheck`): the profile's price of every engine iteration
   against its measured time, by phase and batch shape, with the engine's own repeat spread
   next to each error; a group of 5 iterations or more within 10%.
3. **end to end** -- one table per workload: latency P50/P99/mean, TTFT P50/P99/mean and
   throughput, engine, simulator, relative error (latency P50 within 10% and P99 within 15%,
   :data:`LIMITS`); with ``--repeats`` of 2 or more each figure's coefficient of variation
   over the engine's runs; and consistency -- hit rate and bytes per tier, which must agree
   (:data:`CONSISTENCY_TOL`: 1 pp of hit rate, 2% of bytes).

The machine's speed: a fixed reference workload (:func:`hwbench.quiet.reference_seconds`) is
timed before the first engine run and after each. When it moved more than
:data:`hwbench.quiet.SPEED_LIMIT` (against the profile's calibration, or within the
validation), the cost-model and end-to-end checks cannot tell the model from the machine:
the verdict is "inconclusive: the machine's speed moved X%" and the exit status 3.

Exit status: 1 when the scheduling check fails (any machine); else 3 when the speed moved;
else 1 when a cost group or an end-to-end figure is over its limit or a consistency check
differs; 0 otherwise. The simulator side of each workload is an ordinary scenario folder,
kept in ``DIR/scenarios/WORKLOAD/``: ``pdsim run`` of it gives the simulator's figures. A PNG
of the latency CDFs goes to ``DIR/validate_cdf.png`` (default ``DIR``:
``runs/validate-PROFILE-HASH/``). ``--json`` prints the figures as one JSON object on the
last line: ``workloads`` (end to end: relative errors under keys ending in ``rel_error``,
hit-rate differences under ``abs_error``, the runs' spread under ``engine_run_cv``),
``scheduling``, ``cost``, ``machine_speed`` (``samples_s``, ``moved``), ``verdict``
(``pass``, ``fail`` or ``inconclusive``) and ``passed``.

``P`` must carry the engine's op tables and terms (``ops.engine``: written by ``pdsim
calibrate``). ``--repeats N`` serves each workload N times on the engine (the same arrivals,
interleaved across the workloads) and compares the simulator with each request's median
latency over them (:func:`hwbench.comparison.median_requests`). It warns when other
processes or steal took more than 10% of the machine's CPU during the validation or the
profile's calibration (:mod:`hwbench.quiet`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from pdsim.cli.checktables import cost_dict, print_cost, print_scheduling
from pdsim.cli.common import (
    array_backend,
    check_out_dir,
    console,
    err_console,
    inputs_digest,
    int_option,
    out_path,
    result_name,
    user_errors,
)

if TYPE_CHECKING:
    from hwbench.comparison import Comparison
    from hwbench.quiet import Load, Sample
    from hwbench.validate import SuiteRun
    from hwbench.workloads import ValidationWorkload
    from sim.serving.costmodel import Profile

#: accuracy limits: the largest relative error allowed per figure
LIMITS = {"latency_p50": 0.10, "latency_p99": 0.15}
#: consistency checks: hit rates (absolute difference) and bytes per tier (relative) agree to
#: these. Both sides make the same decision on the same access, but an iteration more or less
#: (batches form with timing) shifts the totals a little
CONSISTENCY_TOL = {"hit_rate": 0.01, "bytes": 0.02}


def _verdict(name: str, err: float | None, kind: str) -> str:
    if err is None:
        return ""
    if kind == "abs" or name.startswith("bytes_per_access_"):
        tol = CONSISTENCY_TOL["hit_rate" if kind == "abs" else "bytes"]
        return "equal" if abs(err) <= tol else "DIFFERS"
    limit = LIMITS.get(name)
    if limit is None:
        return ""
    return "ok" if abs(err) <= limit else "OVER"


def validate(
    profile: Annotated[str, typer.Option("--profile", "-p", help="Calibration profile JSON.")],
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", "-w", help="Workload name (repeatable). Default: all."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Also print the figures as one JSON object (last line).")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR",
            parser=out_path,
            help="Folder for the CDF plot (and a fitted profile). Default: "
            "runs/validate-PROFILE-HASH (HASH of the options).",
        ),
    ] = None,
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            "-r",
            parser=int_option(1, 1000),
            metavar="N",
            help="Engine runs per workload (the same arrivals each time), interleaved across "
            "the workloads; the table takes each request's median latency over them, so a "
            "slow spell of the machine does not become the workload's P99 unless it hits the "
            "same request in most runs. 1 on a quiet machine.",
        ),
    ] = 5,
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            "-b",
            help="The engine's array backend: cpu (NumPy) or gpu (CuPy; use a profile "
            "calibrated with --backend gpu).",
        ),
    ] = "cpu",
) -> None:
    """Run the validation suite on the engine and in the simulator: the scheduling model, the
    cost model and both together."""
    with user_errors():
        from hwbench.quiet import recorded, sample, warning
        from hwbench.validate import plot_cdfs
        from hwbench.workloads import SUITE, get_workload

        if out is not None:
            check_out_dir(out)
        xp = array_backend(backend)
        prof = _engine_profile(profile)
        chosen = [get_workload(n) for n in workload] if workload else list(SUITE)
        if out is None:
            digest = inputs_digest([profile, sorted(workload or []), backend, repeats])
            out = Path("runs") / result_name("validate", Path(profile).stem, digest)
        check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        note = warning(recorded(prof.fitted), "its calibration")
        if note is not None:
            err_console.print(f"[yellow]warning:[/] profile {profile}: {note}")
        start = sample()
        suite = _run_suite(chosen, prof, out, repeats, xp)
        steady = _steadiness(start, suite.reference_s, prof)
        png = plot_cdfs(suite.comparisons, out / "validate_cdf.png")

    sched_failed = print_scheduling(suite.scheduling)
    cost_failed = print_cost(suite.cost)
    failed = _print_tables(suite.comparisons)
    console.print(f"latency CDFs: {png}")
    _warn(steady)
    verdict, why = _overall(sched_failed, cost_failed + failed, steady)
    if as_json:
        doc = _json_doc(suite, steady, profile, sched_failed + cost_failed + failed)
        doc.update(
            verdict=verdict,
            passed=verdict == "pass",
            inconclusive=why if verdict == "inconclusive" else None,
        )
        typer.echo(json.dumps(doc, sort_keys=True))
    _finish(verdict, why, sched_failed, cost_failed + failed)


def _overall(
    sched_failed: list[str], model_failed: list[str], steady: _Steadiness
) -> tuple[str, str]:
    """``(verdict, reason)``: ``fail`` when the scheduling check failed (it holds on any
    machine); else ``inconclusive`` when the machine's speed moved more than the limit; else
    ``fail`` or ``pass`` on the cost and end-to-end checks."""
    from hwbench.quiet import SPEED_LIMIT

    if sched_failed:
        return "fail", "the scheduling model"
    if steady.moved > SPEED_LIMIT:
        return "inconclusive", (
            f"inconclusive: the machine's speed moved {steady.moved:.1%} (limit "
            f"{SPEED_LIMIT:.0%}; reference workload {_ref_range(steady)}), so the cost-model and "
            "end-to-end errors cannot be told from the machine's"
        )
    return ("fail", "the cost model or end to end") if model_failed else ("pass", "")


def _ref_range(steady: _Steadiness) -> str:
    lo, hi = min(steady.samples) * 1e3, max(steady.samples) * 1e3
    then = f" against {steady.ref_then * 1e3:.1f} ms at calibration" if steady.ref_then else ""
    return f"{lo:.1f}-{hi:.1f} ms{then}"


def _finish(verdict: str, why: str, sched_failed: list[str], model_failed: list[str]) -> None:
    """Print the verdict and exit 1 (fail), 3 (inconclusive) or 0."""
    if verdict == "inconclusive":
        err_console.print(f"pdsim validate: {why}")
        raise typer.Exit(3)
    if verdict == "fail":
        lines = sched_failed or model_failed
        err_console.print(
            f"pdsim validate: {len(lines)} figure(s) over their limit or differing ({why}):"
        )
        for line in lines:
            err_console.print(f"  {line}")
        raise typer.Exit(1)
    err_console.print("pdsim validate: pass")


@dataclass(frozen=True)
class _Steadiness:
    """How quiet the machine was while validating (None where not measurable), the
    reference workload's seconds before the first engine run and after each (``samples``),
    the seconds the profile's calibration recorded (None where it does not say), and how
    far the speed moved (:func:`hwbench.quiet.speed_moved`)."""

    load: Load | None
    samples: list[float]
    ref_then: float | None
    moved: float


def _engine_profile(profile: str) -> Profile:
    """The profile at ``profile``; :class:`InputError` unless it has the engine's op tables
    and terms (``ops.engine``)."""
    from engine.errors import InputError
    from sim.serving.costmodel import load_profile

    prof = load_profile(profile)
    if prof.ops is None or prof.ops.engine is None:
        when = getattr(prof, "measured_at", None)
        raise InputError(
            "has no ops.engine, the engine's op tables and terms that validate prices "
            f"iterations with (a profile measured{f' {when}' if when else ''} by an older "
            "`pdsim calibrate`, or a datasheet or imported one); allowed: a profile the "
            "current `pdsim calibrate` wrote on this machine (default "
            "runs/profiles/cpu-HOST.json)",
            source=profile,
            where="ops.engine",
        )
    return prof


def _reference() -> float:
    """The machine's speed between engine runs: the reference workload, 3 timed runs."""
    from hwbench.quiet import reference_seconds

    return reference_seconds(repeats=3)


def _run_suite(
    chosen: list[ValidationWorkload], prof: Profile, out: Path, repeats: int, xp: ModuleType
) -> SuiteRun:
    """Validate ``chosen`` (:func:`hwbench.validate.run_suite`: the engine's runs interleaved
    across the workloads, the reference workload timed between them), their scenario folders
    kept under ``out/scenarios/``; one line on stderr per workload, then per engine run."""
    from hwbench.validate import run_suite

    for w in chosen:
        err_console.print(f"[bold]{w.name}[/]: {w.description}")
    total = repeats * len(chosen)
    position = {w.name: i for i, w in enumerate(chosen)}

    def progress(w: ValidationWorkload, k: int) -> None:
        run = k * len(chosen) + position[w.name] + 1
        err_console.print(f"engine run {run}/{total}: {w.name} (pass {k + 1}/{repeats})")

    dirs = {w.name: out / "scenarios" / w.name for w in chosen}
    return run_suite(
        chosen,
        prof,
        repeats=repeats,
        xp=xp,
        scenario_dirs=dirs,
        on_run=progress,
        reference=_reference,
    )


def _steadiness(start: Sample | None, samples: list[float], prof: Profile) -> _Steadiness:
    """The load since ``start``, the reference ``samples`` and the reference time ``prof``
    recorded at its calibration, and how far the speed moved."""
    from hwbench.quiet import between, recorded_reference, sample, speed_moved

    then = recorded_reference(prof.fitted)
    return _Steadiness(between(start, sample()), samples, then, speed_moved(samples, then))


def _print_tables(comps: list[Comparison]) -> list[str]:
    """Print one end-to-end table per workload; return the figures over their limit or
    differing, one line each."""
    failed: list[str] = []
    for c in comps:
        table = Table(title=f"end to end: {c.workload}", header_style="bold")
        for col in ("metric", "engine", "engine runs CV", "sim", "error", ""):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for name, e, s, err, kind in c.rows:
            shown = f"{err * 100:+.1f} pp" if kind == "abs" else f"{err * 100:+.1f}%"
            verdict = _verdict(name, err, kind)
            if verdict in ("OVER", "DIFFERS"):
                failed.append(f"{c.workload}: {name} {shown} {verdict}")
            cv = c.run_cv.get(name)
            spread = "" if cv is None else f"{cv * 100:.1f}%"
            table.add_row(name, f"{e:.4g}", spread, f"{s:.4g}", shown, verdict)
        console.print(table)
    return failed


def _warn(steady: _Steadiness) -> None:
    """Warn on stderr when the machine was not quiet while validating."""
    from hwbench.quiet import warning

    note = warning(steady.load, "validation")
    if note is not None:
        err_console.print(f"[yellow]warning:[/] {note}")


def _json_doc(
    suite: SuiteRun, steady: _Steadiness, profile: str, failed: list[str]
) -> dict[str, Any]:
    """The ``--json`` object (module docstring)."""
    ref_then = steady.ref_then
    ref_now = sum(steady.samples) / len(steady.samples) if steady.samples else None
    return {
        "machine_load": steady.load._asdict() if steady.load is not None else None,
        "machine_speed": {
            "reference_s": ref_now,
            "samples_s": steady.samples,
            "profile_reference_s": ref_then,
            "drift": ref_now / ref_then - 1.0 if ref_then and ref_now else None,
            "moved": steady.moved,
        },
        "profile": profile,
        "workloads": [c.as_dict() for c in suite.comparisons],
        "scheduling": [c.as_dict() for c in suite.scheduling],
        "cost": [cost_dict(r) for r in suite.cost],
        "max_errors": _max_errors(suite.comparisons),
        "passed": not failed,
        "failed": failed,
    }


def _max_errors(comps: list[Comparison]) -> dict[str, float]:
    """Largest absolute error of each metric over the workloads (keys end in ``error``)."""
    out: dict[str, float] = {}
    for c in comps:
        for key, val in c.errors().items():
            if val == val:  # not NaN
                out[key] = max(out.get(key, 0.0), abs(val))
    return dict(sorted(out.items()))
