"""``pdsim validate``: the real engine vs the simulator on the held-out validation suite.

``pdsim validate --profile P [--workload W ...] [--backend cpu|gpu] [--json] [--out DIR]`` runs
each workload of :mod:`hwbench.workloads` (all by default; none of them is a calibration
workload) on the engine (NumPy, or CuPy with ``--backend gpu``) and in the simulator with
profile ``P`` (:mod:`hwbench.validate`), then prints one table per workload:

* **accuracy** -- latency P50/P99/mean, TTFT P50/P99/mean and throughput: engine,
  simulator, relative error. Latency P50 must be within 10% and P99 within 15%
  (:data:`LIMITS`); the others are reported only (throughput follows the arrivals).
* **engine runs CV** -- with ``--repeats`` of 2 or more, each latency and TTFT figure's
  coefficient of variation over the engine's runs (each run's own figure): how far the
  engine moves on its own between runs of the same arrivals, to read an error against
  (on the shared 2-core VM a single run's P50 moves 11-13%);
* **consistency** -- hit rate and bytes per tier: both sides run the same cache code on the
  same accesses, so these must be equal, up to an iteration more or less where batches
  formed differently (:data:`CONSISTENCY_TOL`: 1 pp of hit rate, 2% of bytes).

The exit status is 1 when any figure is over its limit or any consistency check differs.
The simulator side of each workload is an ordinary scenario folder, kept in
``DIR/scenarios/WORKLOAD/`` (``scenario.yaml``, trace, catalogue, profile): ``pdsim run`` of
it gives the simulator's figures. A PNG of the latency CDFs goes to ``DIR/validate_cdf.png``
(default ``DIR``: ``runs/validate-PROFILE-HASH/``). ``--json`` prints the figures as one
JSON object on the last line (relative errors under keys ending in ``rel_error``, hit-rate
differences under keys ending in ``abs_error``, the engine runs' coefficient of variation
under ``engine_run_cv``, and ``passed``).

``P`` must carry the engine's op tables and terms (``ops.engine``: written by ``pdsim
calibrate``). ``--repeats N`` serves each workload N times on the engine (the same arrivals)
and compares the simulator with each request's median latency over them
(:func:`hwbench.comparison.median_requests`); the runs are interleaved (every workload once,
then every workload again), so a slow minute of the machine falls on one run of a workload,
not on all of them. The engine runs on wall time, so it warns when
other processes or steal took more than 10% of the machine's CPU during the validation or the
profile's calibration (:mod:`hwbench.quiet`), and when a fixed reference workload runs more
than 5% slower or faster than when the profile was calibrated; ``--json`` reports them under
``machine_load`` and ``machine_speed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

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
    """Run the validation suite on the engine and in the simulator and compare them."""
    with user_errors():
        from hwbench.quiet import recorded, reference_seconds, sample, warning
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
        start, ref0 = sample(), reference_seconds()
        comps = _run_suite(chosen, prof, out, repeats, xp)
        steady = _steadiness(start, ref0, prof)
        png = plot_cdfs(comps, out / "validate_cdf.png")

    failed = _print_tables(comps)
    console.print(f"latency CDFs: {png}")
    _warn(steady, profile)
    if as_json:
        typer.echo(json.dumps(_json_doc(comps, steady, profile, failed), sort_keys=True))
    if failed:
        err_console.print(f"pdsim validate: {len(failed)} figure(s) over their limit or differing:")
        for line in failed:
            err_console.print(f"  {line}")
        raise typer.Exit(1)


@dataclass(frozen=True)
class _Steadiness:
    """How quiet the machine was while validating (None where not measurable) and the
    reference workload's seconds now (mean of start and end) and when the profile was
    calibrated (None where it does not say)."""

    load: Load | None
    ref_now: float
    ref_then: float | None


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


def _run_suite(
    chosen: list[ValidationWorkload], prof: Profile, out: Path, repeats: int, xp: ModuleType
) -> list[Comparison]:
    """Validate ``chosen`` (:func:`hwbench.validate.validate_suite`: the engine's runs
    interleaved across the workloads), their scenario folders kept under ``out/scenarios/``;
    one line on stderr per workload, then per engine run."""
    from hwbench.validate import validate_suite

    for w in chosen:
        err_console.print(f"[bold]{w.name}[/]: {w.description}")
    total = repeats * len(chosen)
    position = {w.name: i for i, w in enumerate(chosen)}

    def progress(w: ValidationWorkload, k: int) -> None:
        run = k * len(chosen) + position[w.name] + 1
        err_console.print(f"engine run {run}/{total}: {w.name} (pass {k + 1}/{repeats})")

    dirs = {w.name: out / "scenarios" / w.name for w in chosen}
    return validate_suite(chosen, prof, repeats=repeats, xp=xp, scenario_dirs=dirs, on_run=progress)


def _steadiness(start: Sample | None, ref0: float, prof: Profile) -> _Steadiness:
    """The load since ``start`` and the reference workload's time now (``ref0``: at the
    start), with the reference time ``prof`` recorded at its calibration."""
    from hwbench.quiet import between, recorded_reference, reference_seconds, sample

    load, ref1 = between(start, sample()), reference_seconds()
    return _Steadiness(load, (ref0 + ref1) / 2, recorded_reference(prof.fitted))


def _print_tables(comps: list[Comparison]) -> list[str]:
    """Print one table per workload; return the figures over their limit or differing, one
    line each."""
    failed: list[str] = []
    for c in comps:
        table = Table(title=c.workload, header_style="bold")
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


def _warn(steady: _Steadiness, profile: str) -> None:
    """Warn on stderr when the machine was not quiet while validating, or runs at another
    speed than when ``profile`` was calibrated."""
    from hwbench.quiet import speed_warning, warning

    for note in (
        warning(steady.load, "validation"),
        speed_warning(
            steady.ref_now, steady.ref_then, f"now than when profile {profile} was calibrated"
        ),
    ):
        if note is not None:
            err_console.print(f"[yellow]warning:[/] {note}")


def _json_doc(
    comps: list[Comparison], steady: _Steadiness, profile: str, failed: list[str]
) -> dict[str, Any]:
    """The ``--json`` object (module docstring)."""
    ref_now, ref_then = steady.ref_now, steady.ref_then
    return {
        "machine_load": steady.load._asdict() if steady.load is not None else None,
        "machine_speed": {
            "reference_s": ref_now,
            "profile_reference_s": ref_then,
            "drift": ref_now / ref_then - 1.0 if ref_then else None,
        },
        "profile": profile,
        "workloads": [c.as_dict() for c in comps],
        "max_errors": _max_errors(comps),
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
