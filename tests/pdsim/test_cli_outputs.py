"""Where the CLI writes and how it exits (issue 20, items 1-5): ``--out`` is checked before any
work, results are named by what produced them and never overwrite another result, files follow
the user's umask, chaos keeps finished seeds when interrupted, validate writes under runs/."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from pdsim.cli import app
from pdsim.cli.common import result_name
from tests.scenario_text import tiny_scenario

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
CHAOS_SMALL = ROOT / "tests" / "sim" / "control" / "faults" / "data" / "chaos-small.yaml"

TINY = tiny_scenario()
PLAN = """\
scenario: tiny.yaml
seeds: 1
slo: {p99: {all: 10s}}
size_key: cluster.servers
size_range: [1, 4]
qps_key: workload.rate
sizes: [2]
qps_range: [5, 40]
qps_tolerance: 0.25
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working folder holding tiny.yaml and plan-tiny.yaml (default outputs land here)."""
    (tmp_path / "tiny.yaml").write_text(TINY, encoding="utf-8")
    (tmp_path / "plan-tiny.yaml").write_text(PLAN, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def _no_work(*_: Any, **__: Any) -> Any:
    raise AssertionError("work started although --out was unusable")


COMMANDS = {
    "run": (["run", "tiny.yaml"], "sim.runner.run_scenario"),
    "chaos": (["chaos", str(CHAOS_SMALL), "--seeds", "1"], "sim.study.chaos.run_chaos"),
    "sweep": (["sweep", "--scenario", "tiny.yaml", "--grid", "cluster.servers=1,2"], "sim.study.sweep.execute"),
    "ab": (["ab", "tiny.yaml", "--b", "cluster.servers=3", "--seeds", "2"], "sim.study.ab.run_ab"),
    "plan": (["plan", "plan-tiny.yaml"], "sim.study.plan.run_plan"),
    "validate": (["validate", "--profile", "a100-80gb"], "hwbench.validate.run_suite"),
}  # fmt: skip


@pytest.mark.parametrize("under", [False, True], ids=["is-a-file", "under-a-file"])
@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_out_at_a_file_exits_2_with_one_line_before_any_work(
    here: Path, monkeypatch: pytest.MonkeyPatch, cmd: str, under: bool
) -> None:
    args, work = COMMANDS[cmd]
    monkeypatch.setattr(work, _no_work)
    blocker = here / "taken"
    blocker.write_text("x")
    out = blocker / "sub" if under else blocker
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --out"), r.output
    assert ("is under" if under else "is a file") in lines[0]
    assert blocker.read_text() == "x" and sorted(p.name for p in here.iterdir()) == [
        "plan-tiny.yaml", "taken", "tiny.yaml",
    ]  # fmt: skip


def test_run_out_at_a_run_folder_exits_2_instead_of_nesting(here: Path) -> None:
    r = runner.invoke(app, ["run", "tiny.yaml", "--quiet"])
    assert r.exit_code == 0, r.output
    folder = Path(r.output.strip().splitlines()[-1])
    assert folder.parent == Path("runs") and folder.name.startswith("tiny-")
    before = sorted(p.name for p in folder.iterdir())
    assert "replay.json" in before
    r = runner.invoke(app, ["run", "tiny.yaml", "--quiet", "--out", str(folder)])
    assert r.exit_code == 2 and "is a run folder" in r.output
    assert sorted(p.name for p in folder.iterdir()) == before


@given(kind=st.sampled_from(["ab", "plan", "sweep", "chaos"]), stem=st.text(min_size=1))
def test_result_name_has_one_kind_prefix_and_safe_characters(kind: str, stem: str) -> None:
    name = result_name(kind, stem, "0123abcd")
    assert name.startswith(f"{kind}-") and name.endswith("-0123abcd")
    assert not name.startswith(f"{kind}-{kind}-") or stem.startswith(f"{kind}-{kind}-")
    assert all(ch.isalnum() or ch in "-_" for ch in name)
    assert result_name(kind, f"{kind}-x", "h") == f"{kind}-x-h"


def _ab(*extra: str) -> Any:
    args = ["ab", "tiny.yaml", "--a", "cluster.servers=2", "--seeds", "2", "--resamples", "100"]
    return runner.invoke(app, [*args, "--quiet", *extra])


def test_ab_results_are_named_by_their_inputs_and_never_overwritten(here: Path) -> None:
    r1 = _ab("--b", "cluster.servers=3")
    assert r1.exit_code == 0, r1.output
    r2 = _ab("--b", "cluster.servers=4")
    assert r2.exit_code == 0, r2.output
    folders = sorted((here / "runs").glob("ab-tiny-*"))
    assert len(folders) == 2, folders  # two A/Bs, two folders
    first = json.loads((folders[0] / "ab.json").read_text())
    assert {f.name for f in folders} == {
        f"ab-tiny-{json.loads((f / 'ab.json').read_text())['inputs_hash']}" for f in folders
    }
    assert (folders[0] / "ab.png").is_file()
    # the same A/B again reuses its folder; another A/B into it is refused (exit 2)
    other = "cluster.servers=4" if first["b"] == ["cluster.servers=3"] else "cluster.servers=3"
    text = (folders[0] / "ab.json").read_text()
    r3 = _ab("--b", other, "--out", str(folders[0]))
    assert r3.exit_code == 2 and "other inputs" in r3.output
    assert (folders[0] / "ab.json").read_text() == text
    r4 = _ab("--b", first["b"][0], "--out", str(folders[0]))
    assert r4.exit_code == 0, r4.output
    assert json.loads((folders[0] / "ab.json").read_text())["inputs_hash"] == first["inputs_hash"]


def test_chaos_names_its_folder_and_replays_by_scenario_and_refuses_another(here: Path) -> None:
    r = runner.invoke(app, ["chaos", str(CHAOS_SMALL), "--seeds", "2-3", "--all-replays"])
    assert r.exit_code == 0, r.output
    (folder,) = (here / "runs").glob("chaos-*")
    assert folder.name.startswith("chaos-small-")  # no doubled prefix
    report = json.loads((folder / "chaos.json").read_text())
    assert report["scenario"] == "chaos-small" and [s["seed"] for s in report["seeds"]] == [2, 3]
    assert sorted(p.name for p in (folder / "replays").iterdir()) == [
        "chaos-small-seed-2.replay.json", "chaos-small-seed-3.replay.json",
    ]  # fmt: skip
    text = (folder / "chaos.json").read_text()
    r = runner.invoke(
        app, ["chaos", str(CHAOS_SMALL), "--seeds", "2", "--set", "workload.requests=30",
              "--out", str(folder)],
    )  # fmt: skip
    assert r.exit_code == 2 and "other inputs" in r.output
    assert (folder / "chaos.json").read_text() == text


def test_chaos_keeps_finished_seeds_on_ctrl_c_and_resumes_from_them(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sim.study.chaos

    real = sim.study.chaos.run_seed
    calls: list[int] = []

    def interrupted_at_third(*args: Any) -> Any:
        calls.append(args[2])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(sim.study.chaos, "run_seed", interrupted_at_third)
    out = here / "c"
    r = runner.invoke(app, ["chaos", str(CHAOS_SMALL), "--seeds", "1-4", "--out", str(out)])
    assert r.exit_code == 130 and "2 finished seeds kept" in r.output, r.output
    rows = [json.loads(x) for x in (out / "seeds.jsonl").read_text().splitlines()]
    assert [x["seed"] for x in rows] == [1, 2]
    monkeypatch.setattr(sim.study.chaos, "run_seed", real)
    ran: list[int] = []
    monkeypatch.setattr(sim.study.chaos, "run_seed", lambda *a: ran.append(a[2]) or real(*a))
    r = runner.invoke(app, ["chaos", str(CHAOS_SMALL), "--seeds", "1-4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert ran == [3, 4]  # only the seeds not finished before
    report = json.loads((out / "chaos.json").read_text())
    assert [s["seed"] for s in report["seeds"]] == [1, 2, 3, 4]


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(here: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        r = runner.invoke(app, ["run", "tiny.yaml", "--quiet"])
        assert r.exit_code == 0, r.output
        r = _ab("--b", "cluster.servers=3")
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["plan", "plan-tiny.yaml", "--quiet", "--json"])
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    plan = json.loads(r.stdout.strip().splitlines()[-1])
    assert plan["answers"] and Path(plan["folder"]).name.startswith("plan-tiny-")  # one prefix
    paths = [p for p in (here / "runs").rglob("*") if not p.is_symlink()]
    assert {p.name for p in paths} >= {"ab.json", "ab.png", "plan.json", "frontier.png"}
    for p in paths:
        want = (0o777 if p.is_dir() else 0o666) & ~mask
        assert p.stat().st_mode & 0o777 == want, (p, oct(p.stat().st_mode))


def test_validate_writes_under_runs_by_default(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped at its first workload (no engine run): the output folder is
    runs/validate-PROFILE-HASH, not a validate-out/ of the working folder."""
    import hwbench.validate
    from engine.errors import InputError
    from sim.serving.costmodel import load_profile
    from sim.serving.opcost import EngineTerms, OpsProfile

    def stop(*_: Any, **__: Any) -> Any:
        raise InputError("stopped by the test")

    monkeypatch.setattr(hwbench.validate, "run_suite", stop)
    prof = load_profile("a100-80gb").model_copy(update={"ops": OpsProfile(engine=EngineTerms())})
    (here / "eng.json").write_text(prof.model_dump_json(), encoding="utf-8")
    r = runner.invoke(app, ["validate", "--profile", "eng.json", "--repeats", "1"])
    assert r.exit_code == 2 and "stopped by the test" in r.output
    assert not (here / "validate-out").exists()
    (folder,) = (here / "runs").iterdir()
    assert folder.name.startswith("validate-eng-")
