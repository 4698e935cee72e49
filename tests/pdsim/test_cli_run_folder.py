"""Run folders of scenarios with variants (issue 20, item 11): a replay file per variant that
``pdsim replay`` reproduces, and the README's Python snippet works for them too."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from pdsim.cli import app
from sim.study.recording import replay

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = """\
name: two-ways
profile: a100-80gb
deployments:
  - model: llama-2-7b
cluster:
  servers: 2
  param_servers: 2
  gpu: {weight_cache_fraction: 0.4}
  server: {host: 64GiB}
  replica: {max_num_seqs: 16}
workload:
  kind: poisson
  requests: 12
  rate: 20
  input_tokens: {dist: lognormal, mean: 128, sigma: 0.5, low: 8, high: 512}
  output_tokens: {dist: lognormal, mean: 8, sigma: 0.5, low: 2, high: 32}
variants:
  - {name: small, set: {cluster.servers: 1}}
  - {name: big/x, set: {cluster.servers: 3}}
"""


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
