"""The mutation harness itself: every catalogued mutant applies and restores cleanly, a
module-level function is replaced wherever it was imported, and the pytest route kills a
mutant its tests catch and lets a harmless one survive."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.policy.lru import LRUPolicy
from tests.mutation.__main__ import run_one
from tests.mutation.catalogue import PACKAGES, catalogue, find
from tests.mutation.mutant import Mutant

ROOT = Path(__file__).resolve().parents[2]
ALL = [(p, m) for p in PACKAGES for m in catalogue(p)]


def test_catalogues_hold_distinct_single_line_mutants_with_tests() -> None:
    for p in PACKAGES:
        names = [m.name for m in catalogue(p)]
        assert len(names) == len(set(names)) >= 10, p
    for _, m in ALL:
        assert m.doc and m.old != m.new and m.tests
        assert m.new.count("\n") - m.old.count("\n") <= 1  # one line changed or added
        missing = [t for t in m.tests if not (ROOT / t.partition("::")[0]).exists()]
        assert not missing, f"{m.name}: no such test file {missing}"  # else pytest exits 4


@pytest.mark.parametrize(("p", "m"), ALL, ids=[f"{p}:{m.name}" for p, m in ALL])
def test_each_mutant_patches_in_and_restores_the_original(p: str, m: Mutant) -> None:
    orig = m.owner.__dict__[m.method]
    assert find(f"{p}:{m.name}") is m
    with m.applied():
        patched = m.owner.__dict__[m.method]
        fn = getattr(patched, "__func__", patched)
        assert patched is not orig and fn.__code__.co_filename.startswith("<mutant")
    assert m.owner.__dict__[m.method] is orig


@pytest.mark.slow
def test_the_pytest_route_kills_a_caught_mutant_and_keeps_a_harmless_one() -> None:
    m = find("engine:lru-victim-ignores-pins")
    outcome, _, failed = run_one("engine", m, list(m.tests))
    assert outcome == "killed" and "test_lru.py" in failed
    outcome, _, _ = run_one("engine", m, ["tests/engine/test_units.py"])
    assert outcome == "survived"  # tests that never touch LRU cannot kill it


def test_a_method_calling_super_runs_mutated_with_its_class() -> None:
    """The zero-argument super() of a mutated method still finds the owner class."""
    m = Mutant(
        "pinned-evict-none",
        "with a pin, evict returns nothing when the base class picks the oldest unpinned key",
        LRUPolicy,
        "evict",
        "return super().evict(now, pinned)",
        "return None if super().evict(now, pinned) == 'b' else 'x'",
        "policy",
        ("tests/engine/policy/test_lru.py",),
    )
    p = LRUPolicy()
    for k in "abc":
        p.insert(k, 1, 0.0)
    with m.applied():
        assert p.evict(0.0, pinned={"a"}) is None  # super() ran: it removed "b"
    assert list(p) == ["a", "c"] and p.evict(0.0, pinned={"a"}) == "c"
