"""The mutation harness's catalogues: package name -> its single-point mutants.

* ``raft`` -- :data:`tests.sim.control.raft.mutants.MUTANTS` (the chaos route runs them
  through ``pdsim chaos``; here, through their targeted tests);
* ``engine`` -- :data:`tests.mutation.engine_mutants.MUTANTS` (every eviction policy, the
  tier chain, the KV block allocator and admission, the hash ring, heat map and prefetch);
* ``serving`` -- :data:`tests.mutation.serving_mutants.MUTANTS` (admission and the token
  budget, chunked prefill, KV growth, preemption by recompute and swap, metrics windows).
"""

from __future__ import annotations

from tests.mutation.mutant import Mutant


def catalogue(package: str) -> list[Mutant]:
    """The mutants of ``package`` (one of :data:`PACKAGES`)."""
    if package == "raft":
        from tests.sim.control.raft.mutants import MUTANTS as raft

        return raft
    if package == "engine":
        from tests.mutation.engine_mutants import MUTANTS as engine

        return engine
    if package == "serving":
        from tests.mutation.serving_mutants import MUTANTS as serving

        return serving
    raise KeyError(f"unknown package {package!r}; allowed: {', '.join(PACKAGES)}")


PACKAGES = ("raft", "engine", "serving")


def find(spec: str) -> Mutant:
    """The mutant ``package:name``."""
    package, _, name = spec.partition(":")
    for m in catalogue(package):
        if m.name == name:
            return m
    raise KeyError(f"no mutant {name!r} in {package!r}")
