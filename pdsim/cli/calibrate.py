"""``pdsim calibrate``: run the hardware probes and write a measured profile (R16).

``pdsim calibrate [--backend cpu|gpu] [--quick|--tiny] --out FILE`` runs the
probes of :mod:`hwbench.probes` with a progress bar, fits them into the simulator's profile
schema (:func:`hwbench.profile.fit_profile`) and writes the JSON atomically (temporary file,
then rename), so a failed run never leaves a half-written profile. The default output is
``runs/profiles/<backend>-<hostname>.json`` (outside the tracked ``profiles/``). The profile is re-read through
:func:`sim.serving.costmodel.parse_profile` before it is written, so what lands on disk always
validates. Probe scratch files go to a temporary directory (``--workdir`` to choose where:
the SSD link is measured on that filesystem).

Unless ``--no-engine``, calibrate then measures the op tables of :mod:`sim.serving.opcost` on the
engine's backend (:mod:`hwbench.opprobe`: GEMMs with cold and cache-resident weights; decode
and prefill attention and the engine's elementwise ops timed in place, inside the engine's
layer loop (:mod:`hwbench.insitu_probe`); the op floor; on NumPy timed on thread CPU time) into the profile's ``ops`` section, serves calibration workloads on the real
engine and measures its own terms with those tables held fixed (:mod:`hwbench.engine_fit`:
per-iteration overhead, timed in place, serving-loop gap, extra after idle, copy
contention, compute lost per prefetched byte and the prefetch hand-off; ``ops.engine``), so ``pdsim validate`` -- and ``pdsim run`` of any
scenario naming the profile -- price iterations from it. ``--tiny`` keeps it to seconds.

Impossible results are rejected with exit status 1, the reasons on stderr and nothing
written: a link bandwidth above its physical ceiling or above the fastest copy its probe
timed (:func:`hwbench.profile.check_profile`), a measured overhead that is negative or near
zero, an engine fit error (op tables plus that overhead against the measured iteration
times) over the threshold, a copy rate above the link's
(:class:`hwbench.engine_fit.ImpossibleFit`); and a machine whose speed changed under the
probes: a fixed reference workload (:func:`hwbench.quiet.reference_seconds`) timed at the
start and at the end more than 5% apart (every term is then off by an unknown share of
that change; ``docs/calibration-profile.md``).

The share of the machine's CPU that other processes and the hypervisor (steal) took while
calibrating goes into ``fitted["calibration_load"]`` (:mod:`hwbench.quiet`), with the time
of a fixed reference workload at the start and the end (``reference_s``: their mean, which
``pdsim validate`` compares with the machine as it is then). The command warns when either
share is above 10%: the timings may be skewed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine.errors import InputError
from pdsim.cli.common import (
    array_backend,
    check_out_dir,
    check_out_file,
    console,
    err_console,
    out_path,
    user_errors,
)

if TYPE_CHECKING:
    from hwbench.probes import Measurement
    from hwbench.quiet import Load, Sample
    from sim.serving.costmodel import Profile


def _fmt_rate(v: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


@dataclass(frozen=True)
class _Steadiness:
    """How quiet and steady the machine was while calibrating: the share of its CPU others
    and steal took (None where not measurable) and the reference workload's seconds at the
    start and at the end (:mod:`hwbench.quiet`)."""

    load: Load | None
    ref0: float
    ref1: float


def calibrate(
    backend: Annotated[
        str, typer.Option("--backend", "-b", help="Array backend to measure: cpu or gpu.")
    ] = "cpu",
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Fewer sizes and repeats: 3 to 10 minutes on a 2-core VM (9.5 min measured "
            "on a shared one); the full set takes several times longer.",
        ),
    ] = False,
    tiny: Annotated[
        bool, typer.Option("--tiny", help="Smallest probe set (seconds; for tests).")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="FILE",
            parser=out_path,
            help="Profile JSON to write. Default: runs/profiles/<backend>-<host>.json.",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", metavar="NAME", help="Profile name. Default: the output file's stem."
        ),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir", metavar="DIR", help="Scratch directory for the SSD/object-store probes."
        ),
    ] = None,
    engine: Annotated[
        bool,
        typer.Option(
            "--engine/--no-engine",
            help="Also measure op tables on the engine's backend and measure the engine's own "
            "terms (hwbench.opprobe, hwbench.engine_fit; needed by pdsim validate).",
        ),
    ] = True,
) -> None:
    """Measure this machine and write a calibration profile for the simulator."""
    mode = "tiny" if tiny else "quick" if quick else "full"
    with user_errors():
        xp = array_backend(backend)
        path = _out_path(out, backend)
        if workdir is not None:
            check_out_dir(workdir, "--workdir")
        from hwbench.quiet import reference_seconds, sample

        start, ref0 = sample(), reference_seconds()
        measurements = _run_probes(mode, xp, workdir)
        profile, report = _fit(measurements, xp, name or path.stem, mode, backend, engine, workdir)
        profile, steady = _with_steadiness(profile, start, ref0)
        _reject_unsteady(steady)
        _write_atomically(profile, path)
    console.print(_summary(profile, f"{mode}, {backend}", report, steady))
    console.print(f"wrote {path}")
    _warn(steady)


def _out_path(out: Path | None, backend: str) -> Path:
    """The profile file to write (``--out``, else ``runs/profiles/<backend>-<host>.json``),
    checked before any work: :class:`InputError` when it is a folder or cannot be written."""
    host = platform.node() or "unknown"
    path = out if out is not None else Path("runs/profiles") / f"{backend}-{host}.json"
    if path.exists() and path.is_dir():
        raise InputError("is a directory; allowed: a .json file path", source=str(path))
    check_out_file(path)
    return path


def _run_probes(mode: str, xp: ModuleType, workdir: Path | None) -> list[Measurement]:
    """Run the hardware probes of ``mode`` (:mod:`hwbench.probes`) with a progress bar, their
    scratch files in a temporary folder under ``workdir`` (created if missing)."""
    from hwbench.probes import ProbeConfig, plan

    cfg = {"tiny": ProbeConfig.tiny, "quick": ProbeConfig.quick, "full": ProbeConfig.full}[mode]()
    measurements: list[Measurement] = []
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pdsim-calibrate-", dir=workdir) as scratch:
        steps = plan(cfg, xp, Path(scratch))
        columns = (
            TextColumn("[bold]{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        if not err_console.is_terminal:  # a log or a pipe: one line per probe, as it starts
            for i, step in enumerate(steps, 1):
                _stage(f"probe {i}/{len(steps)}: {step.name}")
                measurements.extend(step.run())
            return measurements
        with Progress(*columns, console=err_console, transient=True) as progress:
            task = progress.add_task("probes", total=len(steps))
            for step in steps:
                progress.update(task, description=step.name)
                measurements.extend(step.run())
                progress.advance(task)
    return measurements


def _stage(text: str) -> contextlib.AbstractContextManager[Any]:
    """A stage of the calibration: a spinner on a terminal; elsewhere (a log, a pipe) one
    line on stderr with the time of day, so a long run shows where it is and how fast it
    goes."""
    if err_console.is_terminal:
        return err_console.status(text)
    err_console.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False)
    return contextlib.nullcontext()


def _fit(
    measurements: list[Measurement],
    xp: ModuleType,
    name: str,
    mode: str,
    backend: str,
    engine: bool,
    workdir: Path | None,
) -> tuple[Profile, dict[str, float]]:
    """The profile fitted on ``measurements`` (:func:`hwbench.profile.fit_profile`); with
    ``engine``, plus the op tables measured on ``xp`` and the engine's own terms measured with
    them held fixed, and the engine fit's error report. Exits with status 1, the reasons on
    stderr, when a hardware term is impossible (:func:`hwbench.profile.check_profile`) or the
    engine fit is (:class:`hwbench.engine_fit.ImpossibleFit`)."""
    from hwbench.engine_fit import ImpossibleFit
    from hwbench.profile import check_profile, fit_profile

    profile = fit_profile(measurements, xp, name, mode=mode)
    reasons = check_profile(profile, measurements, backend == "gpu")
    report: dict[str, float] = {}
    if not reasons and engine:
        from hwbench.engine_fit import calibrate_engine
        from hwbench.opprobe import OpGrid, with_op_tables

        grid = {"tiny": OpGrid.tiny, "quick": OpGrid.quick, "full": OpGrid.full}[mode]()
        with _stage("op tables (GEMM; attention, elementwise in place)"):
            profile = with_op_tables(profile, xp, grid)
        with _stage("engine probe (serving calibration workloads)"):
            try:
                profile, report = calibrate_engine(profile, xp, mode=mode, workdir=workdir)
            except ImpossibleFit as exc:
                reasons.append(str(exc))
    if reasons:
        _reject(reasons)
    return profile, report


def _reject(reasons: list[str]) -> NoReturn:
    """Print each of ``reasons`` on stderr and exit with status 1 (nothing is written)."""
    for why in reasons:
        err_console.print(f"pdsim calibrate: rejected, nothing written: {why}")
    raise typer.Exit(1)


def _with_steadiness(
    profile: Profile, start: Sample | None, ref0: float
) -> tuple[Profile, _Steadiness]:
    """Measure the load since ``start`` and the reference workload again; ``profile`` with
    both recorded under ``fitted[hwbench.quiet.KEY]``, and what was measured."""
    from hwbench.quiet import KEY, between, reference_seconds, sample

    load, ref1 = between(start, sample()), reference_seconds()
    row = {
        **(load._asdict() if load is not None else {}),
        "reference_s": (ref0 + ref1) / 2,
        "reference_start_s": ref0,
        "reference_end_s": ref1,
    }
    profile = profile.model_copy(update={"fitted": {**profile.fitted, KEY: [row]}})
    return profile, _Steadiness(load, ref0, ref1)


def _reject_unsteady(steady: _Steadiness) -> None:
    """Exit with status 1, nothing written, when the reference workload's time changed by
    more than :data:`hwbench.quiet.SPEED_LIMIT` between the calibration's start and end:
    the probes then timed a machine whose speed moved under them, and every term of the
    profile is off by an unknown share of that change."""
    from hwbench.quiet import speed_warning

    why = speed_warning(steady.ref1, steady.ref0, "at the end of the calibration than at its start")
    if why is not None:
        _reject([why])


def _write_atomically(profile: Profile, path: Path) -> None:
    """Write ``profile`` as JSON to ``path`` through a temporary file and a rename, after
    checking that the text loads back (:func:`sim.serving.costmodel.parse_profile`)."""
    from sim.serving.costmodel import parse_profile

    text = profile.model_dump_json(indent=2) + "\n"
    parse_profile(text, str(path))  # what is written must load
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _summary(profile: Profile, how: str, report: dict[str, float], steady: _Steadiness) -> Table:
    """The table of the profile's main figures, the engine's terms where it has them, and
    how quiet and steady the machine was (``how``: the mode and backend, for the title)."""
    table = Table(title=f"profile {profile.name} ({how})", header_style="bold")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    g, links = profile.gpu, profile.links
    table.add_row("matmul fp32 (best)", _fmt_rate(g.flops_fp32, "FLOP/s"))
    table.add_row("matmul fp16 (best)", _fmt_rate(g.flops_fp16, "FLOP/s"))
    table.add_row("device memory bandwidth", _fmt_rate(g.hbm_bandwidth, "B/s"))
    table.add_row("host memory bandwidth", _fmt_rate(profile.host.dram_bandwidth, "B/s"))
    for link_name in ("object_store", "nvme", "pcie", "nvlink", "rdma"):
        lp = getattr(links, link_name)
        table.add_row(
            f"link {link_name}",
            f"{_fmt_rate(lp.bandwidth, 'B/s')}, {lp.latency * 1e6:.3g} us",
        )
    table.add_row("per-op overhead", f"{g.kernel_launch_s * 1e6:.3g} us")
    table.add_row("per-layer overhead", f"{g.per_layer_overhead_s * 1e6:.3g} us")
    _engine_rows(table, profile, report)
    if steady.load is not None:
        load = steady.load
        table.add_row("CPU to others / steal meanwhile", f"{load.others:.1%} / {load.steal:.1%}")
    table.add_row(
        "reference workload start / end",
        f"{steady.ref0 * 1e3:.4g} / {steady.ref1 * 1e3:.4g} ms",
    )
    return table


def _engine_rows(table: Table, profile: Profile, report: dict[str, float]) -> None:
    """Add the op floor and the engine's fitted terms (and the fit's error, where
    ``report`` has it) to ``table``; nothing when the profile has no engine terms."""
    eng = profile.ops.engine if profile.ops is not None else None
    if profile.ops is None or eng is None:
        return
    rl = profile.ops.roofline
    table.add_row("op floor (untabled ops)", f"{rl.op_floor_s * 1e6:.3g} us")
    table.add_row(
        "engine: iteration overhead (measured, decode)",
        f"{rl.iteration_overhead_s * 1e6:.3g} us",
    )
    table.add_row(
        "engine: overhead per prompt token",
        f"{eng.prompt_overhead_s_per_token * 1e6:.3g} us",
    )
    table.add_row("engine: per-layer overhead", f"{eng.layer_overhead_s * 1e6:.3g} us")
    table.add_row("engine: serving-loop gap", f"{eng.iter_gap_s * 1e6:.3g} us")
    table.add_row("engine: extra after idle", f"{eng.wake_s * 1e6:.3g} us")
    table.add_row("engine: copy contention", f"{eng.copy_contention:.3g}")
    table.add_row(
        "engine: compute lost per prefetched MB",
        f"{eng.prefetch_compute_s_per_byte * 1e12:.3g} us",
    )
    if eng.copy_contention_knots:
        table.add_row(
            "engine: copy contention, by HBM weight cache",
            ", ".join(f"{x / 2**20:.3g} MiB: {y:.3g}" for x, y in eng.copy_contention_knots),
        )
    if eng.prefetch_compute_knots:
        table.add_row(
            "engine: compute lost per prefetched MB, by HBM weight cache",
            ", ".join(
                f"{x / 2**20:.3g} MiB: {y * 1e12:.3g} us" for x, y in eng.prefetch_compute_knots
            ),
        )
    table.add_row("engine: prefetch hand-off", f"{eng.prefetch_handoff_s * 1e6:.3g} us")
    if report:
        table.add_row(
            "engine: overhead by least squares (evidence)",
            f"{report['raw_iteration_overhead_s'] * 1e6:.3g} us",
        )
        from hwbench.engine_fit import furthest_ops

        ratios = {
            k.removeprefix("op_ratio."): v for k, v in report.items() if k.startswith("op_ratio.")
        }
        if ratios:
            table.add_row("op tables / ops timed in place (furthest)", furthest_ops(ratios))
        table.add_row(
            "engine fit error (RMS / max)",
            f"{report['rms_rel_error']:.1%} / {report['max_rel_error']:.1%}",
        )


def _warn(steady: _Steadiness) -> None:
    """Warn on stderr when the machine was not quiet meanwhile (other processes or steal)."""
    from hwbench.quiet import warning

    note = warning(steady.load, "calibration")
    if note is not None:
        err_console.print(f"[yellow]warning:[/] {note}")
