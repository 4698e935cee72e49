"""Executing sweeps: the cache makes resume exact, failures are reported and isolated,
and a real dask LocalCluster (2 worker processes) runs a 200-run sweep that is stopped
half-way and resumed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.study.sweep import RunCache, build_points, execute, run_point


def _counted(counter: Path) -> list[str]:
    return counter.read_text().split() if counter.exists() else []


def test_failing_run_is_reported_and_does_not_lose_others(tiny: Path, tmp_path: Path) -> None:
    # 1 GiB of HBM cannot hold two LLaMA-7B layers: that run fails feasibility at run time
    pts = build_points(tiny, {"cluster.gpu.hbm": ["1GiB", "80GiB"]}, [0, 1])
    counter = tmp_path / "count.txt"
    out = execute(pts, tmp_path / "sw", counter=counter)
    assert (out.ran, out.cached, out.missing) == (4, 0, 0)
    assert len(out.failed) == 2 and not out.complete
    for rec in out.failed:
        assert rec["params"] == {"cluster.gpu.hbm": "1GiB"}
        assert "weight cache" in rec["error"]
    df = pd.read_parquet(out.parquet)
    assert list(df["status"]) == ["failed", "failed", "ok", "ok"]
    assert df.loc[df["status"] == "ok", "latency.e2e.p99"].notna().all()
    assert df.loc[df["status"] == "failed", "error"].str.contains("weight cache").all()
    # resume: the finished runs are not repeated, the failed ones are retried
    again = execute(pts, tmp_path / "sw", counter=counter)
    assert (again.ran, again.cached) == (2, 2)
    assert sorted(_counted(counter)) == sorted(
        [p.config_hash for p in pts] + [p.config_hash for p in pts[:2]]
    )


def test_in_process_resume_runs_only_missing_points(tiny: Path, tmp_path: Path) -> None:
    pts = build_points(tiny, {"workload.rate": [5, 10, 20]}, [0, 1])
    counter = tmp_path / "count.txt"
    first = execute(pts, tmp_path / "sw", max_runs=4, counter=counter)
    assert (first.ran, first.missing, len(first.frame)) == (4, 2, 4)
    # extending the sweep: one more grid value -> only the new and the missing points run
    more = build_points(tiny, {"workload.rate": [5, 10, 20, 40]}, [0, 1])
    second = execute(more, tmp_path / "sw", counter=counter)
    assert (second.ran, second.cached, second.missing) == (4, 4, 0) and second.complete
    hashes = _counted(counter)
    assert len(hashes) == len(set(hashes)) == 8
    assert list(second.frame["point"]) == list(range(8))
    # a cached record equals a fresh run of the same point (deterministic runs)
    p = more[3]
    fresh = run_point({"scenario": p.scenario, "seed": p.seed, "config_hash": p.config_hash,
                       "params": p.params})  # fmt: skip
    assert fresh["metrics"] == RunCache(tmp_path / "sw").get(p.config_hash)["metrics"]  # type: ignore[index]


def test_duplicate_configs_run_once(tiny: Path, tmp_path: Path) -> None:
    # nodes=2 is the scenario's own value, so both grid keys give one identical config
    a = build_points(tiny, {"cluster.servers": [2]}, [0])
    b = build_points(tiny, {}, [0])
    assert a[0].config_hash == b[0].config_hash
    out = execute([*a, *b], tmp_path / "sw")
    assert out.ran == 1 and out.total == 1


def _interrupt_and_resume(tiny: Path, tmp_path: Path, n_rates: int) -> None:
    """A sweep of n_rates x 5 seeds on a 2-worker LocalCluster, stopped after half its runs
    (run limit) and resumed: nothing runs twice, the Parquet holds every point."""
    rates = [float(5 + i) for i in range(n_rates)]
    pts = build_points(tiny, {"workload.rate": rates}, [0, 1, 2, 3, 4])
    n = len(pts)
    half = n // 2
    folder, counter = tmp_path / "sw", tmp_path / "count.txt"
    first = execute(pts, folder, workers=2, max_runs=half, counter=counter)
    assert (first.ran, first.missing, first.failed) == (half, n - half, [])
    assert len(_counted(counter)) == half
    assert len(pd.read_parquet(first.parquet)) == half
    done_first = set(RunCache(folder).done())
    assert len(done_first) == half

    second = execute(pts, folder, workers=2, counter=counter)
    assert (second.cached, second.ran, second.missing) == (half, n - half, 0)
    assert second.complete
    counted = _counted(counter)
    assert len(counted) == n and len(set(counted)) == n  # nothing ran twice
    assert not done_first & set(counted[half:])  # the resume ran only missing points

    df = pd.read_parquet(second.parquet)
    assert len(df) == n and (df["status"] == "ok").all()
    assert list(df["point"]) == list(range(n))
    assert sorted(df["workload.rate"].unique()) == rates
    assert set(df["seed"]) == {0, 1, 2, 3, 4}
    assert df["config_hash"].is_unique
    assert (df["requests.completed"] == 12).all() and df["latency.e2e.p99"].gt(0).all()


def test_30_runs_on_local_cluster_interrupted_and_resumed(tiny: Path, tmp_path: Path) -> None:
    _interrupt_and_resume(tiny, tmp_path, 6)


@pytest.mark.slow
def test_200_runs_on_local_cluster_interrupted_and_resumed(tiny: Path, tmp_path: Path) -> None:
    # ~30-60 s on 2 shared cores (two LocalCluster starts + 200 runs of ~0.1 s)
    _interrupt_and_resume(tiny, tmp_path, 40)


def test_existing_scheduler_address(tiny: Path, tmp_path: Path) -> None:
    """``scheduler=tcp://...``: the sweep runs on a cluster it did not start and leaves it up."""
    from dask.distributed import Client, LocalCluster

    pts = build_points(tiny, {"workload.rate": [5, 10, 20]}, [0, 1])
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        out = execute(pts, tmp_path / "sw", scheduler=cluster.scheduler_address)
        assert (out.ran, out.failed) == (6, []) and out.complete
        with Client(cluster.scheduler_address) as c:  # still running after the sweep
            assert len(c.scheduler_info()["workers"]) == 2
    local = execute(pts, tmp_path / "local")  # in-process: identical metrics
    cols = ["config_hash", "latency.e2e.p99", "trace_hash"]
    pd.testing.assert_frame_equal(out.frame[cols], local.frame[cols])
