"""A tiny scenario (one small decoder, a handful of requests; ~0.1 s per run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenario_text import tiny_scenario

TINY = tiny_scenario(variants={"big": {"cluster.servers": 4}})


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """Path of the tiny scenario file (in a fresh temporary folder)."""
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY, encoding="utf-8")
    return p
