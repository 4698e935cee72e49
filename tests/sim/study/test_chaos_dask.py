"""Chaos runs on several workers get their Dask client from the project's one helper
(``sim.study.sweep.daskclient.dask_client``): without the ``dist`` extra they stop with one line
naming it (issue 41)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.scenario import load_scenario
from sim.study.chaos import run_chaos
from sim.study.sweep import daskclient

ROOT = Path(__file__).resolve().parents[3]


def _without_dask(monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry makes ``from dask.distributed import ...`` raise ImportError
    monkeypatch.setitem(sys.modules, "dask.distributed", None)


def test_run_chaos_without_the_dist_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_dask(monkeypatch)
    sc = load_scenario(ROOT / "scenarios" / "chaos-partition.yaml")
    with pytest.raises(InputError) as err:
        run_chaos(sc, [1, 2], workers=2)
    msg = str(err.value)
    assert msg.startswith("--workers 2: " + daskclient.DIST_MISSING)
    assert daskclient.DIST_HINT in msg and "\n" not in msg
    with pytest.raises(InputError, match=r"^--scheduler tcp://127\.0\.0\.1:1: runs on several"):
        run_chaos(sc, [1], scheduler="tcp://127.0.0.1:1")


def test_run_chaos_asks_the_one_helper_for_its_client(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, str | None]] = []

    def refuse(workers: int, scheduler: str | None = None) -> None:
        asked.append((workers, scheduler))
        raise InputError("no client here")

    monkeypatch.setattr(daskclient, "dask_client", refuse)
    sc = load_scenario(ROOT / "scenarios" / "chaos-partition.yaml")
    with pytest.raises(InputError, match="no client here"):
        run_chaos(sc, [1, 2, 3], workers=3)
    assert asked == [(3, None)]


def test_pdsim_chaos_without_the_dist_extra_prints_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without_dask(monkeypatch)
    out = tmp_path / "chaos"
    r = CliRunner().invoke(
        app, ["chaos", "chaos-partition", "--seeds", "1-2", "--workers", "2", "--out", str(out)]
    )
    assert r.exit_code == 2, r.output
    assert (
        r.output == f"error: --workers 2: {daskclient.DIST_MISSING}; run with --workers 1, "
        f"or install it: {daskclient.DIST_HINT}\n"
    )
    assert not out.exists()
