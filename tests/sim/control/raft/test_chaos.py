"""Random fault seeds: zero checker violations for correct Raft, the planted figure 8 bug
caught, and determinism of the event trace."""

from __future__ import annotations

import pytest

from sim.control.raft.nemesis import ChaosConfig, SeedResult, run_seed


def _cfg(seed: int, **kw: object) -> ChaosConfig:
    # alternate group sizes 3 and 5; crashes, restarts, partitions, loss and duplication on
    return ChaosConfig(n=3 if seed % 2 == 0 else 5, **kw)  # type: ignore[arg-type]


def _describe(bad: list[SeedResult]) -> str:
    return "; ".join(
        f"seed {r.seed}: {[str(v) for v in r.violations[:2]]} nonlin={r.non_linearizable_keys}"
        for r in bad[:3]
    )


def test_200_random_fault_seeds_have_no_violations() -> None:
    results = [run_seed(s, _cfg(s)) for s in range(200)]
    bad = [r for r in results if not r.ok]
    assert not bad, _describe(bad)
    # the runs really exercised faults, elections and client traffic
    assert sum(r.faults for r in results) > 200 * 10
    assert sum(r.leaders for r in results) > 200 * 5
    assert sum(r.acked for r in results) > 200 * 100
    assert sum(r.linearizability_checked for r in results) >= 190


def test_planted_bug_is_caught_within_200_seeds() -> None:
    caught = None
    for s in range(200):
        r = run_seed(s, _cfg(s, unsafe_commit_old_terms=True))
        if not r.ok:
            caught = r
            break
    assert caught is not None, "the figure 8 bug went unnoticed in 200 seeds"
    props = {v.prop for v in caught.violations}
    assert props & {"Leader Completeness", "State Machine Safety", "Acknowledged write lost"}


def test_same_seed_same_trace_hash() -> None:
    first = [run_seed(s, _cfg(s)).trace_hash for s in range(20)]
    again = [run_seed(s, _cfg(s)).trace_hash for s in range(20)]
    assert first == again
    assert len(set(first)) == 20  # and different seeds really differ


@pytest.mark.slow
def test_2000_random_fault_seeds_have_no_violations() -> None:
    bad = [r for r in (run_seed(s, _cfg(s)) for s in range(2000)) if not r.ok]
    assert not bad, _describe(bad)


@pytest.mark.slow
def test_planted_bug_caught_often() -> None:
    hits = sum(not run_seed(s, _cfg(s, unsafe_commit_old_terms=True)).ok for s in range(400))
    assert hits >= 20
