"""Speed of the standalone Raft metadata service simulation (sim.control.raft).

Two figures, both on one core (rates divide by the process CPU time, so other jobs on the
machine do not distort them; wall rates are printed too):

* ``sim_seconds_per_wall_second`` -- simulated seconds per second of a 5-replica group under
  steady client load (4 closed-loop clients) with the random fault process of
  :mod:`sim.control.raft.nemesis` (leader crashes, restarts, partitions, 5% loss, 2% duplication) and the
  online safety checkers on; the offline linearizability check is off for this row;
* ``seeds_per_minute`` -- complete random-fault seeds as the tests run them (3- and
  5-replica groups alternately, 4 s of faults + 1.5 s settling, all checkers including the
  Wing-Gong linearizability check).

Prints a table; the LAST line is one JSON object::

    {"sim_seconds_per_wall_second": ..., "seeds_per_minute": ...}

Run: ``python benchmarks/raft_speed.py`` (``--quick`` for a short run). Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time

from sim.control.raft.nemesis import ChaosConfig, run_seed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter run (about 10 s)")
    args = ap.parse_args()
    duration = 20.0 if args.quick else 60.0
    n_seeds = 30 if args.quick else 100

    cfg = ChaosConfig(n=5, clients=4, duration=duration, linearizability=False)
    c0, w0 = time.process_time(), time.perf_counter()
    r = run_seed(12345, cfg)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    sim_s = r.sim_time
    steady = {
        "sim_s": sim_s,
        "cpu_s": cpu,
        "wall_s": wall,
        "acked": r.acked,
        "messages": r.messages,
        "faults": r.faults,
        "leaders": r.leaders,
        "violations": len(r.violations),
    }

    c0, w0 = time.process_time(), time.perf_counter()
    bad = 0
    for s in range(n_seeds):
        rs = run_seed(s, ChaosConfig(n=3 if s % 2 == 0 else 5))
        bad += not rs.ok
    seeds_cpu, seeds_wall = time.process_time() - c0, time.perf_counter() - w0

    print("Raft metadata service (sim.control.raft), one core")
    print(f"{'figure':44} {'per CPU-s':>12} {'per wall-s':>12}")
    print(
        f"{'simulated s (5 replicas, load + faults)':44} {sim_s / cpu:12.1f} {sim_s / wall:12.1f}"
    )
    print(f"{'  acknowledged client ops':44} {r.acked / cpu:12,.0f} {r.acked / wall:12,.0f}")
    print(f"{'  messages sent':44} {r.messages / cpu:12,.0f} {r.messages / wall:12,.0f}")
    print(
        f"{'fault seeds checked (per minute)':44} "
        f"{60 * n_seeds / seeds_cpu:12.0f} {60 * n_seeds / seeds_wall:12.0f}"
    )
    print(
        f"steady run: {sim_s:.0f} simulated s, {r.faults} faults, {r.leaders} leader terms, "
        f"{len(r.violations)} violations; seeds: {n_seeds} checked, {bad} with violations"
    )
    print(
        json.dumps(
            {
                "sim_seconds_per_wall_second": round(sim_s / cpu, 2),
                "seeds_per_minute": round(60 * n_seeds / seeds_cpu, 1),
                "sim_seconds_per_wall_second_wall": round(sim_s / wall, 2),
                "seeds_per_minute_wall": round(60 * n_seeds / seeds_wall, 1),
                "steady": steady,
                "seeds_checked": n_seeds,
                "seeds_with_violations": bad,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
