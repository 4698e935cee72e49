"""setuptools hook of the optional compiled build (``docs/native-build.md``).

Everything about the package is in ``pyproject.toml``; this file only adds the extensions.
With ``PDSIM_COMPILE=1`` the modules named in ``engine/native.py`` (``COMPILED``) are
compiled with mypyc; without it there are none and the package is plain Python. The build
backend (``buildtools/pdsim_build.py``) brings mypy, and its ``compile_requested`` reads the
variable here too (``python setup.py build_ext`` runs without the backend).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _load(relpath: str) -> Any:
    """A module of the tree loaded by path: the build environment has no NumPy, so the
    ``engine`` package itself is not imported, and ``buildtools`` is on the path only when
    pip runs the backend."""
    name = "_pdsim_" + Path(relpath).stem
    spec = importlib.util.spec_from_file_location(name, HERE / relpath)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ext_modules() -> list[Any]:
    # the backend's check: exits naming the allowed values for anything but 0, 1 or unset
    if not _load("buildtools/pdsim_build.py").compile_requested():
        return []
    from mypyc.build import mypycify

    compiled = _load("engine/native.py").COMPILED
    paths = [str(Path(*name.split("."))) + ".py" for name in compiled]
    exts = mypycify(paths, opt_level="3")
    if sys.platform != "win32":
        # No fused multiply-add contraction: every float operation rounds as CPython's does,
        # so a compiled run keeps the plain run's event times and trace hash bit for bit.
        for ext in exts:  # a new list each: mypycify's extensions share one
            ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
    return list(exts)


setup(ext_modules=_ext_modules())
