"""Simulator speed on the reference scenario (issue 4): 16 compute nodes, 4 parameter servers,
a LLaMA-2-7B-shaped model, default policies (LRU caches, least-loaded placement, prefetch
window 3, parameter-server warm-up; nodes start cold and fetch their weights), Poisson
arrivals at 200 req/s.

Each size runs in a fresh subprocess so peak RSS is per size. The table shows each run's
trace hash (its first 12 hex digits): a speed change must leave them as they were. Rates
are simulated requests per second of CPU time of the simulation (``time.process_time``, which
leaves out time spent waiting for a CPU), with the same rates over wall time under ``*_wall``
keys. Other tenants still lower the CPU-time rate (shared caches and memory bandwidth): read a
target on an idle machine and compare trees in interleaved runs. Prints a table, then as the
LAST line one JSON object:
``{"requests_per_s": {"10000": ..., "100000": ..., "1000000": ...}, "requests_per_s_wall":
{...}, "events_per_request": ..., "peak_rss_mib": ..., "growth": ..., "build": ...}`` (events
per request of the 100k run; the largest peak RSS; growth = CPU-time growth / request growth
between the smallest and largest size, <= 1 means linear or better; build = ``"python"`` or
``"mypyc (k of n modules)"``, :func:`engine.native.build_label`; the compiled build,
``PDSIM_COMPILE=1 pip install .``, runs 2-2.3x faster, see ``docs/native-build.md``).
Usage: ``python benchmarks/sim_speed.py [--sizes 10000,100000,1000000]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

REFERENCE = {
    "name": "reference",
    "profile": "a100-80gb",
    "deployments": [{"model": "llama-2-7b"}],
    "cluster": {
        "servers": 16,
        "param_servers": 4,
        "server": {"host": "64GiB"},
        "replica": {"max_num_seqs": 64},
    },
    "workload": {
        "kind": "poisson",
        "rate": 200.0,
        "input_tokens": {"dist": "lognormal", "mean": 512, "sigma": 0.6, "low": 16, "high": 4096},
        "output_tokens": {"dist": "lognormal", "mean": 128, "sigma": 0.6, "low": 4, "high": 1024},
    },
}


def one(n: int, warm: bool = False) -> dict[str, Any]:
    """Run the reference scenario with ``n`` requests in this process; return its figures.
    ``warm``: nodes start with the model in HBM (no cold-start fetch phase)."""
    from engine.native import build_label
    from sim.runner import run_scenario
    from sim.scenario import validate

    data = json.loads(json.dumps(REFERENCE))
    data["workload"]["requests"] = n
    if warm:
        data["warmup"] = {"enabled": True, "node_hbm": True}
    sc = validate(data, source="benchmarks/sim_speed.py")
    c0, t0 = time.process_time(), time.perf_counter()
    res = run_scenario(sc, seed=1)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    s = res.summary
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {
        "requests": n,
        "cpu_s": cpu,
        "wall_s": wall,
        "requests_per_s": n / cpu,
        "requests_per_s_wall": n / wall,
        "events_per_request": s["events_per_request"],
        "peak_rss_mib": rss_mib,
        "completed": s["requests"]["completed"],
        "sim_time_s": s["sim_time_s"],
        "latency_p99_s": s["latency"]["e2e"]["p99"],
        "trace_hash": res.trace_hash,
        "build": build_label(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.warm)))
        return

    def child(n: int, warm: bool = False) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--one", str(n)] + (["--warm"] if warm else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    rows = [child(int(x)) for x in args.sizes.split(",")]
    print(
        f"build: {rows[0]['build']}  (PDSIM_COMPILE=1 pip install . compiles; docs/native-build.md)"
    )
    warm_n = 100000 if 100000 in [r["requests"] for r in rows] else int(rows[0]["requests"])
    warm_row = child(warm_n, warm=True)
    print(
        f"{'requests':>10} {'cpu s':>8} {'wall s':>8} {'req/s cpu':>10} {'req/s wall':>10} "
        f"{'events/req':>10} {'RSS MiB':>8} {'sim s':>8} {'p99 s':>7} trace hash"
    )

    def line(r: dict[str, Any]) -> str:
        return (
            f"{r['requests']:>10} {r['cpu_s']:>8.2f} {r['wall_s']:>8.2f} "
            f"{r['requests_per_s']:>10.0f} {r['requests_per_s_wall']:>10.0f} "
            f"{r['events_per_request']:>10.2f} {r['peak_rss_mib']:>8.0f} "
            f"{r['sim_time_s']:>8.0f} {r['latency_p99_s']:>7.2f} {r['trace_hash'][:12]}"
        )

    for r in rows:
        print(line(r))
    print(
        line(warm_row)
        + "  (for reference: nodes pre-warmed, no cold-start fetch phase; not in the JSON)"
    )
    growth = None
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        growth = (b["cpu_s"] / a["cpu_s"]) / (b["requests"] / a["requests"])
        print(
            f"cpu-time growth / request growth ({a['requests']} -> {b['requests']}): {growth:.2f} "
            "(<= 1 means linear or better)"
        )
    mid = next((r for r in rows if r["requests"] == 100000), rows[len(rows) // 2])
    print(
        json.dumps(
            {
                "requests_per_s": {str(r["requests"]): round(r["requests_per_s"], 1) for r in rows},
                "requests_per_s_wall": {
                    str(r["requests"]): round(r["requests_per_s_wall"], 1) for r in rows
                },
                "events_per_request": round(mid["events_per_request"], 3),
                "peak_rss_mib": round(max(r["peak_rss_mib"] for r in rows), 1),
                "growth": None if growth is None else round(growth, 3),
                "build": rows[0]["build"],
            }
        )
    )


if __name__ == "__main__":
    main()
