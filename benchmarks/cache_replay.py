"""Replay speed of every eviction policy against a plain OrderedDict LRU loop (and libCacheSim).

Workload: a seeded Zipf(alpha) trace of independent references (default 1M accesses over 100k
unit-size objects) generated here, replayed with a cache of 10% of the objects. In ONE run, on
the same keys, it times:

* ``plain`` -- the loop a researcher would write: one ``OrderedDict``, ``move_to_end`` on a
  hit, insert and ``popitem(last=False)`` until the bytes fit on a miss;
* every pdsim policy through :func:`engine.missratio.replay` -- the code path of
  ``pdsim cache replay`` (trace batches, ``TierCache.access_many``, the policy objects);
* libCacheSim's C ``LRU`` through its Python wheel (``process_trace`` over the same keys
  written as an oracleGeneral file), when ``libcachesim`` is installed; it is optional and
  the output says when it is missing.

Each contender runs ``--repeats`` times, interleaved, and keeps its best CPU time (process
time: one core's speed even when other processes share the machine). The ratio of a policy
is its accesses/s divided by the plain loop's, both measured in this run. A second table
gives miss ratios on the Mooncake slice shipped in the package
(``engine/data/traces/mooncake_slice.jsonl``; ``--trace`` replays another file instead).

Prints tables; the LAST line is one JSON object::

    {"ratio_to_plain_lru": {"lru": ..., "lru-k": ...}, "accesses_per_s": {...}, ...}

Run: ``python benchmarks/cache_replay.py`` (``--accesses 200000`` for a quick run).
Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from engine.missratio import replay
from engine.policy import policy_names
from engine.traces import Trace, example_trace, read_trace, write_oracle

TRACE_FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)


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


def plain_lru_misses(keys: list[int], sizes: list[int], capacity: int) -> int:
    """Byte-capacity LRU in one OrderedDict; objects larger than the cache are not admitted."""
    od: OrderedDict[int, int] = OrderedDict()
    used = misses = 0
    for k, s in zip(keys, sizes, strict=True):
        if k in od:
            od.move_to_end(k)
            continue
        misses += 1
        if s > capacity:
            continue
        od[k] = s
        used += s
        while used > capacity:
            used -= od.popitem(last=False)[1]
    return misses


def libcachesim_lru(path: Path, capacity: int) -> Callable[[], float] | None:
    """A run of libCacheSim's LRU over oracleGeneral ``path`` returning its miss ratio."""
    try:
        import libcachesim as lcs  # optional: pip install libcachesim
    except ImportError:
        return None

    def run() -> float:
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
        cache = lcs.LRU(cache_size=capacity)
        return float(cache.process_trace(reader)[0])

    return run


def best_cpu(
    contenders: dict[str, Callable[[], float]], repeats: int
) -> dict[str, tuple[float, float]]:
    """``{name: (best CPU seconds, miss ratio)}``, running the contenders interleaved."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for name, fn in contenders.items():
            c0 = time.process_time()
            mr = fn()
            cpu = max(time.process_time() - c0, 1e-9)
            if name not in best or cpu < best[name][0]:
                best[name] = (cpu, mr)
    return best


def trace_table(path: Path, names: list[str]) -> dict[str, dict[str, float]]:
    """Miss ratios per policy at fractions of a trace's unique bytes."""
    trace = read_trace(path)
    unique = trace.unique_bytes()
    sizes = sorted({max(1, int(unique * f)) for f in TRACE_FRACTIONS})
    df = replay(trace, names, sizes)
    out: dict[str, dict[str, float]] = {}
    for row in df.itertuples(index=False):
        frac = f"{row.cache_bytes / unique:.3f}"
        out.setdefault(str(row.policy), {})[frac] = round(float(row.miss_ratio), 6)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=1_000_000, help="trace length")
    ap.add_argument("--objects", type=int, default=100_000, help="distinct unit-size objects")
    ap.add_argument("--cache-fraction", type=float, default=0.10, help="cache size / objects")
    ap.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--repeats", type=int, default=3, help="runs per contender (best kept)")
    ap.add_argument("--policy", default=None, help="comma list (default: all registered)")
    ap.add_argument("--trace", type=Path, default=None, help="trace for the miss-ratio table")
    ap.add_argument("--no-trace", action="store_true", help="skip the miss-ratio table")
    args = ap.parse_args(argv)

    names = (
        [p for p in policy_names() if p != "none"]
        if args.policy is None
        else [p.strip() for p in args.policy.split(",") if p.strip()]
    )
    capacity = max(1, round(args.objects * args.cache_fraction))
    trace = zipf_trace(args.accesses, args.objects, args.alpha, args.seed)
    keys, sizes = trace.key.tolist(), trace.size.tolist()
    n = len(trace)

    def pdsim(name: str) -> Callable[[], float]:
        return lambda: float(replay(trace, [name], [capacity])["miss_ratio"].iloc[0])

    contenders: dict[str, Callable[[], float]] = {
        "plain": lambda: plain_lru_misses(keys, sizes, capacity) / n
    }
    contenders.update({name: pdsim(name) for name in names})
    with tempfile.TemporaryDirectory() as tmp:
        oracle = Path(tmp) / "zipf.oracleGeneral"
        write_oracle(oracle, trace.time.astype(np.int64), trace.key, trace.size)
        lcs_run = libcachesim_lru(oracle, capacity)
        if lcs_run is not None:
            contenders["libcachesim-lru"] = lcs_run
        results = best_cpu(contenders, args.repeats)

    plain_rate = n / results["plain"][0]
    console = Console(highlight=False)
    table = Table(
        title=(
            f"replay speed: Zipf({args.alpha}) {n:,} accesses, {args.objects:,} unit objects, "
            f"cache {capacity:,} objects, one core, best of {args.repeats}"
        ),
        title_justify="left",
    )
    for col in ("contender", "accesses/s (CPU)", "x plain loop", "miss ratio"):
        table.add_column(col, justify="left" if col == "contender" else "right")
    for name, (cpu, mr) in results.items():
        rate = n / cpu
        table.add_row(name, f"{rate / 1e6:.3f} M/s", f"{rate / plain_rate:.3f}", f"{mr:.6f}")
    console.print(table)
    if lcs_run is None:
        console.print("libcachesim: not installed (pip install libcachesim to compare)")

    summary: dict[str, Any] = {
        "plain_lru_accesses_per_s": round(plain_rate),
        "accesses_per_s": {k: round(n / cpu) for k, (cpu, _) in results.items()},
        "ratio_to_plain_lru": {
            k: round(n / cpu / plain_rate, 4) for k, (cpu, _) in results.items() if k != "plain"
        },
        "miss_ratio": {k: round(mr, 6) for k, (_, mr) in results.items()},
        "libcachesim": "installed" if lcs_run is not None else "not installed",
        "accesses": n,
        "objects": args.objects,
        "cache_objects": capacity,
        "alpha": args.alpha,
        "seed": args.seed,
        "repeats": args.repeats,
    }
    if not args.no_trace:
        path = args.trace if args.trace is not None else example_trace()
        mc = trace_table(path, names)
        mt = Table(
            title=f"miss ratio on {path.name} (cache = fraction of unique bytes)",
            title_justify="left",
        )
        mt.add_column("policy")
        fracs = list(next(iter(mc.values())))
        for f in fracs:
            mt.add_column(f, justify="right")
        for name, row in mc.items():
            mt.add_row(name, *(f"{row[f]:.6f}" for f in fracs))
        console.print(mt)
        summary["trace_miss_ratio"] = {"trace": path.name, "by_policy": mc}
    # The last line: one JSON object with the figures.
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
