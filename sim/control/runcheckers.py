"""Checkers that run during every simulation with ``faults.enabled`` (issue 5).

Online (a violation stops the run when ``stop_on_violation``, by raising
:class:`CheckerViolation` out of the SimPy loop):

* the Raft group's :class:`sim.control.raft.SafetyChecker` (strict): Election Safety, Leader
  Append-Only, Log Matching, Leader Completeness, State Machine Safety, and every
  acknowledged write present at its index on every replica that applies that index;
* ``mixed versions`` -- reported by :class:`sim.control.versions.VersionTracker` if a node ever
  changes a model's version while a batch of it runs or a fetch of it is in flight;
* ``corrupted chunk used`` -- reported when :class:`sim.control.integrity.Integrity` lets a corrupt
  copy through (possible only with the test-only ``verify: false``).

Liveness (:mod:`sim.control.raft.liveness`, wired by :mod:`sim.control.faultinject` unless
``faults.liveness`` is 0): a stale leader adopts a newer term, election timers fire, and
after the last fault heals a leader commits a probe write that every replica learns. Their
findings' properties start with ``Liveness`` (:func:`is_liveness`), and chaos reports them
apart from safety violations.

At the end (:meth:`RunCheckers.final`, after the faults are healed and the group settled):
no acknowledged metadata write missing from the most up-to-date log, and linearizable
metadata reads/writes (Wing-Gong search over the client history, when it has at most
``linearizability_max_ops`` operations; a search over budget is reported as unchecked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.control.raft import SafetyViolation, Violation
from sim.control.raft.linearizability import SearchBudgetExceeded, check_history

if TYPE_CHECKING:
    from sim.control.integrity import Integrity
    from sim.control.metaservice import MetaService

#: how a component reports a violated property: ``report(property, detail)``
Report = Callable[[str, str], None]

LIVENESS = "Liveness"
"""Prefix of every liveness property name (sim.control.raft.liveness); all others are safety."""


def is_liveness(finding: str) -> bool:
    """Whether a finding's text (``str(Finding)``) reports a liveness property."""
    head, _, rest = finding.partition(" ")
    return head.startswith("t=") and rest.startswith(LIVENESS)


@dataclass(frozen=True, slots=True)
class Finding:
    """One violation found by any checker."""

    time: float
    prop: str
    detail: str

    def __str__(self) -> str:
        return f"t={self.time:.6f}s {self.prop}: {self.detail}"


class CheckerViolation(AssertionError):
    """Raised to stop a run at its first violation; the only argument is the
    :class:`Finding` (SimPy re-creates exceptions from their args)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding)

    @property
    def finding(self) -> Finding:
        f = self.args[0]
        assert isinstance(f, Finding)
        return f

    def __str__(self) -> str:
        return str(self.args[0])


class RunCheckers:
    """Collects findings of one run; see the module docstring."""

    def __init__(self, env: Any, stop: bool, lin_max_ops: int) -> None:
        self.env, self.stop, self.lin_max_ops = env, stop, lin_max_ops
        self.findings: list[Finding] = []
        self.linearizability_checked = False

    def report(self, prop: str, detail: str) -> None:
        """Record a violation of ``prop`` now; raise if the run must stop."""
        f = Finding(float(self.env.now), prop, detail)
        self.findings.append(f)
        if self.stop:
            raise CheckerViolation(f)

    def record(self, prop: str, detail: str) -> None:
        """Record a violation of ``prop`` now without stopping the run (end-of-run checks)."""
        self.findings.append(Finding(float(self.env.now), prop, detail))

    @staticmethod
    def from_raft(v: Violation) -> Finding:
        return Finding(v.time, v.prop, str(v))

    def absorb(self, exc: BaseException) -> Finding | None:
        """The finding carried by an exception that stopped the run (or None)."""
        if isinstance(exc, CheckerViolation):
            return exc.finding
        if isinstance(exc, SafetyViolation):
            f = self.from_raft(exc.violation)
            if f not in self.findings:
                self.findings.append(f)
            return f
        return None

    def final(self, meta: MetaService, integrity: Integrity) -> None:
        """End-of-run checks (see the module docstring); never raises, only records."""
        g = meta.group
        checker = meta.checker
        before = len(checker.violations)
        best = max(g.nodes, key=lambda x: (x.log.last_term, x.log.last_index, -x.id))
        strict, checker.strict = checker.strict, False
        try:
            checker.check_acked_present(
                self.env.now, best.id, [e.command for e in best.log.entries()]
            )
        finally:
            checker.strict = strict
        for v in checker.violations[before:]:
            self.findings.append(self.from_raft(v))
        for v in checker.violations[:before]:
            f = self.from_raft(v)
            if f not in self.findings:
                self.findings.append(f)
        hist = meta.history()
        if len(hist) <= self.lin_max_ops:
            try:
                bad = check_history(hist)
                self.linearizability_checked = True
                for key in bad:
                    self.findings.append(
                        Finding(self.env.now, "Linearizability", f"key {key!r} not linearizable")
                    )
            except SearchBudgetExceeded:
                self.linearizability_checked = False
        if integrity is not None and integrity.used_corrupt:
            f = Finding(
                self.env.now,
                "No corrupted chunk used",
                f"{integrity.used_corrupt} reads used a corrupt copy",
            )
            if not any(x.prop == f.prop for x in self.findings):
                self.findings.append(f)
