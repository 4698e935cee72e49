"""PEP 517 build backend: setuptools, plus the compiled build's needs when PDSIM_COMPILE=1.

A plain build (``pip install .`` or ``pip install -e .``) is setuptools' own. With
``PDSIM_COMPILE=1`` a wheel build also asks for mypy (its mypyc compiles the modules listed in
``engine/native.py``, see ``setup.py``) and for the project's own dependencies
(``pyproject.toml``): mypyc type-checks everything the compiled modules import, and pydantic,
NumPy and SimPy must be there for their types to be known. An editable install cannot be
compiled: the extensions would shadow the sources they were built from, so an edit would
silently not run; it is refused with the command to use instead.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (re-exported hooks, unchanged)
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

#: the compiler a compiled wheel build needs besides setuptools (and the project's dependencies)
COMPILER = "mypy>=1.11"


def compile_requires() -> list[str]:
    """What a compiled wheel build installs: mypy and the dependencies ``pyproject.toml``
    lists (the build runs in the project's folder)."""
    with Path("pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [COMPILER, *deps]


def compile_requested() -> bool:
    """Whether ``PDSIM_COMPILE`` asks for the compiled build; SystemExit naming the allowed
    values when it holds anything but ``0``, ``1`` or nothing."""
    value = os.environ.get("PDSIM_COMPILE", "0")
    if value not in ("", "0", "1"):
        raise SystemExit(
            f"PDSIM_COMPILE={value!r}: allowed values are 0 (plain Python, the default) "
            "and 1 (compile the simulator's hot modules with mypyc)"
        )
    return value == "1"


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    # Compiled: setuptools' own hook would run setup.py, which needs mypyc, before anything
    # asked for it is installed; the project has no setup_requires, so the list is complete.
    if compile_requested():
        return compile_requires()
    return list(_setuptools.get_requires_for_build_wheel(config_settings))


def _refuse_compiled_editable() -> None:
    if compile_requested():
        raise SystemExit(
            "PDSIM_COMPILE=1 builds a wheel, not an editable install: run "
            "`PDSIM_COMPILE=1 pip install .` (without -e), or unset PDSIM_COMPILE"
        )


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    _refuse_compiled_editable()
    return list(_setuptools.get_requires_for_build_editable(config_settings))


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _refuse_compiled_editable()
    return str(_setuptools.build_editable(wheel_directory, config_settings, metadata_directory))
