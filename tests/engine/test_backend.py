"""engine.backend: the one NumPy/CuPy switch and its clear refusals."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

from engine import backend
from engine.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def _fake_cupy(device_count: int | Exception) -> types.ModuleType:
    mod = types.ModuleType("cupy")

    def get_device_count() -> int:
        if isinstance(device_count, Exception):
            raise device_count
        return device_count

    mod.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=get_device_count)
    )
    return mod


def _patch_import(monkeypatch: pytest.MonkeyPatch, result: types.ModuleType | Exception) -> None:
    real = backend.importlib.import_module

    def fake(name: str, *args: object) -> types.ModuleType:
        if name == "cupy":
            if isinstance(result, Exception):
                raise result
            return result
        return real(name, *args)

    monkeypatch.setattr(backend.importlib, "import_module", fake)


def test_numpy_is_always_available() -> None:
    assert backend.get_backend("numpy") is np
    assert backend.name(np) == "numpy"
    assert not backend.is_gpu(np)


def test_unknown_name_is_an_input_error_listing_allowed_values() -> None:
    with pytest.raises(InputError, match=r"unknown array backend 'torch'.*auto, numpy, cupy"):
        backend.get_backend("torch")


def test_cupy_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_import(monkeypatch, ImportError("No module named 'cupy'"))
    assert backend.get_backend("auto") is np
    with pytest.raises(backend.BackendUnavailable, match="not importable"):
        backend.get_backend("cupy")


def test_cupy_without_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_import(monkeypatch, _fake_cupy(RuntimeError("cudaErrorNoDevice")))
    assert backend.get_backend("auto") is np
    with pytest.raises(backend.BackendUnavailable, match=r"no CUDA device.*cudaErrorNoDevice"):
        backend.get_backend("cupy")
    _patch_import(monkeypatch, _fake_cupy(0))
    with pytest.raises(backend.BackendUnavailable, match="device count 0"):
        backend.get_backend("cupy")


def test_cupy_with_device_is_chosen_by_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_cupy(1)
    _patch_import(monkeypatch, fake)
    assert backend.get_backend("auto") is fake
    assert backend.get_backend("cupy") is fake
    assert backend.is_gpu(fake)
    assert backend.name(fake) == "cupy"


def test_to_numpy_uses_get_for_device_arrays() -> None:
    a = np.arange(6.0).reshape(2, 3)
    assert backend.to_numpy(a) is a

    class DeviceArray:
        def get(self) -> np.ndarray:
            return a + 1

    np.testing.assert_array_equal(backend.to_numpy(DeviceArray()), a + 1)
    np.testing.assert_array_equal(backend.to_numpy([1, 2]), np.array([1, 2]))


def test_gpu_kernels_refused_on_numpy() -> None:
    with pytest.raises(backend.BackendUnavailable, match="cupy backend"):
        backend.gpu_kernels(np)


def test_only_the_backend_module_imports_cupy() -> None:
    """ARCHITECTURE contract 4: no package module other than engine/backend.py imports cupy."""
    pattern = re.compile(r"^\s*(import\s+cupy|from\s+cupy\b)", re.MULTILINE)
    offenders = []
    for pkg in ("engine", "sim", "hwbench"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == ROOT / "engine" / "backend.py":
                continue
            if pattern.search(path.read_text(encoding="utf-8")):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
