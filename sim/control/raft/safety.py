"""Online checkers for Raft's safety properties (Ongaro & Ousterhout 2014, figure 3).

The replicas call the :class:`SafetyChecker` hooks as things happen; each hook is O(1) except
:meth:`on_leader` (O(committed prefix), once per election). A violation is recorded as a
:class:`Violation` naming the time, property, nodes, terms and indices; with ``strict=True`` it
is also raised as :class:`SafetyViolation`, which stops the simulation.

Properties and how each is checked:

* Election Safety -- at most one leader per term: a ``term -> leader`` map; and a leader of
  term ``t`` was granted votes in ``t`` by a majority (counting itself): every granted vote
  is reported by the voter (:meth:`SafetyChecker.on_grant`); and only that leader sends
  AppendEntries of term ``t`` (:meth:`SafetyChecker.on_append_sent`).
* Commit Rule (figure 8) -- a leader only advances its commit index to an entry of its
  current term (earlier-term entries commit with it, never by counting replicas; section
  5.4.2): checked on every commit by a leader.
* Leader Match Index -- a leader raises ``matchIndex[p]`` only on an acknowledgement of its
  current term (a reply to an AppendEntries of an earlier term describes a log the leader
  may no longer have; figure 2, and ``DropStaleResponse`` of the TLA+ specification).
* Leader Append-Only -- a leader never overwrites or deletes entries: any truncation by a
  node while it is leader is a violation.
* Log Matching -- if two logs hold an entry with the same index and term, the logs are
  identical up to it: for every ``(index, term)`` ever stored by any replica, the command and
  the previous entry's term must be the same everywhere (by induction on the index this
  implies the whole prefixes are equal).
* Leader Completeness -- a committed entry is in the log of every later leader: each
  committed index's term is recorded when any replica first commits it; a new leader's log must
  carry the recorded term at every committed index.
* State Machine Safety -- no two replicas apply different commands at one index.
* No acknowledged write lost -- an acknowledgement names the index its command was applied
  at; that index must hold that command on every replica that ever applies it (checked on ack
  and on every later apply), and :meth:`check_acked_present` checks a final state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.control.raft.log import RaftLog
from sim.control.raft.messages import Command, Entry


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken safety property."""

    time: float
    prop: str
    detail: str
    nodes: tuple[int, ...] = ()
    terms: tuple[int, ...] = ()
    indices: tuple[int, ...] = ()

    def __str__(self) -> str:
        return (
            f"t={self.time:.6f} {self.prop}: {self.detail} "
            f"(nodes={list(self.nodes)}, terms={list(self.terms)}, indices={list(self.indices)})"
        )


