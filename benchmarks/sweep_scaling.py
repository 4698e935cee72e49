"""Sweep throughput: runs per minute with 1 and 2 Dask workers (and in-process).

Each run is the burst-traffic scenario shrunk to ~0.5 s of CPU (``--requests``); points differ
by seed. For each setting a fresh ``LocalCluster`` (processes, one thread each) is started and
every worker is warmed with one run first, so the figure is steady-state sweep throughput, not
cluster start-up. Wall-clock rates: on a shared machine other jobs lower them. Never asserts.

    python benchmarks/sweep_scaling.py            # 24 runs per setting
    python benchmarks/sweep_scaling.py --runs 12  # quicker

Last line: ``{"runs_per_minute": {"1": ..., "2": ...}, "speedup_2_vs_1": ..., ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from sim.study.sweep import RunCache, Runner, build_points

ROOT = Path(__file__).resolve().parents[1]


def measure(workers: int, runs: int, requests: int, dask: bool) -> tuple[float, float]:
    """(runs per minute, mean CPU-seconds per run as measured inside the runs)."""
    scen = ROOT / "scenarios" / "burst-traffic.yaml"
    over = [f"workload.requests={requests}", "cluster.servers=16"]
    warm = build_points(scen, {}, list(range(10_000, 10_000 + workers)), over)
    pts = build_points(scen, {}, list(range(runs)), over)
    with tempfile.TemporaryDirectory() as tmp, Runner(workers, force_dask=dask) as runner:
        runner.run(warm, RunCache(Path(tmp) / "warm"))
        t0 = time.perf_counter()
        batch = runner.run(pts, RunCache(Path(tmp) / "main"))
        wall = time.perf_counter() - t0
    per_run = [r["wall_s"] for r in batch.records.values() if r.get("wall_s")]
    failed = [r for r in batch.records.values() if r["status"] != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} runs failed: {failed[0]['error']}")
    return runs / wall * 60.0, sum(per_run) / max(len(per_run), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=24, help="runs per setting")
    ap.add_argument("--requests", type=int, default=600, help="requests per run")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    rows = []
    for label, workers, dask in (("in-process", 1, False), ("1", 1, True), ("2", 2, True)):
        rpm, per = measure(workers, args.runs, args.requests, dask)
        rows.append((label, workers, rpm, per))
    load_after = os.getloadavg()[0]
    print(f"cores: {os.cpu_count()}, runs per setting: {args.runs}, requests/run: {args.requests}")
    print(f"1-min load average before / after: {load_before:.2f} / {load_after:.2f} (other jobs")
    print("on the machine take cores from the 2-worker setting first)")
    print(f"{'setting':<12} {'workers':>7} {'runs/min':>10} {'s/run (in worker)':>18}")
    for label, w, rpm, per in rows:
        print(f"{label:<12} {w:>7} {rpm:>10.1f} {per:>18.3f}")
    rates = {label: round(r, 1) for label, _, r, _ in rows}
    speedup = rates["2"] / rates["1"] if rates["1"] else None
    print(f"speed-up 2 vs 1 Dask worker: {speedup or 0:.2f}x (target >= 1.7x)")
    out = {
        "runs_per_minute": {"1": rates["1"], "2": rates["2"]},
        "in_process_runs_per_minute": rates["in-process"],
        "speedup_2_vs_1": round(speedup, 3) if speedup else None,
        "seconds_per_run": round(rows[1][3], 4),
        "load_average": [round(load_before, 2), round(load_after, 2)],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
