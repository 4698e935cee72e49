"""Accesses per second of every registered eviction policy through the trace-replay loop.

Workload: a seeded Zipf(alpha) trace of independent references (default 1M accesses over 100k
unit-size objects) replayed with a cache of 10% of the objects, one policy at a time, through
:func:`engine.replay.replay` -- the same code path as ``pdsim cache replay`` (TierCache.access
per access). The replay is single-threaded, so it runs on one core; ``accesses_per_s`` divides
by the process's CPU time (one core's speed even on a shared machine), ``wall_accesses_per_s``
by wall time. Optionally also prints the
miss ratios of every policy on a Mooncake trace (``--mooncake``, default: the slice shipped
in the package, ``engine/data/traces/mooncake_slice.jsonl``).

Prints a table; the LAST line is one JSON object::

    {"accesses_per_s": {"lru": ..., "lru-k": ..., ...}, "miss_ratio": {...}, ...}

Run: ``python benchmarks/cache_replay.py`` (``--accesses 200000`` for a quick run).
Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from engine.policy import policy_names
from engine.replay import replay
from engine.traces import Trace, example_trace, read_trace

DEFAULT_MOONCAKE = example_trace()  # the Mooncake slice shipped in the package
MOONCAKE_FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)


def zipf_trace(accesses: int, objects: int, alpha: float, seed: int) -> Trace:
    """Independent references: key ``r`` (rank, 0 = hottest) with probability ~ 1/(r+1)^alpha."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, objects + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    keys = np.searchsorted(cdf, rng.random(accesses), side="right").astype(np.int64)
    keys = np.minimum(keys, objects - 1)  # guard against cdf[-1] rounding below 1.0
    return Trace(
        time=np.arange(accesses, dtype=np.float64),
        key=keys,
        size=np.ones(accesses, dtype=np.int64),
        source=f"zipf(alpha={alpha}, objects={objects}, seed={seed})",
    )


def measure(trace: Trace, names: list[str], capacity: int) -> dict[str, tuple[float, float, float]]:
    """``{policy: (accesses/s of CPU time, accesses/s of wall time, miss ratio)}``.

    One replay per policy. The headline figure divides by the process's CPU time, which is the
    speed of one core even when other processes share the machine; wall time is shown too.
    """
    out: dict[str, tuple[float, float, float]] = {}
    for name in names:
        c0, t0 = time.process_time(), time.perf_counter()
        df = replay(trace, [name], [capacity])
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        n = len(trace)
        out[name] = (n / max(cpu, 1e-9), n / max(wall, 1e-9), float(df["miss_ratio"].iloc[0]))
    return out


def mooncake_table(path: Path, names: list[str]) -> dict[str, dict[str, float]]:
    """Miss ratios per policy at fractions of the Mooncake trace's unique bytes."""
    trace = read_trace(path)
    unique = trace.unique_bytes()
    sizes = [max(1, round(unique * f)) for f in MOONCAKE_FRACTIONS]
    df = replay(trace, names, sizes)
    out: dict[str, dict[str, float]] = {}
    for row in df.itertuples(index=False):
        frac = f"{row.cache_bytes / unique:.2f}"
        out.setdefault(str(row.policy), {})[frac] = round(float(row.miss_ratio), 5)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=1_000_000, help="trace length")
    ap.add_argument("--objects", type=int, default=100_000, help="distinct unit-size objects")
    ap.add_argument("--cache-fraction", type=float, default=0.10, help="cache size / objects")
    ap.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--policy", default=None, help="comma list (default: all registered)")
    ap.add_argument(
        "--mooncake",
        type=Path,
        default=DEFAULT_MOONCAKE,
        help="Mooncake JSONL trace for a miss-ratio table (default: the shipped slice)",
    )
    ap.add_argument("--no-mooncake", action="store_true", help="skip the Mooncake table")
    args = ap.parse_args(argv)

    names = (
        [p for p in policy_names() if p != "none"]
        if args.policy is None
        else [p.strip() for p in args.policy.split(",") if p.strip()]
    )
    capacity = max(1, round(args.objects * args.cache_fraction))
    trace = zipf_trace(args.accesses, args.objects, args.alpha, args.seed)
    results = measure(trace, names, capacity)

    console = Console(highlight=False)
    table = Table(
        title=(
            f"replay speed: Zipf({args.alpha}) {args.accesses:,} accesses, {args.objects:,} "
            f"unit objects, cache {capacity:,} objects, one core"
        ),
        title_justify="left",
    )
    table.add_column("policy")
    table.add_column("accesses/s (CPU)", justify="right")
    table.add_column("accesses/s (wall)", justify="right")
    table.add_column("miss ratio", justify="right")
    for name, (rate, wall, mr) in results.items():
        table.add_row(name, f"{rate / 1e6:.3f} M/s", f"{wall / 1e6:.3f} M/s", f"{mr:.4f}")
    console.print(table)

    summary: dict[str, Any] = {
        "accesses_per_s": {n: round(r) for n, (r, _, _) in results.items()},
        "wall_accesses_per_s": {n: round(w) for n, (_, w, _) in results.items()},
        "miss_ratio": {n: round(mr, 5) for n, (_, _, mr) in results.items()},
        "accesses": args.accesses,
        "objects": args.objects,
        "cache_objects": capacity,
        "alpha": args.alpha,
        "seed": args.seed,
    }
    if args.mooncake is not None and not args.no_mooncake:
        mc = mooncake_table(args.mooncake, names)
        mt = Table(
            title=f"miss ratio on {args.mooncake.name} (cache = fraction of unique bytes)",
            title_justify="left",
        )
        mt.add_column("policy")
        fracs = list(next(iter(mc.values())))
        for f in fracs:
            mt.add_column(f, justify="right")
        for name, row in mc.items():
            mt.add_row(name, *(f"{row[f]:.4f}" for f in fracs))
        console.print(mt)
        summary["mooncake_miss_ratio"] = mc
    # The last line: one JSON object with the figures.
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
