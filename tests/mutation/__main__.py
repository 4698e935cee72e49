"""Run mutants through their targeted tests: ``python -m tests.mutation [options]``.

For each selected mutant, one ``pytest -x`` process runs with the mutant patched in
(:mod:`tests.mutation.plugin`) on the mutant's ``tests`` (or ``--tests``): a failing test
kills it (pytest exit 1), all passing lets it survive (exit 0); any other exit status
(collection error, a mutant that no longer applies) is reported as ``error``. Prints one row
per mutant and the kill rate per package; ``--json`` also writes the rows.

Examples (from the repository root, with the project's Python):

    python -m tests.mutation --package engine                  # every engine mutant
    python -m tests.mutation --mutant raft:stale-append-resets-timer \
        --tests tests/sim/control/raft/test_stale_messages.py
    nice -n 15 python -m tests.mutation --package raft --package engine --package serving

A full run is one pytest process per mutant (several seconds to a minute each on the targeted
files); the Raft mutants' chaos route is the slow test
``tests/sim/control/raft/test_mutation.py`` (``pytest -m slow -k mutation -s``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.mutation.catalogue import PACKAGES, catalogue, find
from tests.mutation.mutant import Mutant

ROOT = Path(__file__).resolve().parents[2]


def run_one(package: str, m: Mutant, tests: list[str]) -> tuple[str, float, str]:
    """(outcome, CPU seconds of the pytest process, first failing test) of ``m``."""
    env = {**os.environ, "PDSIM_MUTANT": f"{package}:{m.name}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    before = os.times()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "tests.mutation.plugin", *tests]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    failed = next((ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")), "")
    outcome = {0: "survived", 1: "killed"}.get(proc.returncode, f"error ({proc.returncode})")
    if outcome.startswith("error"):
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        failed = tail[-1][:120] if tail else ""
    return outcome, cpu, failed.removeprefix("FAILED ")[:120]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    ap.add_argument("--package", action="append", choices=PACKAGES, default=[])
    ap.add_argument("--mutant", action="append", default=[], metavar="PACKAGE:NAME")
    ap.add_argument("--tests", nargs="+", default=None, help="override each mutant's tests")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    chosen: list[tuple[str, Mutant]] = [(p, m) for p in args.package for m in catalogue(p)]
    chosen += [(spec.partition(":")[0], find(spec)) for spec in args.mutant]
    if not chosen:
        ap.error("choose mutants with --package or --mutant")
    rows = []
    for package, m in chosen:
        tests = args.tests or list(m.tests)
        if not tests:
            ap.error(f"{package}:{m.name} names no tests; pass --tests")
        t0 = time.perf_counter()
        outcome, cpu, failed = run_one(package, m, tests)
        rows.append(
            {"package": package, "mutant": m.name, "outcome": outcome, "cpu_s": round(cpu, 1),
             "wall_s": round(time.perf_counter() - t0, 1), "killed_by": failed, "tests": tests}
        )  # fmt: skip
        if outcome == "survived" and m.equivalent:
            failed = f"equivalent: {m.equivalent[:90]}"
        print(f"{package:8} {m.name:36} {outcome:10} {cpu:6.1f} s CPU  {failed}", flush=True)
    for package in dict.fromkeys(r["package"] for r in rows):
        mine = [r for r in rows if r["package"] == package]
        killed = sum(r["outcome"] == "killed" for r in mine)
        survivors = [r["mutant"] for r in mine if r["outcome"] != "killed"]
        equiv = sum(find(f"{package}:{n}").equivalent != "" for n in survivors)
        print(
            f"{package}: killed {killed}/{len(mine)} ({equiv} of the rest marked equivalent); "
            f"not killed: {', '.join(survivors) or '-'}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
