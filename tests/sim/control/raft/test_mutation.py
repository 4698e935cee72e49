"""Mutation testing of sim/control/raft through `pdsim chaos`: the checkers must kill planted bugs.

Each mutant of :mod:`tests.sim.control.raft.mutants` is patched in (in-process, no file edits) and run
through the chaos runner (:func:`sim.study.chaos.run_seed`, what ``pdsim chaos`` runs per seed) on
``scenarios/raft-stress.yaml``, seeds 1..200, stopping at the first failing seed. The slow test
prints the table mutant | first failing seed | checker and asserts the kill rate.
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

SCENARIO = Path(__file__).resolve().parents[4] / "scenarios" / "raft-stress.yaml"
SEEDS = 200
#: the five bugs random-fault seeds missed before (issue 22); each must be killed
MUST_KILL = {
    "commit-checks-last-term",
    "stale-append-reply-accepted",
    "no-stepdown-on-append-reply",
    "stale-append-resets-timer",
    "next-index-past-hint",
}


def _prop(finding: str) -> str:
    """The property of a finding's text ``t=...s Prop: detail``."""
    return finding.split(" ", 1)[1].split(":", 1)[0]


def first_failure(m: Mutant, seeds: int = SEEDS) -> tuple[int, str] | None:
    """(first failing seed, checker property) of mutant ``m``, or None if it survives."""
    sc = chaos_scenario(load_scenario(SCENARIO))
    data = resolved_dict(sc)
    with m.applied():
        for seed in range(1, seeds + 1):
            row = run_seed(data, sc.source, seed, None, False)
            if not row["ok"]:
                return seed, _prop((row["violations"] + row["liveness"])[0])
    return None


def test_the_catalogue_is_fifteen_distinct_single_point_mutants() -> None:
    assert len(MUTANTS) >= 15
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.name for m in MUTANTS} >= MUST_KILL
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
def test_chaos_kills_at_least_14_of_15_raft_mutants(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    rows = [(m, first_failure(m)) for m in MUTANTS]
    wall = time.perf_counter() - t0
    lines = [f"{'mutant':32} | first failing seed | checker", "-" * 80]
    for m, hit in rows:
        seed, prop = hit if hit is not None else ("survived", "-")
        lines.append(f"{m.name:32} | {seed!s:18} | {prop}")
    survivors = [m.name for m, hit in rows if hit is None]
    lines.append(
        f"killed {len(rows) - len(survivors)}/{len(rows)} in {wall:.0f} s; "
        f"survived: {', '.join(survivors) or 'none'}"
    )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(rows) - len(survivors) >= 14, survivors
    assert not MUST_KILL & set(survivors), survivors
    for m, hit in rows:
        if m.kind == "liveness" and hit is not None:
            assert hit[1].startswith("Liveness"), (m.name, hit)
