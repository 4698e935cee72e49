"""Random-fault seeds on a small cluster: zero violations, determinism, replay round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdsim.cli import app
from sim.study.chaos import aggregate, run_chaos
from sim.study.recording import load_replay, replay

from .conftest import DATA, small


def _describe(rows: list[dict]) -> str:
    return "\n".join(f"seed {r['seed']}: {r['violations']}" for r in rows if not r["ok"])


def test_200_random_fault_seeds_have_no_violations() -> None:
    rows = run_chaos(small(), list(range(200)))
    agg = aggregate(rows)
    assert not agg["failing_seeds"], _describe(rows)
    # the faults really happened and the run still served traffic
    assert agg["faults_applied"] > 200 * 4
    assert agg["mean_availability"] is not None and agg["mean_availability"] > 0.9
    kinds = {a["kind"] for r in rows[:40] for a in _applied(r["seed"])}
    assert {"kill", "partition", "corrupt", "restart", "heal"} <= kinds


def _applied(seed: int) -> list[dict]:
    from sim.study.chaos import chaos_scenario
    from sim.study.recording import run_checked

    return run_checked(chaos_scenario(small()), seed).applied


def test_20_seeds_rerun_give_identical_trace_hashes() -> None:
    seeds = list(range(1000, 1020))
    a = [r["trace_hash"] for r in run_chaos(small(), seeds)]
    b = [r["trace_hash"] for r in run_chaos(small(), seeds)]
    assert a == b
    assert len(set(a)) == 20


def test_replay_round_trip_via_cli(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    r = CliRunner().invoke(
        app,
        [
            "chaos",
            str(DATA / "chaos-small.yaml"),
            "--seeds",
            "3-4",
            "--out",
            str(out),
            "--all-replays",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "chaos.json").read_text())
    assert [s["seed"] for s in summary["seeds"]] == [3, 4]
    f = out / "replays" / "chaos-small-seed-3.replay.json"
    rec, sc = load_replay(f)
    assert rec["seed"] == 3 and rec["faults_applied"] and rec["package_version"]
    assert sc.faults.random.enabled
    r = CliRunner().invoke(app, ["replay", str(f)])
    assert r.exit_code == 0, r.output
    assert f"trace hash matches: {rec['trace_hash']}" in r.output
    # a tampered record does not match
    rec["trace_hash"] = "0" * 32
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(rec))
    r = CliRunner().invoke(app, ["replay", str(bad)])
    assert r.exit_code == 1 and "MISMATCH" in r.output


def test_replay_until_dumps_the_state(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    run_chaos(small(), [5], replay_dir=out, all_replays=True)
    f = out / "chaos-small-seed-5.replay.json"
    rep = replay(f, until=1.0)
    st = rep.outcome.state
    assert st is not None and st["time"] == pytest.approx(1.0)
    assert rep.schedule_matches
    assert len(st["raft"]) == 3 and {"term", "role", "alive"} <= set(st["raft"][0])
    assert all(a["at"] <= 1.0 for a in st["applied"])
    r = CliRunner().invoke(app, ["replay", str(f), "--until", "1.0"])
    assert r.exit_code == 0 and '"leader"' in r.output


@pytest.mark.slow
def test_2000_random_fault_seeds_have_no_violations() -> None:
    rows = run_chaos(small(), list(range(2000)), workers=2)
    assert not aggregate(rows)["failing_seeds"], _describe(rows)


def test_dask_workers_give_the_same_rows_as_in_process(tmp_path: Path) -> None:
    seeds = [1, 2, 3, 4]
    local = run_chaos(small(), seeds)
    dist = run_chaos(small(), seeds, workers=2)
    key = ["seed", "ok", "trace_hash", "availability", "faults"]
    assert [[r[k] for k in key] for r in dist] == [[r[k] for k in key] for r in local]