class SafetyViolation(AssertionError):
    """Raised by a strict checker on the first violation. The :class:`Violation` is the
    only argument (SimPy re-creates exceptions from ``args`` when they leave a process)."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation)

    @property
    def violation(self) -> Violation:
        v = self.args[0]
        assert isinstance(v, Violation)
        return v

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class SafetyChecker:
    """Receives hooks from every replica of one group; see the module docstring."""

    strict: bool = False
    violations: list[Violation] = field(default_factory=list)
    leaders: dict[int, int] = field(default_factory=dict)
    #: committed_terms[i-1] is the term of the committed entry at index i
    committed_terms: list[int] = field(default_factory=list)
    applied: dict[int, Command] = field(default_factory=dict)
    acked: dict[int, Command] = field(default_factory=dict)
    #: (term, candidate) -> voters that granted it their vote in that term
    grants: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    _seen: dict[tuple[int, int], tuple[Command, int]] = field(default_factory=dict)
    #: (term, node) of every on_leader call (two in one term are reported apart)
    _led: set[tuple[int, int]] = field(default_factory=set)

    def _report(self, v: Violation) -> None:
        self.violations.append(v)
        if self.strict:
            raise SafetyViolation(v)

    @property
    def ok(self) -> bool:
        """True while no violation has been recorded."""
        return not self.violations

    # -- hooks ---------------------------------------------------------------------------
    def on_grant(self, voter: int, candidate: int, term: int) -> None:
        """``voter`` granted ``candidate`` its vote in ``term``."""
        self.grants.setdefault((term, candidate), set()).add(voter)

    def on_leader(
        self, now: float, node: int, term: int, log: RaftLog, members: int | None = None
    ) -> None:
        """``node`` became leader of ``term`` holding ``log``; with ``members`` (the group
        size) also check that a majority granted it its vote in ``term``."""
        if members is not None:
            votes = len(self.grants.get((term, node), set()) - {node}) + 1
            if votes < members // 2 + 1:
                self._report(
                    Violation(
                        now,
                        "Election Safety",
                        f"leader with {votes} of {members} votes in its term",
                        (node,),
                        (term,),
                    )
                )
        other = self.leaders.get(term)
        if other is not None and other != node:
            self._report(
                Violation(now, "Election Safety", "two leaders in one term", (other, node), (term,))
            )
        self.leaders.setdefault(term, node)
        self._led.add((term, node))
        for i, t in enumerate(self.committed_terms, start=1):
            have = log.term_at(i) if i <= log.last_index else None
            if have != t:
                self._report(
                    Violation(
                        now,
                        "Leader Completeness",
                        f"new leader lacks committed entry (has term {have}, committed term {t})",
                        (node,),
                        (term, t),
                        (i,),
                    )
                )
                break

    def on_append_sent(self, now: float, node: int, peer: int, term: int) -> None:
        """``node`` sends ``peer`` an AppendEntries of ``term``: only a replica that became
        leader of ``term`` may (figure 2); anyone else would replicate its own log under
        another leader's term."""
        if (term, node) not in self._led:
            self._report(
                Violation(
                    now,
                    "Election Safety",
                    f"replica {node} sent AppendEntries of term {term} to {peer} without "
                    f"having become leader of term {term} (its leader: {self.leaders.get(term)})",
                    (node, peer),
                    (term,),
                )
            )

    def on_match_raise(
        self, now: float, node: int, term: int, peer: int, match: int, reply_term: int
    ) -> None:
        """Leader ``node`` of ``term`` raised ``matchIndex[peer]`` to ``match`` on a reply
        of ``reply_term``."""
        if reply_term != term:
            self._report(
                Violation(
                    now,
                    "Leader Match Index",
                    f"matchIndex[{peer}] raised to {match} by a reply of term {reply_term}",
                    (node, peer),
                    (term, reply_term),
                    (match,),
                )
            )

    def on_truncate(
        self, now: float, node: int, is_leader: bool, term: int, index: int, commit_index: int
    ) -> None:
        """``node`` deletes its entries from ``index`` on (its commit index: ``commit_index``)."""
        if index <= commit_index:
            self._report(
                Violation(
                    now,
                    "State Machine Safety",
                    f"committed entry truncated (commit index {commit_index})",
                    (node,),
                    (term,),
                    (index,),
                )
            )
        if is_leader:
            self._report(
                Violation(
                    now,
                    "Leader Append-Only",
                    "leader truncated its log",
                    (node,),
                    (term,),
                    (index,),
                )
            )

    def on_store(self, now: float, node: int, index: int, entry: Entry, prev_term: int) -> None:
        """``node`` stored ``entry`` at ``index`` after an entry of term ``prev_term``."""
        key = (index, entry.term)
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = (entry.command, prev_term)
        elif seen != (entry.command, prev_term):
            self._report(
                Violation(
                    now,
                    "Log Matching",
                    "same index and term but different entry or prefix",
                    (node,),
                    (entry.term, prev_term, seen[1]),
                    (index,),
                )
            )

    def on_commit(
        self, now: float, node: int, log: RaftLog, old: int, new: int, leader_term: int = 0
    ) -> None:
        """``node`` advanced its commit index from ``old`` to ``new`` (``leader_term``: its
        term when it commits as leader, else 0)."""
        if leader_term and log.term_at(new) != leader_term:
            self._report(
                Violation(
                    now,
                    "Commit Rule",
                    f"leader of term {leader_term} committed an entry of term "
                    f"{log.term_at(new)} by counting replicas (figure 8)",
                    (node,),
                    (leader_term, log.term_at(new)),
                    (new,),
                )
            )
        ct = self.committed_terms
        for i in range(old + 1, new + 1):
            t = log.term_at(i)
            if i <= len(ct):
                if ct[i - 1] != t:
                    self._report(
                        Violation(
                            now,
                            "State Machine Safety",
                            "different entries committed at one index",
                            (node,),
                            (ct[i - 1], t),
                            (i,),
                        )
                    )
            elif i == len(ct) + 1:
                ct.append(t)

    def on_apply(self, now: float, node: int, index: int, cmd: Command) -> None:
        """``node`` applied ``cmd`` at ``index``."""
        prev = self.applied.setdefault(index, cmd)
        if prev != cmd:
            self._report(
                Violation(
                    now,
                    "State Machine Safety",
                    f"applied {_short(cmd)} where another replica applied {_short(prev)}",
                    (node,),
                    (),
                    (index,),
                )
            )
        acked = self.acked.get(index)
        if acked is not None and acked != cmd:
            self._report(
                Violation(
                    now,
                    "Acknowledged write lost",
                    f"acked {_short(acked)} replaced by {_short(cmd)}",
                    (node,),
                    (),
                    (index,),
                )
            )

    def on_ack(self, now: float, node: int, index: int, cmd: Command) -> None:
        """Leader ``node`` acknowledged ``cmd`` to its client as applied at ``index``."""
        self.acked.setdefault(index, cmd)
        if self.applied.get(index) != cmd:
            self._report(
                Violation(
                    now,
                    "Acknowledged write lost",
                    "ack for an unapplied entry",
                    (node,),
                    (),
                    (index,),
                )
            )

    def check_acked_present(self, now: float, node: int, commands: Sequence[Command]) -> None:
        """Final check: every acknowledged command is at its index in ``commands`` (the
        applied sequence of a replica that has caught up)."""
        for index, cmd in sorted(self.acked.items()):
            have = commands[index - 1] if index <= len(commands) else None
            if have != cmd:
                self._report(
                    Violation(
                        now,
                        "Acknowledged write lost",
                        f"acked {_short(cmd)} missing at final state (found {have and _short(have)})",
                        (node,),
                        (),
                        (index,),
                    )
                )
                return


def _short(cmd: Any) -> str:
    if isinstance(cmd, Command):
        return f"{cmd.op}({cmd.key}={cmd.value!r}) c{cmd.client}#{cmd.seq}"
    return repr(cmd)
