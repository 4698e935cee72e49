"""The one array-backend switch: NumPy on a CPU, CuPy on a GPU (ARCHITECTURE contract 4).

Array code never imports an array library by name except NumPy; it takes the module it works
with (``xp``) from :func:`get_backend` or from the arrays it was handed. This is the **only**
module in pdsim that imports ``cupy``, and it does so lazily, inside functions, so importing
``engine.backend`` on a machine without CuPy costs nothing and never fails.

Contract:

* ``get_backend("numpy")`` returns ``numpy``.
* ``get_backend("cupy")`` returns ``cupy`` if it is importable **and** at least one CUDA device
  is visible; otherwise it raises :class:`BackendUnavailable` whose message says which of the
  two was missing (and the underlying error).
* ``get_backend("auto")`` returns ``cupy`` when ``get_backend("cupy")`` would succeed, else
  ``numpy``; it never raises for a missing GPU.
* Any other name raises :class:`engine.errors.InputError` naming the allowed values.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Literal, get_args

import numpy as np

from engine.errors import InputError

BackendName = Literal["auto", "numpy", "cupy"]
BACKEND_NAMES: tuple[str, ...] = get_args(BackendName)

__all__ = [
    "BACKEND_NAMES",
    "BackendName",
    "BackendUnavailable",
    "cupy_status",
    "get_backend",
    "gpu_kernels",
    "is_gpu",
    "name",
    "to_numpy",
]


class BackendUnavailable(RuntimeError):
    """The requested array backend cannot run on this machine; the message says why."""


def cupy_status() -> tuple[ModuleType | None, str]:
    """Try to make CuPy usable. Returns ``(cupy, "ok")`` or ``(None, reason)``.

    The reason is one line a user can act on: CuPy not importable (and the import error), or
    importable but no CUDA device (and the driver's answer).
    """
    try:
        cupy = importlib.import_module("cupy")
    except Exception as err:  # ImportError, or a broken CUDA install failing at import time
        return None, f"cupy is not importable ({type(err).__name__}: {err}); install pdsim[gpu]"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # CUDARuntimeError when no driver / no device
        return None, f"cupy is installed but no CUDA device is usable ({type(err).__name__}: {err})"
    if count < 1:
        return None, "cupy is installed but no CUDA device is present (device count 0)"
    return cupy, "ok"


def get_backend(name: BackendName | str = "auto") -> ModuleType:
    """Return the array module for ``name`` ("auto", "numpy" or "cupy"); see the module doc."""
    if name not in BACKEND_NAMES:
        raise InputError(
            f"unknown array backend {name!r}; allowed: {', '.join(BACKEND_NAMES)}",
            where="backend",
        )
    if name == "numpy":
        return np
    cupy, reason = cupy_status()
    if cupy is not None:
        return cupy
    if name == "cupy":
        raise BackendUnavailable(f"backend 'cupy' requested but unavailable: {reason}")
    return np


def name(xp: ModuleType) -> str:
    """The backend's short name: ``"numpy"`` or ``"cupy"`` (the module's top-level name)."""
    return xp.__name__.split(".", 1)[0]


def is_gpu(xp: ModuleType) -> bool:
    """True when ``xp`` is the CuPy module (arrays made with it live on a GPU)."""
    return name(xp) == "cupy"


def to_numpy(x: Any) -> np.ndarray:
    """Copy or view ``x`` as a host NumPy array (``cupy.ndarray.get()`` for device arrays)."""
    getter = getattr(x, "get", None)
    if callable(getter) and not isinstance(x, np.ndarray):
        return np.asarray(getter())
    return np.asarray(x)


def gpu_kernels(xp: ModuleType) -> ModuleType:
    """Return ``engine.kv.gpu_kernels`` for the CuPy backend; refuse for any other backend.

    The kernel module holds CUDA source compiled through ``xp.RawKernel``; it is only loaded
    here so that nothing outside this switch decides to use the GPU.
    """
    if not is_gpu(xp):
        raise BackendUnavailable(f"GPU kernels need the cupy backend, not {name(xp)!r}")
    return importlib.import_module("engine.kv.gpu_kernels")
