"""Scenarios shipped inside the package (``sim/data/scenarios``, a copy of the repository's
``scenarios/`` that a test keeps identical), so an installed ``pdsim`` can run them by name.

:func:`resolve_scenario` turns what a user typed where a scenario file is expected into a
path: an existing file as given, else a shipped scenario's name (``quickstart`` or
``quickstart.yaml``); anything else is an :class:`~engine.errors.InputError` naming the
shipped scenarios.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import InputError

__all__ = ["SHIPPED_DIR", "resolve_scenario", "shipped_path", "shipped_scenarios"]

#: the folder of shipped scenario files inside the installed package
SHIPPED_DIR = Path(__file__).parent / "data" / "scenarios"


def shipped_scenarios() -> list[str]:
    """Names (file stems) of the shipped scenarios, sorted."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def shipped_path(name: str) -> Path | None:
    """The shipped file for ``name`` (with or without ``.yaml``), or ``None``."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if "/" in stem or "\\" in stem or not stem:
        return None
    p = SHIPPED_DIR / f"{stem}.yaml"
    return p if p.is_file() else None


def resolve_scenario(text: str | Path, what: str = "scenario") -> Path:
    """The scenario file for ``text``: an existing file, else a shipped scenario's name.
    :class:`InputError` for a folder or an unknown name (listing the shipped names)."""
    p = Path(text)
    if p.is_dir():
        raise InputError(f"{what} {p}: is a folder, not a scenario file (a .yaml file)")
    if p.is_file():
        return p
    shipped = shipped_path(str(text))
    if shipped is not None:
        return shipped
    raise InputError(
        f"{what} {text}: no such file and no shipped scenario of that name; shipped: "
        + ", ".join(shipped_scenarios())
    )
