"""The test-only planted Raft bug (a leader commits an earlier term's entry by counting
replicas, figure 8) is caught by the cluster's checkers within 200 random-fault seeds of the
raft-stress scenario, and the failing seed's replay file reproduces the violation."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenario import Scenario, load_scenario
from sim.study.chaos import aggregate, run_chaos
from sim.study.recording import replay

from .conftest import SCEN

RAFT_PROPS = {
    "Commit Rule",
    "Leader Completeness",
    "State Machine Safety",
    "Acknowledged write lost",
}


def _stress(*extra: str) -> Scenario:
    return load_scenario(
        SCEN / "raft-stress.yaml", ["faults.raft.replicas=3", "faults.schedule=[]", *extra]
    )


def test_planted_bug_is_caught_within_200_seeds(tmp_path: Path) -> None:
    sc = _stress("faults.raft.unsafe_commit_old_terms=true")
    caught = None
    for seed in range(200):
        (row,) = run_chaos(sc, [seed], replay_dir=tmp_path)
        if not row["ok"]:
            caught = row
            break
    assert caught is not None, "the figure 8 bug went unnoticed in 200 seeds"
    assert any(p in caught["violations"][0] for p in RAFT_PROPS), caught["violations"]
    # the run stopped at the violation and its replay reproduces it bit for bit
    rep = replay(caught["replay"])
    assert rep.matches and rep.outcome.findings[0] == caught["violations"][0]


def test_the_same_seeds_are_clean_without_the_bug() -> None:
    rows = run_chaos(_stress(), list(range(40)))
    assert not aggregate(rows)["failing_seeds"]


@pytest.mark.slow
def test_planted_bug_caught_repeatedly_and_clean_stress_seeds() -> None:
    bad = run_chaos(_stress("faults.raft.unsafe_commit_old_terms=true"), list(range(300)))
    assert len(aggregate(bad)["failing_seeds"]) >= 3
    good = run_chaos(_stress(), list(range(1000)), workers=2)
    assert not aggregate(good)["failing_seeds"]


def test_pdsim_run_stops_on_a_violation_with_a_report_and_replay_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pdsim.cli import app

    args = [
        "run",
        str(SCEN / "raft-stress.yaml"),
        "--seed",
        "7",
        "--out",
        str(tmp_path),
        "--quiet",
        *("--set", "faults.raft.replicas=3", "--set", "faults.schedule=[]"),
        *("--set", "faults.random.enabled=true"),
        *("--set", "faults.raft.unsafe_commit_old_terms=true"),
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1, r.output
    assert "checker violation" in r.output and "replay file" in r.output
    (f,) = tmp_path.glob("*.replay.json")
    rep = replay(f)
    assert rep.matches and rep.outcome.findings
