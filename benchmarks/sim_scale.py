"""Simulator speed against cluster size (issue 36): the quickstart scenario (single-GPU A100
servers, LLaMA-2-7B, 2 parameter servers, least-loaded placement) at 4, 64, 256, 1,024 and
4,096 servers with the same offered load per server.

Offered load per server is the quickstart's: 5 req/s per server (its 20 req/s over 4 servers)
and ``--per-server`` requests per server (default 25), so every size simulates the same
stretch of arrivals (``per_server / 5`` seconds) and its work grows with the servers only.
The parameter servers stay the quickstart's 2, as ``--set cluster.servers=N`` leaves them.

By default the replicas start with the model in HBM (``warmup.node_hbm``): the steady serving
the headline figures measure, whose cost per event does not depend on the cluster's size.
``--cold`` runs the quickstart as shipped, every replica fetching its weights at t=0; then all
of them fetch at once through the parameter servers' links and every start or end of such a
transfer re-shares those links among all transfers in flight (exact max-min fairness,
:mod:`sim.serving.network`), so a cold start costs O(servers) per transfer event: keep
``--cold`` to a few hundred servers (docs/serving-model.md, "Cost per event").

Each size runs in a fresh subprocess. Rates are per second of CPU time of the whole run
(``time.process_time``, building the cluster included; it leaves out time spent waiting for
a CPU, but other tenants still lower it through shared caches and memory bandwidth). The
target: events per CPU-second at 1,024 servers within 2x of the 4-server figure. Prints a
table, then as the LAST line one JSON object: ``{"servers": [...], "start": "warm"|"cold",
"events": {...}, "requests": {...}, "cpu_s": {...}, "events_per_cpu_s": {...},
"requests_per_cpu_s": {...}, "ratio_4_over_1024": ..., "build": ...}`` (dicts keyed by the
number of servers as a string; the ratio is the 4-server events per CPU-second over the
1,024-server one, ``null`` when either size did not run).
Usage: ``python benchmarks/sim_scale.py [--sizes 4,64,256,1024,4096] [--per-server 25]
[--cold]``; ``--quick`` runs 4 and 16 servers at 4 requests per server (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

PER_SERVER_RATE = 5.0  # quickstart: 20 req/s over 4 servers


def overrides(servers: int, per_server: int, cold: bool) -> list[str]:
    """The quickstart overrides (``KEY=VALUE``) for ``servers`` at the same load per server;
    with the model preloaded in every replica's HBM unless ``cold``."""
    sets = [
        f"cluster.servers={servers}",
        f"workload.rate={PER_SERVER_RATE * servers:g}",
        f"workload.requests={per_server * servers}",
    ]
    return sets if cold else [*sets, "warmup.enabled=true", "warmup.node_hbm=true"]


def one(servers: int, per_server: int, cold: bool) -> dict[str, Any]:
    """Run the quickstart at ``servers`` in this process; return its figures."""
    from engine.native import build_label
    from sim.runner import run_scenario
    from sim.scenario import load_scenario
    from sim.shipped import resolve_scenario

    sc = load_scenario(resolve_scenario("quickstart"), overrides(servers, per_server, cold))
    c0 = time.process_time()
    res = run_scenario(sc, seed=0)
    cpu = max(time.process_time() - c0, 1e-9)
    s = res.summary
    events = int(s["events"])
    requests = int(s["requests"]["completed"])
    return {
        "servers": servers,
        "param_servers": sc.cluster.param_servers,
        "events": events,
        "requests": requests,
        "cpu_s": cpu,
        "events_per_cpu_s": events / cpu,
        "requests_per_cpu_s": requests / cpu,
        "sim_time_s": s["sim_time_s"],
        "trace_hash": res.trace_hash,
        "build": build_label(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,64,256,1024,4096", help="numbers of servers")
    ap.add_argument("--per-server", type=int, default=25, help="requests per server")
    ap.add_argument("--cold", action="store_true", help="replicas fetch their weights at t=0")
    ap.add_argument("--quick", action="store_true", help="4 and 16 servers, 4 requests each")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.per_server, args.cold)))
        return
    if args.quick:
        args.sizes, args.per_server = "4,16", 4

    def child(n: int) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--one", str(n), "--per-server", str(args.per_server)]
        cmd += ["--cold"] if args.cold else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    sizes = [int(x) for x in args.sizes.split(",")]
    start = "cold" if args.cold else "warm"
    print(
        f"quickstart at {PER_SERVER_RATE:g} req/s and {args.per_server} requests per server, "
        f"{start} start"
    )
    print(
        f"{'servers':>8} {'ps':>5} {'events':>10} {'requests':>9} {'cpu s':>8} "
        f"{'events/cpu-s':>12} {'req/cpu-s':>10} {'sim s':>7} trace hash"
    )
    rows = []
    for n in sizes:
        r = child(n)
        rows.append(r)
        print(
            f"{r['servers']:>8} {r['param_servers']:>5} {r['events']:>10} {r['requests']:>9} "
            f"{r['cpu_s']:>8.2f} {r['events_per_cpu_s']:>12.0f} {r['requests_per_cpu_s']:>10.0f} "
            f"{r['sim_time_s']:>7.1f} {r['trace_hash'][:12]}",
            flush=True,
        )
    by = {r["servers"]: r for r in rows}
    ratio = None
    if 4 in by and 1024 in by:
        ratio = by[4]["events_per_cpu_s"] / by[1024]["events_per_cpu_s"]
        print(f"events/cpu-s at 4 servers over 1,024 servers: {ratio:.2f} (target <= 2)")
    print(f"build: {rows[0]['build']}")

    def col(key: str, nd: int) -> dict[str, Any]:
        return {str(r["servers"]): round(r[key], nd) for r in rows}

    print(
        json.dumps(
            {
                "servers": sizes,
                "start": start,
                "events": col("events", 0),
                "requests": col("requests", 0),
                "cpu_s": col("cpu_s", 3),
                "events_per_cpu_s": col("events_per_cpu_s", 1),
                "requests_per_cpu_s": col("requests_per_cpu_s", 1),
                "ratio_4_over_1024": None if ratio is None else round(ratio, 3),
                "build": rows[0]["build"],
            }
        )
    )


if __name__ == "__main__":
    main()
