"""Every single run writes a replay file that `pdsim replay` reproduces bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdsim.cli import app
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.study.recording import replay

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("quickstart.yaml", ["workload.requests=60"]),
        ("chaos-partition.yaml", ["workload.requests=80"]),
    ],
)
def test_run_folder_replay_matches(tmp_path: Path, name: str, overrides: list[str]) -> None:
    sc = load_scenario(SCENARIOS / name, overrides)
    result = run_scenario(sc, seed=5, out_dir=tmp_path)
    assert result.out_dir is not None
    rec = json.loads((result.out_dir / "replay.json").read_text())
    assert rec["trace_hash"] == result.trace_hash
    assert rec["seed"] == 5
    report = replay(result.out_dir / "replay.json")
    assert report.matches, (report.expected, report.got, report.schedule_matches)


def test_tampered_run_replay_reports_mismatch(tmp_path: Path) -> None:
    sc = load_scenario(SCENARIOS / "quickstart.yaml", ["workload.requests=40"])
    result = run_scenario(sc, seed=1, out_dir=tmp_path)
    assert result.out_dir is not None
    path = result.out_dir / "replay.json"
    rec = json.loads(path.read_text())
    rec["seed"] = 2  # a different seed gives a different event trace
    path.write_text(json.dumps(rec))
    out = CliRunner().invoke(app, ["replay", str(path)])
    assert out.exit_code == 1, out.output
