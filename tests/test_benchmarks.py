"""Every benchmark script imports against the current package layout and has a ``main``.

The benchmarks run outside the test tiers (they measure, tests assert), so a rename in the
packages would otherwise break one silently until someone runs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_the_benchmarks_folder_is_found() -> None:
    assert len(BENCHMARKS) >= 8


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_imports_and_has_main(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs the imports, not main()
    assert callable(getattr(module, "main", None))
