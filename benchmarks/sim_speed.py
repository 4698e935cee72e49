"""Simulator speed on the reference scenario (issue 4): 16 compute nodes, 4 parameter servers,
a LLaMA-2-7B-shaped model, default policies (LRU caches, least-loaded placement, prefetch
window 3, parameter-server warm-up; nodes start cold and fetch their weights), Poisson
arrivals at 200 req/s.

Each size runs in a fresh subprocess so peak RSS is per size. Prints a table, then as the
LAST line one JSON object:
``{"requests_per_s": {"10000": ..., "100000": ..., "1000000": ...}, "events_per_request": ...,
"peak_rss_mib": ...}`` (events per request of the 100k run; the largest peak RSS).
Usage: ``python benchmarks/sim_speed.py [--sizes 10000,100000,1000000]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

REFERENCE = {
    "name": "reference",
    "profile": "a100-80gb",
    "deployments": [{"model": "llama-2-7b"}],
    "cluster": {"nodes": 16, "param_servers": 4, "node": {"host": "64GiB", "max_batch": 64}},
    "workload": {
        "kind": "poisson",
        "rate": 200.0,
        "input_tokens": {"dist": "lognormal", "mean": 512, "sigma": 0.6, "low": 16, "high": 4096},
        "output_tokens": {"dist": "lognormal", "mean": 128, "sigma": 0.6, "low": 4, "high": 1024},
    },
}


def one(n: int, warm: bool = False) -> dict[str, float]:
    """Run the reference scenario with ``n`` requests in this process; return its figures.
    ``warm``: nodes start with the model in HBM (no cold-start fetch phase)."""
    from sim.runner import run_scenario
    from sim.scenario import validate

    data = json.loads(json.dumps(REFERENCE))
    data["workload"]["requests"] = n
    if warm:
        data["warmup"] = {"enabled": True, "node_hbm": True}
    sc = validate(data, source="benchmarks/sim_speed.py")
    t0 = time.perf_counter()
    res = run_scenario(sc, seed=1)
    wall = time.perf_counter() - t0
    s = res.summary
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {
        "requests": n,
        "wall_s": wall,
        "requests_per_s": n / wall,
        "events_per_request": s["events_per_request"],
        "peak_rss_mib": rss_mib,
        "completed": s["completed"],
        "sim_time_s": s["sim_time_s"],
        "latency_p99_s": s["latency"]["p99"],
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

    def child(n: int, warm: bool = False) -> dict[str, float]:
        cmd = [sys.executable, __file__, "--one", str(n)] + (["--warm"] if warm else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    rows = [child(int(x)) for x in args.sizes.split(",")]
    warm_n = 100000 if 100000 in [r["requests"] for r in rows] else int(rows[0]["requests"])
    warm_row = child(warm_n, warm=True)
    print(
        f"{'requests':>10} {'wall s':>8} {'req/s':>9} {'events/req':>10} {'RSS MiB':>8} "
        f"{'sim s':>8} {'p99 s':>7}"
    )
    for r in rows:
        print(
            f"{r['requests']:>10} {r['wall_s']:>8.2f} {r['requests_per_s']:>9.0f} "
            f"{r['events_per_request']:>10.2f} {r['peak_rss_mib']:>8.0f} "
            f"{r['sim_time_s']:>8.0f} {r['latency_p99_s']:>7.2f}"
        )
    print(
        f"{warm_n:>10} {warm_row['wall_s']:>8.2f} {warm_row['requests_per_s']:>9.0f} "
        f"{warm_row['events_per_request']:>10.2f} {warm_row['peak_rss_mib']:>8.0f} "
        f"{warm_row['sim_time_s']:>8.0f} {warm_row['latency_p99_s']:>7.2f}  "
        "(for reference: nodes pre-warmed, no cold-start fetch phase; not in the JSON)"
    )
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        growth = (b["wall_s"] / a["wall_s"]) / (b["requests"] / a["requests"])
        print(
            f"wall-time growth / request growth ({a['requests']} -> {b['requests']}): {growth:.2f} "
            "(<= 1 means linear or better)"
        )
    mid = next((r for r in rows if r["requests"] == 100000), rows[len(rows) // 2])
    print(
        json.dumps(
            {
                "requests_per_s": {str(r["requests"]): round(r["requests_per_s"], 1) for r in rows},
                "events_per_request": round(mid["events_per_request"], 3),
                "peak_rss_mib": round(max(r["peak_rss_mib"] for r in rows), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
