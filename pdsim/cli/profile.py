"""``pdsim profile import aiconfigurator --system S --backend B``: write a profile with op tables.

Reads the measured GEMM, attention and all-reduce tables of the installed ``aiconfigurator``
package (``pip install -e '.[aic]'``) for one system and serving backend
(:mod:`sim.serving.opcost.aic_import`) and writes a pdsim profile JSON atomically (temporary file,
then rename); nothing is written on an error. Host, NVMe and object-store figures come from
a datasheet profile (``--base``; default: the matching shipped one).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from engine.errors import InputError
from pdsim.cli.common import check_out_file, console, out_path, user_errors

app = typer.Typer(help="Import profiles with measured op tables.", no_args_is_help=True)

SOURCES = ("aiconfigurator",)


@app.command("import")
def import_profile(
    source: Annotated[str, typer.Argument(help="Where the tables come from: aiconfigurator.")],
    system: Annotated[
        str, typer.Option("--system", help="aiconfigurator system, e.g. h200_sxm.")
    ] = "h200_sxm",
    backend: Annotated[
        str, typer.Option("--backend", help="Serving backend whose kernels were timed: vllm.")
    ] = "vllm",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            parser=out_path,
            help="Profile JSON to write. Default: profiles/<name>.json.",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Profile name. Default: <system>-<backend>, '_' -> '-'."),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option("--base", help="Datasheet profile for host/storage figures (name or file)."),
    ] = None,
    systems_dir: Annotated[
        Path | None,
        typer.Option("--systems-dir", help="Tables directory in the package's layout."),
    ] = None,
) -> None:
    """Write a pdsim profile from SOURCE's measured kernel tables."""
    from sim.serving.costmodel import load_profile
    from sim.serving.opcost.aic_import import import_aiconfigurator
    from sim.serving.opcost.profiles import OP_PROFILES

    with user_errors():
        if source not in SOURCES:
            raise InputError(
                f"profile source {source!r} not allowed; allowed: {', '.join(SOURCES)}"
            )
        pname = name or f"{system}-{backend}".replace("_", "-")
        path = out or Path("profiles") / f"{pname}.json"
        check_out_file(path)
        shipped_base = {sys_: b for sys_, b in OP_PROFILES.values()}
        base_profile = load_profile(base or shipped_base.get(system, "h200-sxm"))
        profile = import_aiconfigurator(system, backend, base_profile, pname, systems_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(profile.model_dump_json() + "\n")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    ops = profile.ops
    assert ops is not None
    console.print(
        f"wrote {path}: {len(ops.gemm)} GEMM, {len(ops.attention)} attention, "
        f"{len(ops.all_reduce)} collective, {len(ops.moe)} MoE and {len(ops.mla)} MLA tables "
        f"({path.stat().st_size / 1e6:.2f} MB)"
    )
