"""The ``pdsim`` command line: one typer app, one module per command group.

Every command turns :class:`engine.errors.InputError` (bad user input) into a one-line red
message on stderr and exit status 2, via :func:`sim.cli.common.user_errors`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from sim.cli import ab as _ab
from sim.cli import cache as _cache
from sim.cli import calibrate as _calibrate
from sim.cli import chaos as _chaos
from sim.cli import plan as _plan
from sim.cli import replay as _replay
from sim.cli import run as _run
from sim.cli import scenarios as _scenarios
from sim.cli import sweep as _sweep
from sim.cli import validate as _validate

app = typer.Typer(
    name="pdsim",
    help=(
        "Simulate a parameter/data-separated inference cluster, replay cache traces, and "
        "calibrate the simulator against a real engine."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(_cache.app, name="cache")
app.add_typer(_scenarios.app, name="scenarios")
app.command("run")(_run.run)
app.command("sweep")(_sweep.sweep)
app.command("ab")(_ab.ab)
app.command("plan")(_plan.plan)
app.command("calibrate")(_calibrate.calibrate)
app.command("validate")(_validate.validate)
app.command("chaos")(_chaos.chaos)
app.command("replay")(_replay.replay)


def _version_callback(value: bool) -> None:
    if value:
        try:
            v = version("pdsim")
        except PackageNotFoundError:  # running from a source tree that was not installed
            v = "unknown (not installed)"
        typer.echo(f"pdsim {v}")
        raise typer.Exit()


@app.callback()
def _root(
    version_: bool = typer.Option(
        False,
        "--version",
        callback=_version_callback,
        is_eager=True,
        help="Print the pdsim version and exit.",
    ),
) -> None:
    """pdsim: a discrete-event simulator of PD-separated inference clusters."""


def main() -> None:
    """Console-script entry point."""
    app()
