"""setuptools hook of the optional compiled build (``docs/native-build.md``).

Everything about the package is in ``pyproject.toml``; this file only adds the extensions.
With ``PDSIM_COMPILE=1`` the modules named in ``engine/native.py`` (``COMPILED``) are
compiled with mypyc; without it there are none and the package is plain Python. The build
backend (``buildtools/pdsim_build.py``) validates the variable and brings mypy.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _compiled_modules() -> tuple[str, ...]:
    """``COMPILED`` of ``engine/native.py``, loaded by path (the build environment has no
    NumPy, so the ``engine`` package itself is not imported)."""
    spec = importlib.util.spec_from_file_location("_pdsim_native", HERE / "engine" / "native.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return tuple(mod.COMPILED)


def _ext_modules() -> list[Any]:
    flag = os.environ.get("PDSIM_COMPILE", "0")
    if flag in ("", "0"):
        return []
    if flag != "1":
        sys.exit(f"PDSIM_COMPILE={flag!r}: allowed values are 0 and 1")
    from mypyc.build import mypycify

    paths = [str(Path(*name.split("."))) + ".py" for name in _compiled_modules()]
    exts = mypycify(paths, opt_level="3")
    if sys.platform != "win32":
        # No fused multiply-add contraction: every float operation rounds as CPython's does,
        # so a compiled run keeps the plain run's event times and trace hash bit for bit.
        for ext in exts:  # a new list each: mypycify's extensions share one
            ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
    return list(exts)


setup(ext_modules=_ext_modules())
