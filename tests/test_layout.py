"""The layout rules of CONTRIBUTING.md ("Where code goes") that ruff and import-linter do not
check: module length and unique module names."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sim", "hwbench", "pdsim")
MAX_LINES = 500
# names allowed more than once: a family's base class module, and the command modules of
# pdsim/cli, each named after the library module it drives
SHARED_NAMES = {"__init__.py", "base.py"}


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_module_names_are_unique_outside_the_command_line() -> None:
    seen: defaultdict[str, list[str]] = defaultdict(list)
    for p in _modules():
        if p.name not in SHARED_NAMES and "cli" not in p.relative_to(ROOT).parts:
            seen[p.name].append(str(p.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
