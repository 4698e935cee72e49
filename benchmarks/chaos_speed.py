"""Speed of chaos runs in the cluster simulator (issue 5).

Two figures, on one core (rates divide by the process CPU time, so other jobs on the
machine do not distort them; wall rates are printed too):

* ``sim_seconds_per_wall_second`` -- simulated seconds per second of ONE run of the default
  chaos scenario (``scenarios/chaos-partition.yaml`` with the random fault process on): the
  cluster streaming ResNet-50 weights from parameter servers, the Raft metadata service over
  the simulated network, integrity checks, and every checker;
* ``seeds_per_minute`` -- complete random-fault seeds (build, run, heal, settle, final checks
  incl. linearizability) of the small chaos cluster the tests use
  (``tests/sim/control/faults/data/chaos-small.yaml``).

Prints a table; the LAST line is one JSON object::

    {"sim_seconds_per_wall_second": ..., "seeds_per_minute": ...}

Run: ``python benchmarks/chaos_speed.py`` (``--quick`` for a shorter run). Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sim.scenario import load_scenario, resolved_dict
from sim.study.chaos import chaos_scenario, run_seed
from sim.study.recording import run_checked

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter run (about 20 s)")
    args = ap.parse_args()
    n_seeds = 20 if args.quick else 100
    requests = 60 if args.quick else 240

    sc = chaos_scenario(
        load_scenario(ROOT / "scenarios/chaos-partition.yaml", [f"workload.requests={requests}"])
    )
    c0, w0 = time.process_time(), time.perf_counter()
    out = run_checked(sc, 12345)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    sim_rate, sim_rate_wall = out.sim_time / cpu, out.sim_time / wall

    small = chaos_scenario(load_scenario(ROOT / "tests/sim/control/faults/data/chaos-small.yaml"))
    data = resolved_dict(small)
    c0, w0 = time.process_time(), time.perf_counter()
    rows = [run_seed(data, small.source, s, None, False) for s in range(n_seeds)]
    cpu2, wall2 = time.process_time() - c0, time.perf_counter() - w0
    spm, spm_wall = n_seeds / cpu2 * 60.0, n_seeds / wall2 * 60.0
    bad = sum(not r["ok"] for r in rows)

    print(f"{'figure':<48} {'per CPU s':>12} {'per wall s':>12}")
    print(f"{'chaos-partition: simulated s per s':<48} {sim_rate:>12.3f} {sim_rate_wall:>12.3f}")
    print(f"{'chaos-small: seeds per minute':<48} {spm:>12.1f} {spm_wall:>12.1f}")
    print(
        f"(one chaos-partition run: {out.sim_time:.2f} simulated s, {len(out.applied)} faults, "
        f"{len(out.findings)} violations; {n_seeds} small seeds: {bad} failing)"
    )
    print(
        json.dumps(
            {"sim_seconds_per_wall_second": round(sim_rate, 4), "seeds_per_minute": round(spm, 2)}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
