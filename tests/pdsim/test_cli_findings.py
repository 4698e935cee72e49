"""The findings of a new user's run of every command (issue 41, item 7)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdsim.cli.plan import _with_options
from sim.study.planspec import plan_from_file

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SCEN = ROOT / "scenarios"


def test_p99_option_replaces_the_files_e2e_p99_limit_in_either_spelling() -> None:
    path = SCEN / "plan-llama70b-h200.yaml"  # its limit is written slo.e2e.p99
    spec, _ = plan_from_file(path)
    assert spec.slo.limits() == [("e2e", "p99", "all", 5.0)]
    new = _with_options(spec, path, None, None, None, None, ["all=10s"])
    assert new.slo.limits() == [("e2e", "p99", "all", 10.0)]
    path = SCEN / "plan-quickstart.yaml"  # its limit is written slo.p99
    spec, _ = plan_from_file(path)
    new = _with_options(spec, path, None, None, None, None, ["all=7s"])
    assert new.slo.limits() == [("e2e", "p99", "all", 7.0)]
