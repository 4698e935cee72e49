"""``pdsim model import``: a Hugging Face ``config.json`` as a model-catalogue entry.

``pdsim model import CONFIG.json --name NAME [--dtype bf16|fp8] [--out FILE]`` reads the
config (:func:`sim.serving.hfconfig.entry_from_config`) and prints a complete catalogue file
holding the one entry, or with ``--out`` writes it: a new file is created; an existing
catalogue file gets the entry appended to its ``models:`` list (its other text, comments
included, is kept); anything else at ``FILE`` -- a file that is not a catalogue, a catalogue
that already has a model called NAME, or one whose list cannot be appended to (flow style) --
is an error and nothing is written. The file (or the config itself) then goes to
``--models`` or a scenario's ``catalogue:``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.errors import InputError
from pdsim.cli.common import check_out_file, console, user_errors

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)


@app.command("import")
def import_config(
    config: Annotated[Path, typer.Argument(help="A Hugging Face config.json.")],
    name: Annotated[str, typer.Option("--name", "-n", help="Model name in the catalogue.")],
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="bf16 or fp8 weights (default: fp8 for an fp8 checkpoint, else bf16)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Catalogue YAML to create or append to (default: print)."),
    ] = None,
) -> None:
    """Print (or write) a catalogue entry read from a Hugging Face config.json."""
    from engine.configfile import read_mapping
    from sim.serving.hfconfig import catalogue_text, entry_from_config

    with user_errors():
        if out is not None:
            check_out_file(out)
        raw = read_mapping(config, "Hugging Face config", fmt="json")
        entry = entry_from_config(raw, name, dtype=dtype, source=str(config))
        if out is None:
            typer.echo(catalogue_text([entry]), nl=False)
            return
        text = _appended(out, entry) if out.exists() else catalogue_text([entry])
        out.write_text(text, encoding="utf-8")
    console.print(f"{name}: {entry['notes']}", markup=False)
    console.print(f"wrote {out}", markup=False)


def _appended(out: Path, entry: dict[str, object]) -> str:
    """The text of the existing catalogue ``out`` with ``entry`` appended; :class:`InputError`
    naming ``--out`` when ``out`` is not a catalogue, already names the model, or cannot be
    appended to."""
    from sim.serving.hfconfig import append_text
    from sim.serving.models import parse_catalogue

    try:
        old = out.read_text(encoding="utf-8")
        before = list(parse_catalogue(old, str(out)))
    except (OSError, UnicodeDecodeError, InputError) as err:
        raise InputError(
            f"--out {out}: exists and is not a model catalogue ({err}); give a new file "
            "or a catalogue to append to"
        ) from None
    if entry["name"] in before:
        raise InputError(f"--out {out}: already has a model named {entry['name']!r}")
    text = append_text(old, entry)
    try:
        after = list(parse_catalogue(text, str(out)))
    except InputError:
        after = []
    if after != [*before, entry["name"]]:
        raise InputError(
            f"--out {out}: cannot append to its models list (write it in block style, one "
            "'- name:' item per model)"
        )
    return text
