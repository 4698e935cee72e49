"""Inputs that used to crash or never finish (issue 22) end in exit 2 with one line.

Each case is a small scenario text written as a user would (YAML scalars such as ``.inf`` and
``true`` included), run through ``pdsim run``: the exit status is 2, the output is one line
naming the file and the field, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdsim.cli import app

BASE = """\
name: t
deployments:
  - {{model: resnet-50, share: {share}}}
cluster:
  servers: 2
  param_servers: 2
  gpu: {{hbm: {hbm}, weight_cache_fraction: {wcf}}}
  server: {{nvme: {nvme}}}
  network: {{rdma: {rdma}}}
ring: {{replication: {repl}}}
cache: {{hbm_policy: color-lru, params: {{shares: {{{shares}: 0.5}}}}}}
workload: {{requests: 4, rate: 10, classes: [{{name: normal, share: 1.0, slo: {slo}}}]}}
faults:
  enabled: {faults}
  schedule: [{fault}]
variants: [{{name: big, set: {{{vset}: 4}}}}]
"""
GOOD = {
    "share": "1.0",
    "hbm": "2GiB",
    "nvme": "0",
    "wcf": "0.2",
    "rdma": "100Gbit/s",
    "repl": "2",
    "shares": "resnet-50",
    "slo": "2s",
    "faults": "false",
    "fault": "",
    "vset": "cluster.servers",
}

CASES = [
    ("nvme .inf", {"nvme": ".inf"}, "cluster.server.nvme"),
    ("hbm 1e999", {"hbm": '"1e999"'}, "cluster.gpu.hbm"),
    ("hbm 400 digits", {"hbm": "9" * 400}, "cluster.gpu.hbm"),
    ("nvme 400 digits", {"nvme": "1" + "0" * 399}, "cluster.server.nvme"),
    ("rdma .inf", {"rdma": ".inf"}, "cluster.network.rdma"),
    ("rdma 400 digits", {"rdma": "9" * 400}, "cluster.network.rdma"),
    ("rdma nan", {"rdma": ".nan"}, "cluster.network.rdma"),
    ("slo 1e999", {"slo": '"1e999s"'}, "workload.classes[0].slo"),
    ("replication true", {"repl": "true"}, "ring.replication"),
    ("weight_cache_fraction true", {"wcf": "true"}, "cluster.gpu.weight_cache_fraction"),
    ("share true", {"share": "true"}, "deployments[0].share"),
    ("unknown colour", {"shares": "llama-9000"}, "llama-9000"),
    ("variant set", {"vset": "cluster.nodez"}, "variant 'big'"),
    (
        "fault at 1e30",
        {"faults": "true", "fault": "{at: 1.0e+30, kind: heal}"},
        "faults.schedule[0].at",
    ),
    (
        "fault duration 1e308",
        {"faults": "true", "fault": "{at: 1, kind: kill, target: ps0, duration: 1.0e+308}"},
        "faults.schedule[0].duration",
    ),
]


def _run(tmp_path: Path, text: str) -> tuple[int, str, Path]:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    out = tmp_path / "runs"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--quiet"])
    return res.exit_code, res.output, out


def test_the_base_scenario_is_valid(tmp_path: Path) -> None:
    from sim.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(BASE.format(**GOOD))
    sc = load_scenario(path)
    assert sc.ring.replication == 2 and sc.cluster.gpu.weight_cache_fraction == 0.2


@pytest.mark.parametrize(("label", "patch", "field"), CASES, ids=[c[0] for c in CASES])
def test_crashing_input_exits_2_with_one_line(
    tmp_path: Path, label: str, patch: dict[str, str], field: str
) -> None:
    code, output, out = _run(tmp_path, BASE.format(**{**GOOD, **patch}))
    assert code == 2, output
    assert output.strip().count("\n") == 0, output
    assert output.startswith("error:") and str(tmp_path / "s.yaml") in output
    assert field in output
    assert "--set" not in output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("depth", [100, 1000, 20000])
def test_deeply_nested_yaml_exits_2_with_one_line(tmp_path: Path, depth: int) -> None:
    text = BASE.format(**GOOD) + "description: " + "[" * depth + "]" * depth + "\n"
    code, output, out = _run(tmp_path, text)
    assert code == 2, output
    assert output.strip().count("\n") == 0 and "nested" in output
    assert not out.exists()


def test_deeply_nested_json_in_a_mooncake_line_exits_2(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 1, "hash_ids": [1, 2]}\n'
        + '{"timestamp": 2, "hash_ids": '
        + "[" * 50000
        + "]" * 50000
        + "}\n"
    )
    res = CliRunner().invoke(app, ["cache", "replay", str(trace), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert res.output.strip().count("\n") == 0 and "line 2" in res.output
    assert not (tmp_path / "o").exists()
