"""The ``pdsim`` command line: one typer app, one module per command group.

Every command turns :class:`engine.errors.InputError` (bad user input) into a one-line red
message on stderr and exit status 2, via :func:`pdsim.cli.common.user_errors`; Ctrl-C ends
any of them with one line on stderr and exit status 130 (:func:`main`).
"""

from __future__ import annotations

import signal
import sys
from importlib.metadata import PackageNotFoundError, version

import typer

from engine.native import build_label
from pdsim.cli import ab as _ab
from pdsim.cli import cache as _cache
from pdsim.cli import calibrate as _calibrate
from pdsim.cli import chaos as _chaos
from pdsim.cli import cost as _cost
from pdsim.cli import frontier as _frontier
from pdsim.cli import model as _model
from pdsim.cli import plan as _plan
from pdsim.cli import profile as _profile
from pdsim.cli import replay as _replay
from pdsim.cli import run as _run
from pdsim.cli import scenarios as _scenarios
from pdsim.cli import sweep as _sweep
from pdsim.cli import validate as _validate


def _plain_argument_help() -> None:
    """Help shows an option's value as ``N``, ``PATH`` or its name in capitals, and an
    argument as its metavar alone (``SCENARIO``, ``[SWEEP_FILE]``), not
    ``{SCENARIO}`` in the usage line and ``SCENARIO <str>`` in the list, which this typer
    version prints; older versions lack these hooks and already print it plainly."""
    from typer.core import TyperArgument

    def usage_name(self: TyperArgument) -> str:
        name = str(self.metavar or self.name or "").upper()
        name = name if self.required or name.startswith("[") else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)

    def option_metavar(self: TyperOption, ctx: typer.Context) -> str | None:
        # an option without a metavar: N for a number, else its name in capitals (BACKEND),
        # never ``<str>`` / ``<int range>``; flags show none
        if self.metavar is not None or original is None:
            return original(self, ctx) if original is not None else self.metavar
        if self.is_flag or self.count:
            return None
        shown = str(original(self, ctx) or "")
        if "int" in shown or "float" in shown:
            return "N"
        if "path" in shown.lower():
            return "PATH"
        return str(self.name or "VALUE").upper().replace("_", "-")

    if original is not None:
        TyperOption.display_type_rich = option_metavar  # type: ignore[method-assign,assignment]
    if hasattr(TyperArgument, "display_type_rich"):
        TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
    if hasattr(TyperArgument, "_usage_display_name"):
        TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]


_plain_argument_help()

app = typer.Typer(
    rich_markup_mode=None,
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
app.add_typer(
    _scenarios.app, name="scenarios", short_help="List, show or copy the shipped scenarios."
)
# one short sentence per command for `pdsim --help` (click cuts a longer one at 45 characters)
app.command("run", short_help="Simulate a scenario; summary table and run folder.")(_run.run)
app.command("sweep", short_help="Runs over a grid of overrides x seeds, cached.")(_sweep.sweep)
app.command("ab", short_help="Paired A/B runs; B - A with bootstrap CIs.")(_ab.ab)
app.command("plan", short_help="Smallest cluster for a load, or highest load.")(_plan.plan)
app.command("frontier", short_help="tokens/s/GPU vs tokens/s/user, Pareto.")(_frontier.frontier)
app.command("calibrate", short_help="Measure this machine into a profile.")(_calibrate.calibrate)
app.command("validate", short_help="Real engine vs simulator, with errors.")(_validate.validate)
app.command("chaos", short_help="Random-fault seeds under the checkers.")(_chaos.chaos)
app.command("replay", short_help="Re-run a replay file; check its trace hash.")(_replay.replay)
app.command("cost", short_help="Step time of one iteration, op by op.")(_cost.cost)
app.add_typer(_profile.app, name="profile", short_help="Import measured op tables as a profile.")
app.add_typer(_model.app, name="model", short_help="Import a config.json as a catalogue model.")


def _version_callback(value: bool) -> None:
    if value:
        try:
            v = version("pdsim")
        except PackageNotFoundError:  # running from a source tree that was not installed
            v = "unknown (not installed)"
        typer.echo(f"pdsim {v}, build: {build_label()}")  # python, or mypyc (docs/native-build.md)
        raise typer.Exit()


@app.callback()
def _root(
    version_: bool = typer.Option(
        False,
        "--version",
        callback=_version_callback,
        is_eager=True,
        help="Print the pdsim version and build (python or mypyc) and exit.",
    ),
) -> None:
    """pdsim: a discrete-event simulator of PD-separated inference clusters."""


def _on_interrupt(signum: int, frame: object) -> None:
    """SIGINT: say so on stderr, then stop as Python does (``KeyboardInterrupt``, which the
    CLI turns into exit status 130)."""
    sys.stderr.write("interrupted (Ctrl-C)\n")
    sys.stderr.flush()
    raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point. Ctrl-C ends any command with one line on stderr and exit
    status 130; Dask workers ignore it (their cluster is closed quietly by this process)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)
    app()
