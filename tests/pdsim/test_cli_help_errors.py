"""Help text, error messages and shipped scenarios of the CLI (issue 20, items 6, 7, 10, 16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from pdsim.cli.format import fmt_value, summary_rows
from sim.shipped import SHIPPED_DIR, shipped_scenarios
from sim.study.sweep.spec import SEEDS_HELP, parse_seed_option

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    [], ["run"], ["sweep"], ["ab"], ["plan"], ["calibrate"], ["validate"], ["chaos"],
    ["replay"], ["cache", "replay"], ["scenarios"], ["scenarios", "copy"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "pdsim")
def test_help_uses_readable_metavars(cmd: list[str]) -> None:
    r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    for bad in ("<bool>", "<str>", "<int", "<float>", "<list", "<path>", "{"):
        assert bad not in r.output, (bad, r.output)
    if "--seeds" in r.output:  # one syntax everywhere
        assert "N (seeds 0..N-1), A-B" in " ".join(r.output.split())


def test_root_help_lists_every_command_with_a_whole_sentence() -> None:
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "100"})
    lines = r.output.split("Commands:")[1].strip().splitlines()
    assert len(lines) >= 10 and not any(line.rstrip().endswith("...") for line in lines)


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 5)), min_size=1, max_size=6))
def test_seed_lists_and_ranges_give_their_seeds(parts: list[tuple[int, int]]) -> None:
    """Reference: the union of the ranges written out (a lone number in a list is a seed)."""
    text = ",".join(f"{lo}-{lo + n}" if n else str(lo) for lo, n in parts)
    want = sorted({s for lo, n in parts for s in range(lo, lo + n + 1)})
    if len(parts) == 1 and parts[0][1] == 0:  # a bare N: seeds 0..N-1
        want = list(range(parts[0][0]))
        if not want:
            with pytest.raises(InputError, match="N must be >= 1"):
                parse_seed_option(text)
            return
    assert parse_seed_option(text) == want


@pytest.mark.parametrize("bad", ["", "x", "3-1", "1-", "-2", "1,,2", "2.5"])
def test_bad_seeds_name_the_option_and_the_syntax(bad: str) -> None:
    with pytest.raises(InputError, match=r"--seeds .*allowed: N"):
        parse_seed_option(bad)
    assert "A-B" in SEEDS_HELP


def _error(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert not r.output.startswith("\n") and r.output.count("\n") == 1, repr(r.output)
    assert r.output.startswith("error: ")
    return r.output


QS = str(ROOT / "scenarios" / "quickstart.yaml")


def test_errors_blame_the_option_that_caused_them(tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    assert _error(["run", QS, "--set", "cluster.servers=8.5", "--out", out]).startswith(
        "error: --set cluster.servers=8.5: cluster.servers: "
    )
    msg = _error(["run", QS, "--set", "profile=h300-sxm", "--out", out])
    assert "profile: h300-sxm" in msg and "a100-80gb" in msg and "h200-sxm" in msg
    msg = _error(["plan", "plan-quickstart", "--p99", "vip=5s", "--out", out])
    assert msg.startswith("error: --p99 vip=5s: slo.p99") and "allowed: all" in msg
    msg = _error(["ab", QS, "--a", "cluster.servers=8.5", "--out", out])
    assert msg.startswith("error: --a cluster.servers=8.5:")
    msg = _error(["run", str(tmp_path), "--out", out])
    assert "is a folder, not a scenario file" in msg
    msg = _error(["run", "no-such-thing", "--out", out])
    assert "quickstart" in msg and "shipped" in msg
    assert not Path(out).exists()


def test_shipped_scenarios_are_the_repository_scenarios() -> None:
    repo = sorted((ROOT / "scenarios").glob("*.yaml"))
    assert sorted(p.stem for p in repo) == shipped_scenarios()  # stems: "a" < "a-8b"
    for p in repo:  # to refresh: cp scenarios/*.yaml sim/data/scenarios/
        assert (SHIPPED_DIR / p.name).read_bytes() == p.read_bytes(), p.name


def test_scenarios_list_show_copy(tmp_path: Path) -> None:
    r = runner.invoke(app, ["scenarios", "list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and all(n in r.output for n in shipped_scenarios())
    r = runner.invoke(app, ["scenarios", "show", "quickstart"])
    assert r.exit_code == 0 and r.output == (ROOT / "scenarios" / "quickstart.yaml").read_text()
    r = runner.invoke(app, ["scenarios", "copy", "plan-quickstart", str(tmp_path / "mine")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [
        "plan-quickstart.yaml", "quickstart.yaml",
    ]  # fmt: skip
    again = runner.invoke(app, ["scenarios", "copy", "plan-quickstart", str(tmp_path / "mine")])
    assert again.exit_code == 2 and "--force" in again.output
    assert ", quickstart," in _error(["scenarios", "show", "nope"])


def test_run_by_shipped_name_prints_json_summary_last(tmp_path: Path) -> None:
    r = runner.invoke(
        app,
        ["run", "quickstart", "--set", "workload.requests=30", "--out", str(tmp_path), "--json"],
    )
    assert r.exit_code == 0, r.output
    last = r.stdout.rstrip("\n").splitlines()[-1]
    summary = json.loads(last)
    assert summary["requests"]["completed"] == 30 and summary["scenario"] == "quickstart"
    assert Path(summary["run_folder"]).parent == tmp_path
    assert "e+" not in r.stdout.split(last)[0] and "e-0" not in r.stdout.split(last)[0]


def test_summary_rows_give_units_and_take_new_keys_as_they_come() -> None:
    s = {
        "scenario": "x",
        "throughput": {"offered_rps": 1200.0, "achieved_rps": 1187.25},
        "overloaded": False,
        "requests": {"total": 2000, "unfinished": 3},
        "latency": {"ttft": {"p99": 0.0123}, "e2e": {"p50": 2.5}},
        "utilisation": {"compute": 0.98456, "network": 9.256e-05},
        "hit_rate": {"hbm": 0.99990744},
        "peak_hbm_bytes_per_node": 18694545408,
        "max_context_served": 4193,
    }
    rows = dict(summary_rows(s))
    assert rows["throughput (offered rps / achieved rps)"] == "1,200.00 req/s / 1,187.25 req/s"
    assert rows["overloaded"] == "no"
    assert rows["requests (total / unfinished)"] == "2,000 / 3"
    assert rows["latency ttft (p99)"] == "12.3 ms" and rows["latency e2e (p50)"] == "2.50 s"
    assert rows["utilisation (compute / network)"] == "98.46 % / 0.01 %"
    assert rows["hit rate (hbm)"] == "99.99 %"
    assert rows["peak hbm bytes per node"] == "17.4 GiB"
    assert rows["max context served"] == "4,193 tokens"
    assert "scenario" not in rows


@given(st.floats(1e-7, 1e7), st.sampled_from(["latency.p99", "throughput_rps", "hit_rate.hbm"]))
def test_values_never_use_scientific_notation(x: float, key: str) -> None:
    text = fmt_value(key, x)
    assert "e+" not in text and "e-" not in text
    assert text.endswith(("ms", " s", "req/s", "%"))


def test_version_names_the_build() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0
    # the tests run the sources: a plain build (a compiled install says "mypyc (k of n ...)")
    assert res.output.startswith("pdsim ") and res.output.strip().endswith("build: python")
