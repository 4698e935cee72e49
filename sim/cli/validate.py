"""``pdsim validate``: the real engine vs the simulator on the validation suite.

``pdsim validate --profile P [--workload W ...] [--backend cpu|gpu] [--json] [--out DIR]`` runs
each workload of :mod:`hwbench.workloads` (all by default) on the engine (NumPy, or CuPy with
``--backend gpu``) and in the simulator
configured to match it with profile ``P`` (:mod:`hwbench.validate`), then prints one table per
workload -- latency and TTFT P50/P99/mean, throughput, hit rate and bytes per tier: engine,
simulator, error -- and writes a PNG of the latency CDFs (``DIR/validate_cdf.png``, default
``runs/validate-PROFILE-HASH/``; scratch files go to a temporary folder). ``--json`` prints the same figures as one JSON object on the last line;
relative errors are fractions under keys ending in ``rel_error``, hit-rate differences
(fractions) under keys ending in ``abs_error``.

``pdsim calibrate`` runs the engine probe (:func:`hwbench.engine_probe.calibrate_engine`:
compute terms, the prefetch path's bandwidth and the streaming terms -- copy/compute factor
and per-iteration overheads -- of :mod:`hwbench.interference`), so ``pdsim calibrate`` then
``pdsim validate`` is the normal flow.
If ``P`` has no ``fitted.engine_fit`` (an older or hand-written profile), the engine probe runs
first and the fitted profile is used and written to ``DIR/profile-with-engine-fit.json``.
``--refit`` re-runs it right before every workload. ``--repeats N`` serves each workload N
times on the engine (the same arrivals) and compares the simulator with each request's median
latency over them (:func:`hwbench.validate.median_requests`: a slow spell of the machine in
one run does not become the P99). The engine runs on wall time (see
:data:`hwbench.validate.EXCLUDE_CPU_WAIT`), so run it on a quiet machine, with the BLAS thread
count the profile was measured with (its notes say which). It warns when other processes or
steal took more than 10% of the machine's CPU during the validation, or during the profile's
calibration (``fitted["calibration_load"]``; :mod:`hwbench.quiet`), and when a fixed
reference workload runs more than 5% slower or faster than when the profile was calibrated
(timed before and after the workloads); ``--json`` reports the validation's shares under
``machine_load`` and the reference times under ``machine_speed`` (``drift``: now / then - 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sim.cli.common import (
    array_backend,
    check_out_dir,
    console,
    err_console,
    inputs_digest,
    result_name,
    user_errors,
)

LIMITS = {"latency_p50": 0.10, "latency_p99": 0.15, "throughput_rps": 0.10}
HIT_LIMIT = 0.01


def _verdict(name: str, err: float | None, kind: str) -> str:
    if err is None:
        return ""
    if kind == "abs":
        return "ok" if abs(err) <= HIT_LIMIT else "OVER"
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
            help="Folder for the CDF plot (and a fitted profile). Default: "
            "runs/validate-PROFILE-HASH (HASH of the options).",
        ),
    ] = None,
    refit: Annotated[
        bool,
        typer.Option(
            "--refit",
            help="Re-run the engine probe right before each workload (a busy shared machine).",
        ),
    ] = False,
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            "-r",
            min=1,
            help="Engine runs per workload (the same arrivals each time); the table takes "
            "each request's median latency over them, so a slow spell of the machine does "
            "not become the workload's P99 unless it hits the same request in most runs. "
            "1 on a quiet machine.",
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
        from hwbench.engine_probe import calibrate_engine
        from hwbench.validate import plot_cdfs, validate_workload
        from hwbench.workloads import SUITE, get_workload
        from sim.costmodel import load_profile

        if out is not None:
            check_out_dir(out)
        xp = array_backend(backend)
        prof = load_profile(profile)
        chosen = [get_workload(n) for n in workload] if workload else list(SUITE)
        if out is None:
            digest = inputs_digest([profile, sorted(workload or []), backend, repeats, refit])
            out = Path("runs") / result_name("validate", Path(profile).stem, digest)
        check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        if "engine_fit" not in prof.fitted:
            err_console.print(
                f"profile {profile} has no fitted.engine_fit: running the engine probe first"
            )
            prof = calibrate_engine(prof, xp)
            (out / "profile-with-engine-fit.json").write_text(
                prof.model_dump_json(indent=2) + "\n", encoding="utf-8"
            )
        from hwbench.quiet import (
            between,
            recorded,
            recorded_reference,
            reference_seconds,
            sample,
            speed_warning,
            warning,
        )

        note = warning(recorded(prof.fitted), "its calibration")
        if note is not None:
            err_console.print(f"[yellow]warning:[/] profile {profile}: {note}")
        start, ref0 = sample(), reference_seconds()
        comps = []
        for w in chosen:
            err_console.print(f"[bold]{w.name}[/]: {w.description}")
            comps.append(validate_workload(w, prof, refit=refit, repeats=repeats, xp=xp))
        load, ref1 = between(start, sample()), reference_seconds()
        ref_then = recorded_reference(prof.fitted)
        png = plot_cdfs(comps, out / "validate_cdf.png")

    for c in comps:
        table = Table(title=c.workload, header_style="bold")
        for col in ("metric", "engine", "sim", "error", ""):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for name, e, s, err, kind in c.rows:
            shown = f"{err * 100:+.1f} pp" if kind == "abs" else f"{err * 100:+.1f}%"
            table.add_row(name, f"{e:.4g}", f"{s:.4g}", shown, _verdict(name, err, kind))
        console.print(table)
    console.print(f"latency CDFs: {png}")
    ref_now = (ref0 + ref1) / 2
    for note in (
        warning(load, "validation"),
        speed_warning(ref_now, ref_then, f"now than when profile {profile} was calibrated"),
    ):
        if note is not None:
            err_console.print(f"[yellow]warning:[/] {note}")
    if as_json:
        doc = {
            "machine_load": load._asdict() if load is not None else None,
            "machine_speed": {
                "reference_s": ref_now,
                "profile_reference_s": ref_then,
                "drift": ref_now / ref_then - 1.0 if ref_then else None,
            },
            "profile": profile,
            "workloads": [c.as_dict() for c in comps],
            "max_errors": _max_errors(comps),
        }
        typer.echo(json.dumps(doc, sort_keys=True))


def _max_errors(comps: list) -> dict[str, float]:  # type: ignore[type-arg]
    """Largest absolute error of each metric over the workloads (keys end in ``error``)."""
    out: dict[str, float] = {}
    for c in comps:
        for key, val in c.errors().items():
            if val == val:  # not NaN
                out[key] = max(out.get(key, 0.0), abs(val))
    return dict(sorted(out.items()))
