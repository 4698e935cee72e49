"""Liveness checks of a Raft group: progress, reported apart from safety.

Safety checkers (:mod:`sim.control.raft.safety`) see bugs that corrupt state; bugs that only stall
the group (a stale leader that never steps down, an election timer that keeps being pushed
back, a follower that never catches up) leave every safety property intact. This module
samples the group every ``interval`` seconds and reports three rules (each a rule of the
Raft paper's figure 2, observed from outside the handlers: what a replica was delivered or
sent, and its term and role):

* ``Liveness (term adoption)`` -- a live replica that was delivered a message carrying a term
  above its own adopts that term (and so stops leading) within ``tolerance`` seconds.
* ``Liveness (election timer)`` -- a live follower or candidate (not recovering) that has had
  no AppendEntries of a term >= its own, granted no vote, and changed neither term nor role
  for longer than the election timeout's upper bound (plus ``tolerance``) starts an election.
* ``Liveness (after heal)`` -- once the last fault heals (:meth:`LivenessChecker.healed`), a
  probe write is submitted; within ``bound`` seconds a leader is elected, the write commits
  and every replica's commit index reaches the write's index.

The first two hold at every instant of a correct run, whatever the faults (they are per
replica and need no connectivity); the third needs a healed cluster.

The same sampling checks one safety invariant that needs every replica's state at once:

* ``Leader Match Index`` -- a leader's ``matchIndex[p]`` never claims more than replica ``p``
  holds: while ``p`` is in the leader's term (and not rebuilding after a diskless restart),
  ``p``'s log has an entry at ``matchIndex[p]`` with the leader's term there (by Log Matching,
  the whole prefix then agrees). A leader that trusts a stale reply, or a follower that
  overwrites acknowledged entries on AppendEntries from a replica that is not its term's
  leader, breaks it before the leader can commit what no majority holds.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from sim.control.raft.client import UNKNOWN, RaftClient
from sim.control.raft.group import RaftGroup
from sim.control.raft.node import Role

Report = Callable[[str, str], None]


class LivenessChecker:
    """See the module docstring. ``report(prop, detail)`` receives each finding once per
    rule and replica."""

    def __init__(
        self,
        env: simpy.Environment,
        group: RaftGroup,
        report: Report,
        bound: float = 1.5,
        tolerance: float = 0.05,
        interval: float = 0.01,
    ) -> None:
        self.env, self.group, self.report = env, group, report
        self.bound, self.tolerance, self.interval = bound, tolerance, interval
        self._state: dict[int, tuple[int, Role, bool]] = {}
        self._since: dict[int, float] = {}
        self._reported: set[tuple[str, int]] = set()
        self.heal_at: float | None = None
        self.leader_at: float | None = None
        self.commit_at: float | None = None
        self.caught_up_at: float | None = None
        self._probe_index = 0
        self._probe_done = False

    def start(self) -> None:
        """Start sampling (a SimPy process)."""
        self.env.process(self._sample())

    def _sample(self) -> Generator[simpy.Event, Any, None]:
        while True:
            self.check_now()
            yield self.env.timeout(self.interval)

    def _flag(self, prop: str, node: int, detail: str) -> None:
        if (prop, node) not in self._reported:
            self._reported.add((prop, node))
            self.report(prop, detail)

    def check_now(self) -> None:
        """Apply the per-replica rules at the current instant."""
        now = self.env.now
        hi = self.group.config.election_timeout[1]
        for x in self.group.nodes:
            if not x.alive:
                self._state.pop(x.id, None)
                continue
            st = (x.current_term, x.role, x.recovering)
            if self._state.get(x.id) != st or x.recovering:
                self._state[x.id] = st
                self._since[x.id] = now
            if x.seen_term > x.current_term and now - x.seen_term_at > self.tolerance:
                self._flag(
                    "Liveness (term adoption)",
                    x.id,
                    f"replica {x.id} ({x.role.value}, term {x.current_term}) was delivered "
                    f"term {x.seen_term} at t={x.seen_term_at:.6f}s and has not adopted it",
                )
            if x.role is Role.LEADER or x.recovering:
                continue
            last = max(self._since[x.id], x.last_contact)
            if now - last > hi + self.tolerance:
                self._flag(
                    "Liveness (election timer)",
                    x.id,
                    f"replica {x.id} ({x.role.value}, term {x.current_term}) heard no leader "
                    f"of its term since t={last:.6f}s and started no election "
                    f"(timeout at most {hi}s)",
                )
        for lead in self.group.nodes:
            if lead.alive and lead.role is Role.LEADER:
                self._check_match(lead)
        if self.heal_at is not None:
            self._after_heal(now)

    def _check_match(self, lead: Any) -> None:
        for p, m in lead.match_index.items():
            x = self.group.nodes[p]
            if m <= 0 or not x.alive or x.recovering or x.current_term != lead.current_term:
                continue
            mine = lead.log.term_at(m) if m <= lead.log.last_index else None
            theirs = x.log.term_at(m) if m <= x.log.last_index else None
            if mine is None or mine != theirs:
                self._flag(
                    "Leader Match Index",
                    lead.id,
                    f"leader {lead.id} (term {lead.current_term}) counts replica {p} as "
                    f"matching up to {m}, but there it holds term {theirs} (leader: {mine})",
                )

    # -- after the last fault heals ------------------------------------------------------------
    def healed(self, probe: RaftClient) -> None:
        """Every fault is healed now: submit the probe write through ``probe`` and watch."""
        self.heal_at = self.env.now
        self.env.process(self._probe(probe))

    def _probe(self, c: RaftClient) -> Generator[simpy.Event, Any, None]:
        res = yield self.env.process(c.call("put", "liveness/probe", self.heal_at))
        if res is not UNKNOWN:
            self._probe_index = c.history[-1].index
            self.commit_at = self.env.now
        self._probe_done = True

    def _after_heal(self, now: float) -> None:
        g = self.group
        if self.leader_at is None and g.leader() is not None:
            self.leader_at = now
        if (
            self.caught_up_at is None
            and self._probe_index
            and all(x.commit_index >= self._probe_index for x in g.nodes if x.alive)
        ):
            self.caught_up_at = now

    def final(self, report: Report | None = None) -> None:
        """Report the after-heal rule (call at least ``bound`` seconds after :meth:`healed`)
        through ``report`` (default: the constructor's)."""
        if report is not None:
            self.report = report
        if self.heal_at is None:
            return
        h, b = self.heal_at, self.bound
        if self.leader_at is None or self.leader_at - h > b:
            self._flag(
                "Liveness (after heal)", -1, f"no leader within {b}s of the heal at {h:.6f}s"
            )
        elif self.commit_at is None or self.commit_at - h > b:
            self._flag(
                "Liveness (after heal)", -1, f"probe write not committed within {b}s of {h:.6f}s"
            )
        elif self.caught_up_at is None or self.caught_up_at - h > b:
            lag = [x.id for x in self.group.nodes if x.commit_index < self._probe_index]
            self._flag(
                "Liveness (after heal)",
                -1,
                f"replicas {lag} did not learn the probe write (index {self._probe_index}) "
                f"within {b}s of {h:.6f}s",
            )
