"""``pdsim scenarios``: the scenarios shipped with pdsim -- list, show, copy."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from engine.errors import InputError
from pdsim.cli.common import check_out_dir, console, user_errors

app = typer.Typer(
    rich_markup_mode=None,
    help="The scenarios shipped with pdsim: list them, show one, copy one to edit.",
    no_args_is_help=True,
)


def _shipped(name: str) -> Path:
    from sim.shipped import shipped_path, shipped_scenarios

    p = shipped_path(name)
    if p is None:
        raise InputError(
            f"scenario {name!r}: not a shipped scenario; shipped: {', '.join(shipped_scenarios())}"
        )
    return p


def _description(p: Path) -> str:
    import yaml

    try:
        data = yaml.safe_load(p.read_text("utf-8"))
    except yaml.YAMLError:
        return ""
    if not isinstance(data, dict):
        return ""
    if "description" in data:
        return str(data["description"])
    if "scenario" in data:  # a plan file
        return f"plan over {data['scenario']}"
    return ""


@app.command("list")
def list_() -> None:
    """List the shipped scenarios with their descriptions (run one: pdsim run NAME)."""
    from sim.shipped import SHIPPED_DIR, shipped_scenarios

    t = Table(header_style="bold", title="shipped scenarios")
    t.add_column("name")
    t.add_column("description")
    for name in shipped_scenarios():
        t.add_row(name, _description(SHIPPED_DIR / f"{name}.yaml"))
    console.print(t)


@app.command("show")
def show(name: Annotated[str, typer.Argument(metavar="NAME", help="A shipped scenario.")]) -> None:
    """Print a shipped scenario's YAML."""
    with user_errors():
        p = _shipped(name)
    typer.echo(p.read_text("utf-8"), nl=False)


@app.command("copy")
def copy(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A shipped scenario.")],
    folder: Annotated[
        Path, typer.Argument(metavar="DIR", help="Folder to copy it into (created if missing).")
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", help="Replace a file of the same name in DIR.")
    ] = False,
) -> None:
    """Copy a shipped scenario into DIR to edit it; a plan file brings its scenario along."""
    import yaml

    with user_errors():
        p = _shipped(name)
        check_out_dir(folder, "DIR")
        files = [p]
        data = yaml.safe_load(p.read_text("utf-8"))
        if isinstance(data, dict) and isinstance(data.get("scenario"), str):
            from sim.shipped import shipped_path

            dep = shipped_path(data["scenario"])
            if dep is not None:
                files.append(dep)
        targets = [folder / f.name for f in files]
        clash = [t for t in targets[:1] if t.exists()] if not force else []
        if clash:
            raise InputError(f"DIR {folder}: {clash[0].name} exists; use --force to replace it")
        folder.mkdir(parents=True, exist_ok=True)
    for f, t in zip(files, targets, strict=True):
        if t.exists() and t != targets[0]:
            continue  # a plan's scenario already there: the user's copy is kept
        shutil.copyfile(f, t)
        console.print(str(t))
