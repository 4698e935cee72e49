"""Chaos and replay findings of a new user (issue 41, item 7): `--until` at a fault and past
the end, a later run into the same folder."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pdsim.cli import app
from sim.study.chaos import run_chaos
from sim.study.recording import load_replay, replay

from .conftest import DATA, small


def test_until_at_a_fault_and_past_the_end_matches_the_schedule(tmp_path: Path) -> None:
    run_chaos(small(), [5], replay_dir=tmp_path, all_replays=True)
    f = tmp_path / "chaos-small-seed-5.replay.json"
    rec, _ = load_replay(f)
    at = [a["at"] for a in rec["faults_applied"]]
    t = at[len(at) // 2]  # a fault fires exactly at T: it is applied, as recorded
    rep = replay(f, until=t)
    assert rep.schedule_matches
    assert rep.outcome.state is not None and rep.outcome.sim_time == t
    assert len(rep.outcome.state["applied"]) == sum(a <= t for a in at)
    end = rec["sim_time"] + 100.0  # past the end: the whole run, every fault
    rep = replay(f, until=end)
    assert rep.schedule_matches and rep.outcome.sim_time < end
    assert rep.outcome.state is not None and len(rep.outcome.state["applied"]) == len(at)
    r = CliRunner().invoke(app, ["replay", str(f), "--until", str(end)])
    assert r.exit_code == 0, r.output
    assert f"before --until {end:g}; fault schedule so far matches" in " ".join(r.output.split())


def test_a_later_chaos_run_keeps_earlier_seeds_and_all_replays_fills_in(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    base = ["chaos", str(DATA / "chaos-small.yaml"), "--out", str(out)]
    r = CliRunner().invoke(app, [*base, "--seeds", "3-4"])
    assert r.exit_code == 0, r.output
    assert not (out / "replays").exists()
    r = CliRunner().invoke(app, [*base, "--seeds", "3-3", "--all-replays"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "chaos.json").read_text())
    assert [s["seed"] for s in report["seeds"]] == [3, 4] and report["totals"]["seeds"] == 2
    assert [p.name for p in (out / "replays").iterdir()] == ["chaos-small-seed-3.replay.json"]
