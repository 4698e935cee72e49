"""Run folders of scenarios with variants (issue 20, item 11): a replay file per variant that
``pdsim replay`` reproduces, and the README's Python snippet works for them too."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from pdsim.cli import app
from sim.study.recording import replay
from tests.scenario_text import tiny_scenario

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = tiny_scenario(
    "two-ways",
    classes=False,
    variants={"small": {"cluster.servers": 1}, "big/x": {"cluster.servers": 3}},
)


def test_every_variant_gets_a_replay_file_that_replays(tmp_path: Path) -> None:
    sc = tmp_path / "v.yaml"
    sc.write_text(VARIANTS)
    r = CliRunner().invoke(app, ["run", str(sc), "--out", str(tmp_path / "runs"), "--quiet"])
    assert r.exit_code == 0, r.output
    folder = Path(r.output.strip().splitlines()[-1])
    files = sorted(p.name for p in folder.glob("replay*.json"))
    assert files == ["replay-big-x.json", "replay-small.json"]
    for f in files:
        rep = replay(folder / f)
        assert rep.matches, f


def test_readme_python_snippet_runs_for_a_scenario_with_variants(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### From Python\n```python\n(.*?)```", readme, re.S)
    assert code is not None
    sc = tmp_path / "v.yaml"
    sc.write_text(VARIANTS)
    text = code.group(1).replace('"scenarios/quickstart.yaml"', repr(str(sc)))
    text = text.replace('"cluster.servers=8"', '"workload.requests=6"')
    exec(compile(text, "README.md", "exec"), {})  # raises on a KeyError
