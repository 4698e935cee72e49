"""Mutation testing of sim/control/raft through `pdsim chaos`: the checkers must kill planted bugs.

Each mutant of :mod:`tests.sim.control.raft.mutants` is patched in (in-process, no file edits) and run
through the chaos runner (:func:`sim.study.chaos.run_seed`, what ``pdsim chaos`` runs per seed) on
``scenarios/raft-stress.yaml``, seeds 1..200, then (if it survived) on
``scenarios/raft-stress-small-batch.yaml`` (the same with 2-entry AppendEntries batches), seeds
1..200, stopping at the first failing seed. The slow test prints the table
mutant | scenario | first failing seed | checker and asserts that every mutant is killed.
The pytest route (each mutant through its targeted test files) is ``python -m tests.mutation``.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import pytest

from sim.control.raft.node import RaftNode
from sim.scenario import load_scenario, resolved_dict
from sim.study.chaos import chaos_scenario, run_seed

from .mutants import MUTANTS, Mutant

SCEN = Path(__file__).resolve().parents[4] / "scenarios"
SCENARIOS = (SCEN / "raft-stress.yaml", SCEN / "raft-stress-small-batch.yaml")
SEEDS = 200
#: the five bugs random-fault seeds missed before (issue 22); each must be killed
MUST_KILL = {
    "commit-checks-last-term",
    "stale-append-reply-accepted",
    "no-stepdown-on-append-reply",
    "stale-append-resets-timer",
    "next-index-past-hint",
}
#: the bug only short append batches show (issue 41)
SMALL_BATCH_ONLY = "follower-commits-past-match"


def _prop(finding: str) -> str:
    """The property of a finding's text ``t=...s Prop: detail``."""
    return finding.split(" ", 1)[1].split(":", 1)[0]


def first_failure(m: Mutant, seeds: int = SEEDS) -> tuple[str, int, str] | None:
    """(scenario, first failing seed, checker property) of mutant ``m`` over
    :data:`SCENARIOS` in order, or None if it survives them all."""
    for path in SCENARIOS:
        sc = chaos_scenario(load_scenario(path))
        data = resolved_dict(sc)
        with m.applied():
            for seed in range(1, seeds + 1):
                row = run_seed(data, sc.source, seed, None, False)
                if not row["ok"]:
                    return path.stem, seed, _prop((row["violations"] + row["liveness"])[0])
    return None


def test_small_batches_catch_the_follower_commit_bug() -> None:
    """raft-stress-small-batch seed 10 passes on the real code and fails with the mutant that
    commits up to min(leaderCommit, last index); raft-stress seed 10 passes with it."""
    m = next(m for m in MUTANTS if m.name == SMALL_BATCH_ONLY)

    def row(path: Path) -> dict[str, object]:
        sc = chaos_scenario(load_scenario(path))
        return run_seed(resolved_dict(sc), sc.source, 10, None, False)

    assert row(SCENARIOS[1])["ok"]
    with m.applied():
        assert row(SCENARIOS[0])["ok"]
        bad = row(SCENARIOS[1])
    found = [*bad["violations"], *bad["liveness"]]  # type: ignore[misc]
    assert not bad["ok"] and _prop(found[0]) == "State Machine Safety", found


def test_the_catalogue_is_fifteen_distinct_single_point_mutants() -> None:
    assert len(MUTANTS) >= 15
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.name for m in MUTANTS} >= MUST_KILL | {SMALL_BATCH_ONLY}
    for m in MUTANTS:
        assert m.doc and m.old != m.new
        assert m.new.count("\n") - m.old.count("\n") <= 1  # one line changed or added
        assert m.kind in ("safety", "liveness")


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_patches_in_and_restores_the_original(m: Mutant) -> None:
    orig = m.owner.__dict__[m.method]
    assert m.old in inspect.getsource(orig)
    with m.applied():
        patched = m.owner.__dict__[m.method]
        assert patched is not orig and patched.__code__.co_filename.startswith("<mutant")
        if isinstance(m.owner, type) and issubclass(RaftNode, m.owner):
            # the replica really runs the mutant: no class between RaftNode and the
            # owner (in the MRO) defines the method
            assert getattr(RaftNode, m.method) is patched
    assert m.owner.__dict__[m.method] is orig


@pytest.mark.slow
def test_chaos_kills_every_raft_mutant(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    rows = [(m, first_failure(m)) for m in MUTANTS]
    wall = time.perf_counter() - t0
    lines = [f"{'mutant':32} | {'scenario':23} | first failing seed | checker", "-" * 100]
    for m, hit in rows:
        scen, seed, prop = hit if hit is not None else ("-", "survived", "-")
        lines.append(f"{m.name:32} | {scen:23} | {seed!s:18} | {prop}")
    survivors = [m.name for m, hit in rows if hit is None]
    lines.append(
        f"killed {len(rows) - len(survivors)}/{len(rows)} in {wall:.0f} s; "
        f"survived: {', '.join(survivors) or 'none'}"
    )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert survivors == [], survivors
    hits = {m.name: hit for m, hit in rows}
    assert hits[SMALL_BATCH_ONLY] is not None
    assert hits[SMALL_BATCH_ONLY][0] == "raft-stress-small-batch"
    for m, hit in rows:
        if m.kind == "liveness" and hit is not None:
            assert hit[2].startswith("Liveness"), (m.name, hit)
