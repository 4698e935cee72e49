"""Bad fault specs are InputErrors naming the file and field; the CLI exits 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.control.faults import check_faults
from sim.scenario import load_scenario
from sim.study.chaos import parse_seeds

from .conftest import DATA

BAD = [
    ({"at": 1, "kind": "explode", "target": "ps0"}, "kind"),
    ({"at": 1, "kind": "kill"}, "needs a target"),
    ({"at": 1, "kind": "kill", "target": "ps0", "colour": 3}, "unknown key"),
    ({"at": 1, "kind": "degrade", "target": "ps0", "loss": 1.5}, "loss"),
    ({"at": "soon", "kind": "heal"}, "at"),
    ({"at": 1, "kind": "corrupt", "target": "node0"}, "parameter server"),
    ({"at": 1, "kind": "partition", "shape": "triangle"}, "shape"),
]


def _write(tmp_path: Path, faults: dict) -> Path:
    data = yaml.safe_load((DATA / "chaos-small.yaml").read_text())
    data["faults"].update(faults)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize(("spec", "word"), BAD)
def test_bad_fault_spec_is_an_input_error(tmp_path: Path, spec: dict, word: str) -> None:
    p = _write(tmp_path, {"schedule": [spec]})
    with pytest.raises(InputError) as err:
        load_scenario(p)
    msg = str(err.value)
    assert str(p) in msg and "faults.schedule[0]" in msg
    assert word in msg


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"at": 1, "kind": "kill", "target": "ps7"}, "target"),
        ({"at": 1, "kind": "restart", "target": "raft9"}, "target"),
        ({"at": 1, "kind": "push", "model": 3}, "model"),
        ({"at": 1, "kind": "push", "writer": "nobody"}, "writer"),
    ],
)
def test_unknown_targets_name_the_allowed_values(tmp_path: Path, spec: dict, field: str) -> None:
    sc = load_scenario(_write(tmp_path, {"schedule": [spec]}))
    with pytest.raises(InputError) as err:
        check_faults(sc)
    msg = str(err.value)
    assert f"faults.schedule[0].{field}" in msg and "allowed" in msg


def test_bad_random_kinds(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown fault kind"):
        load_scenario(_write(tmp_path, {"random": {"kinds": {"meteor": 1.0}}}))


def test_cli_exit_2_on_bad_fault_spec(tmp_path: Path) -> None:
    p = _write(tmp_path, {"schedule": [{"at": 1, "kind": "kill", "target": "ps7"}]})
    r = CliRunner().invoke(app, ["chaos", str(p), "--seeds", "1", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert "ps7" in r.output and "allowed" in r.output


def test_cli_exit_2_on_bad_seeds_and_missing_replay(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["chaos", str(DATA / "chaos-small.yaml"), "--seeds", "9-3"])
    assert r.exit_code == 2 and "--seeds" in r.output
    r = CliRunner().invoke(app, ["replay", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "no such replay file" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "seed": 1}')
    r = CliRunner().invoke(app, ["replay", str(bad)])
    assert r.exit_code == 2 and "scenario" in r.output


def test_parse_seeds() -> None:
    assert parse_seeds("1-3,7, 2") == [1, 2, 3, 7]
    assert parse_seeds("0") == [0]
    for bad in ("", "a", "-1", "5-2", "1-x"):
        with pytest.raises(InputError):
            parse_seeds(bad)
