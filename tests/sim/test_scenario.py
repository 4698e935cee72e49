"""Scenario loading: units, unknown keys, --set overrides, and bad scenarios -> exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.scenario import apply_overrides, load_scenario, validate

BASE = {
    "name": "t",
    "deployments": [{"model": "llama-2-7b"}],
    "cluster": {"servers": 2, "param_servers": 1, "server": {"host": "8GiB"}},
    "workload": {"requests": 20, "rate": 50.0, "output_tokens": {"mean": 4}},
}


def _write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_units_are_normalised() -> None:
    sc = validate({**BASE, "chunks": {"size": "8MiB"}, "cluster": {"ps": {"nic": "100Gbit/s"}}})
    assert sc.chunks.size == 8 * 2**20
    assert sc.cluster.ps.nic == pytest.approx(12.5e9)


def test_override_sets_nested_value_and_rejects_unknown_path() -> None:
    out = apply_overrides(BASE, ["cluster.servers=7", "cache.params.k=2"], "x")
    assert out["cluster"]["servers"] == 7 and out["cache"]["params"] == {"k": 2}
    assert BASE["cluster"]["servers"] == 2  # the input is not mutated
    with pytest.raises(InputError, match=r"cluster\.nods"):
        apply_overrides(BASE, ["cluster.nods=3"], "x")
    with pytest.raises(InputError, match="KEY=VALUE"):
        apply_overrides(BASE, ["cluster.servers"], "x")


def test_load_scenario_applies_overrides(tmp_path: Path) -> None:
    sc = load_scenario(_write(tmp_path, BASE), ["workload.requests=5"])
    assert sc.workload.requests == 5


BAD = [
    ("typo key", {"clustr": {"servers": 2}}, "clustr: unknown key"),
    (
        "bad unit",
        {"cluster": {"gpu": {"hbm": "12 GBB"}}},
        'cluster.gpu.hbm: "12 GBB" is not a size',
    ),
    ("negative size", {"cluster": {"server": {"host": "-4GiB"}}}, "cluster.server.host"),
    (
        "unknown policy",
        {"cache": {"hbm_policy": "lfu-magic"}},
        "cache.hbm_policy: unknown eviction policy",
    ),
    (
        "offline opt as a node policy",
        {"cache": {"nvme_policy": "opt"}},
        "cache.nvme_policy: 'opt' (Belady's MIN) needs the future reference string",
    ),
    (
        "opt error lists the online policies",
        {"cache": {"hbm_policy": "opt"}},
        "allowed here: arc, color-lru, fifo, lru, lru-k, pin, priority",
    ),
    (
        "unknown placement",
        {"scheduler": {"policy": "best"}},
        "scheduler.policy: 'best' is not allowed",
    ),
    (
        "model larger than cluster",
        {
            "deployments": [{"model": "llama-2-70b"}],
            "cluster": {
                "servers": 1,
                "param_servers": 1,
                "gpu": {"hbm": "8GiB"},
                "server": {"host": "8GiB", "nvme": "8GiB"},
                "ps": {"dram": "8GiB", "ssd": "8GiB"},
            },
        },
        "whole cluster holds",
    ),
    ("unknown model", {"deployments": [{"model": "gpt-9"}]}, "deployments[0].model: unknown model"),
]


@pytest.mark.parametrize(("label", "patch", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_scenario_exits_2_and_writes_nothing(
    tmp_path: Path, label: str, patch: dict, message: str
) -> None:
    data = {**BASE, **patch}
    if "cluster" in patch and "servers" not in patch["cluster"]:
        data["cluster"] = {**BASE["cluster"], **patch["cluster"]}
    path = _write(tmp_path, data)
    out = tmp_path / "runs"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--quiet"])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert message in text
    assert str(path) in text  # names the file
    assert text.count("error:") == 1
    assert not out.exists() or not any(out.iterdir())


def test_bad_override_exits_2(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE)
    res = CliRunner().invoke(
        app, ["run", str(path), "--set", "workload.rte=3", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 2
    assert "workload.rte" in res.output
    assert not (tmp_path / "r").exists()
