"""``pdsim sweep`` end to end: results, resume, failures (exit 1), bad input (exit 2, nothing
written)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from pdsim.cli import app

runner = CliRunner()


def _results(out: Path) -> pd.DataFrame:
    """The results of the latest sweep written into ``out`` (one ``results-TAG.parquet`` per
    grid and seeds)."""
    files = sorted(out.glob("results-*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    return pd.read_parquet(files[-1])


def _sweep_file(tiny: Path, body: str) -> Path:
    f = tiny.parent / "sweep.yaml"
    f.write_text("scenario: tiny.yaml\n" + body)
    return f


def test_cli_sweep_file_and_resume(tiny: Path, tmp_path: Path) -> None:
    f = _sweep_file(tiny, "grid: {cluster.servers: [1, 2]}\nseeds: 2\n")
    out = tmp_path / "o"
    r = runner.invoke(app, ["sweep", str(f), "--out", str(out), "--max-runs", "3"])
    assert r.exit_code == 0, r.output
    assert "3 run now" in r.output and "1 not started" in r.output and "resume" in r.output
    r = runner.invoke(app, ["sweep", str(f), "--out", str(out), "--grid", "cache.hbm_policy=lru"])
    assert r.exit_code == 0, r.output
    # the extra single-value grid key is the scenario's default: same configs, one new run
    assert "1 run now, 3 from cache" in r.output
    df = _results(out)
    assert len(df) == 4 and set(df["cluster.servers"]) == {1, 2} and (df["status"] == "ok").all()


def test_cli_sweep_scenario_with_grid_flags(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = runner.invoke(
        app,
        ["sweep", "--scenario", str(tiny), "--grid", "workload.rate=5,10", "--seeds", "2",
         "--set", "workload.requests=6", "--out", str(out), "--quiet"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    df = _results(out)
    assert list(df["workload.rate"]) == [5, 5, 10, 10] and (df["requests.completed"] == 6).all()


def test_cli_failing_run_exit_1_with_its_config(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = runner.invoke(
        app,
        ["sweep", "--scenario", str(tiny), "--grid", "cluster.gpu.hbm=1GiB,80GiB",
         "--out", str(out), "--quiet"],
    )  # fmt: skip
    assert r.exit_code == 1
    assert "failed runs" in r.output and "cluster.gpu.hbm='1GiB'" in r.output
    assert len(_results(out)) == 2


@pytest.mark.parametrize(
    "args",
    [
        ["--grid", "cluster.nodez=1,2"],
        ["--grid", "cluster.servers=1,-3"],
        ["--grid", "cluster.servers"],
        ["--set", "workload.rats=3"],
    ],
)
def test_cli_bad_grid_exit_2_nothing_written(tiny: Path, tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "o"
    r = runner.invoke(app, ["sweep", "--scenario", str(tiny), "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert "error:" in r.output
    assert not out.exists()


def test_cli_bad_sweep_file_exit_2_nothing_written(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    f = _sweep_file(tiny, "grid: {cluster.servers: [1]}\nseed: 3\n")
    r = runner.invoke(app, ["sweep", str(f), "--out", str(out)])
    assert r.exit_code == 2 and "seed: unknown key" in r.output
    r = runner.invoke(app, ["sweep", str(f), "--scenario", str(tiny), "--out", str(out)])
    assert r.exit_code == 2 and "exactly one" in r.output
    assert not out.exists()


def test_cli_sweep_plot_is_written_and_another_grid_keeps_the_first(
    tiny: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    base = ["sweep", "--scenario", str(tiny), "--out", str(out), "--quiet"]
    r = runner.invoke(app, [*base, "--grid", "workload.rate=5,10"])
    assert r.exit_code == 0, r.output
    (first,) = out.glob("results-*.parquet")
    tag = first.stem.removeprefix("results-")
    assert (out / f"sweep-{tag}.png").stat().st_size > 0  # the plot finds its columns
    r = runner.invoke(app, [*base, "--grid", "workload.rate=5,20"])
    assert r.exit_code == 0 and "1 run now, 1 from cache" in r.output, r.output
    assert sorted(pd.read_parquet(first)["workload.rate"]) == [5, 10]  # kept as it was
    assert len(list(out.glob("results-*.parquet"))) == 2 == len(list(out.glob("sweep-*.png")))
    assert sorted(_results(out)["workload.rate"]) == [5, 20]


@pytest.mark.parametrize("address", ["notaurl", "tcp://127.0.0.1:1"])
def test_cli_unreachable_scheduler_is_one_line_naming_it(
    tiny: Path, tmp_path: Path, address: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    from sim.study.sweep import daskclient

    monkeypatch.setattr(daskclient, "CONNECT_TIMEOUT_S", 0.5)  # nothing listens on port 1
    out = tmp_path / "o"
    r = runner.invoke(
        app, ["sweep", "--scenario", str(tiny), "--grid", "workload.rate=5,10",
              "--scheduler", address, "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: --scheduler {address}: cannot connect: ")
    assert r.output.count("\n") == 1 and not out.exists()


@pytest.mark.slow
def test_ctrl_c_during_a_dask_sweep_is_one_line_and_status_130(tiny: Path, tmp_path: Path) -> None:
    """SIGINT to the whole process group (as a terminal sends it): the workers ignore it,
    the command closes its cluster quietly and says one line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "o"
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pdsim.cli import main; main()"
    )
    rates = ",".join(str(r) for r in range(1, 201))
    args = ["sweep", "--scenario", str(tiny), "--grid", f"workload.rate={rates}",
            "--workers", "2", "--out", str(out)]  # fmt: skip
    root = Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((out / "runs").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)  # until the workers have finished a run
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == "interrupted (Ctrl-C)\n"
