"""Every shipped scenario end to end at reduced size (via --set overrides), plus the run
folder written by ``pdsim run``."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from pdsim.cli import app
from sim.runner import run_scenario
from sim.scenario import load_scenario

SCEN = Path(__file__).resolve().parents[2] / "scenarios"

REDUCED = {
    "quickstart": ["workload.requests=60", "cluster.servers=2"],
    "burst-traffic": ["workload.duration=3s"],
    "long-context": ["workload.duration=6s"],
    "multi-model-coloring": ["workload.duration=6s"],
    "lruk-vs-lru": ["workload.duration=6s"],
    "pd-vs-coupled": ["workload.duration=6s"],
    "elastic-scaling": ["workload.duration=40s"],  # the burst starts at 20 s
    "diurnal-day": ["workload.duration=1min", "workload.rate_profile.day=1min"],
    "azure-conv-replay": ["workload.duration=30s"],
}
#: shipped scenarios that demonstrate a workload or a setup rather than test a claim
NO_CLAIMS = {"quickstart", "diurnal-day", "azure-conv-replay"}


def test_every_shipped_scenario_is_covered() -> None:
    assert set(REDUCED) <= {p.stem for p in SCEN.glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_shipped_scenario_runs_reduced(name: str) -> None:
    sc = load_scenario(SCEN / f"{name}.yaml", REDUCED[name])
    res = run_scenario(sc, seed=1)
    s = res.summary
    runs = s.get("variants", {"": s})
    for v in runs.values():
        r = v["requests"]
        assert r["completed"] + r["shed"] + r["rejected"] == r["total"]
        assert r["completed"] > 0 and r["unfinished"] == 0
    if name not in NO_CLAIMS:
        assert sc.claims and len(res.claims) == len(sc.claims)
        assert all(c["measured"] is not None for c in res.claims if c["capacity"] is None)


@pytest.mark.parametrize("name", ["diurnal-day", "azure-conv-replay"])
def test_day_long_workload_scenarios_are_deterministic_per_seed(name: str) -> None:
    sc = load_scenario(SCEN / f"{name}.yaml", REDUCED[name])
    first, again = run_scenario(sc, seed=1), run_scenario(sc, seed=1)
    assert first.trace_hash == again.trace_hash
    assert first.summary["requests"]["total"] == again.summary["requests"]["total"] > 100
    if name == "diurnal-day":  # its arrivals are drawn; the trace's are fixed
        assert run_scenario(sc, seed=2).trace_hash != first.trace_hash


def test_long_context_chunked_serves_longer_contexts() -> None:
    sc = load_scenario(SCEN / "long-context.yaml", REDUCED["long-context"])
    s = run_scenario(sc, seed=2).summary["variants"]
    lim = {k: v["max_context_limit"]["llama-3.1-8b"] for k, v in s.items()}
    assert lim["chunked"] > lim["contiguous"]
    assert s["contiguous"]["requests"]["rejected"] >= s["chunked"]["requests"]["rejected"]


def test_cli_run_writes_the_run_folder(tmp_path: Path) -> None:
    args = ["run", str(SCEN / "quickstart.yaml"), "--out", str(tmp_path)]
    args += [x for o in REDUCED["quickstart"] for x in ("--set", o)]
    args += ["--seed", "5"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    names = {p.name for p in folder.iterdir()}
    assert {"config.yaml", "summary.json", "requests.parquet", "timeseries.parquet"} <= names
    assert {"latency_cdf.png", "timeseries.png", "bytes_by_tier.png"} <= names
    summary = json.loads((folder / "summary.json").read_text())
    req = pd.read_parquet(folder / "requests.parquet")
    assert len(req) == summary["requests"]["total"] == 60
    for col in (
        "request_id",
        "model",
        "cls",
        "arrival",
        "start",
        "first_token",
        "end",
        "input_tokens",
        "output_tokens",
        "param_wait_s",
        "node",
        "bytes_remote",
        "hits_hbm",
    ):
        assert col in req.columns
    done = req[req["status"] == "done"]
    assert (done["arrival"] <= done["start"]).all() and (done["start"] < done["first_token"]).all()
    assert (done["first_token"] <= done["end"]).all()
    # identical config again: same folder, same summary; a different seed: another folder
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0
    assert json.loads((folder / "summary.json").read_text()) == summary
    other = CliRunner().invoke(app, [*args[:-1], "6"])
    assert other.exit_code == 0
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2
