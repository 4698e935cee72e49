"""Experts as parameter chunks: the comparison of ``scenarios/expert-offload.yaml``.

Runs every variant of the scenario (HBM expert budget 25% / 50% / 100% x LRU / LRU-K x expert
prefetch off / on) with one seed through :func:`sim.runner.run_scenario` (what ``pdsim run``
does), prints per variant the mean and P99 TPOT, the expert hit rate and the expert bytes
moved, and draws them against the budget (:func:`sim.study.expertplot.expert_plot`).
Figures are simulated time and counts, so they do not depend on the machine's speed.

Prints a table; the LAST line is one JSON object::

    {"variants": {"hbm25-lru": {"tpot_mean_ms": ..., "hit_rate": ..., "bytes_moved_gib": ...}}}

Run: ``python benchmarks/expert_offload.py [--seed 0] [--plot runs/expert-offload.png]``
(a few minutes on two cores; progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.study.expertplot import expert_plot, expert_rows

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "expert-offload.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=Path("runs") / "expert-offload.png")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    sc = load_scenario(args.scenario, args.sets)

    def progress(frac: float, label: str) -> None:
        print(f"\r{100 * frac:5.1f}%  {label:60s}", end="", file=sys.stderr, flush=True)

    res = run_scenario(sc, seed=args.seed, progress=progress)
    print(file=sys.stderr)
    rows = expert_rows(sc, res.summary)
    t = Table(title=f"{sc.name}, seed {args.seed} (expert counters: whole run)")
    for c in ("variant", "budget", "policy", "prefetch", "TPOT mean", "TPOT p99", "hit rate"):
        t.add_column(c, justify="right")
    t.add_column("bytes moved", justify="right")
    t.add_column("demand / prefetched", justify="right")
    for r in rows:
        t.add_row(
            r["variant"],
            f"{100 * r['budget']:.0f}%",
            r["policy"],
            "on" if r["prefetch"] else "off",
            f"{1e3 * r['tpot_mean_s']:.1f} ms",
            f"{1e3 * r['tpot_p99_s']:.1f} ms",
            f"{r['hit_rate']:.3f}",
            f"{r['bytes_moved'] / 2**30:.1f} GiB",
            f"{r['demand_fetched']} / {r['prefetched']}",
        )
    Console(width=140).print(t)
    path = expert_plot(rows, args.plot, f"{sc.name}: Qwen3-30B-A3B on one H200, seed {args.seed}")
    print(f"plot: {path}")
    print(
        json.dumps(
            {
                "variants": {
                    r["variant"]: {
                        "tpot_mean_ms": round(1e3 * r["tpot_mean_s"], 3),
                        "hit_rate": round(r["hit_rate"], 4),
                        "bytes_moved_gib": round(r["bytes_moved"] / 2**30, 2),
                    }
                    for r in rows
                },
                "trace_hash": res.trace_hash,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
