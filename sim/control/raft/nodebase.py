"""What the parts of one Raft replica share: its role, its state, and the calls between parts.

A replica (:class:`sim.control.raft.node.RaftNode`) is one object assembled from three parts:

* :class:`sim.control.raft.election.Election` -- terms, votes and roles (timer expiry, RequestVote
  on both sides, stepping down, becoming leader);
* :class:`sim.control.raft.replication.Replication` -- AppendEntries on both sides, client requests,
  the commit rule and applying committed entries;
* :class:`sim.control.raft.node.RaftNode` itself -- construction, crash and restart, message
  plumbing (inbox, sends, timers) and the SimPy process that drives the handlers.

:class:`ReplicaBase` declares the state all parts read and write and, as abstract methods,
every call one part makes into another, so each part type-checks on its own and a concrete
replica must provide all of them. Contract for every part: handlers never yield, so a
replica's state changes atomically per message or timer expiry.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from sim.control.raft.groupconfig import RaftConfig
from sim.control.raft.log import RaftLog
from sim.control.raft.messages import Command
from sim.control.raft.safety import SafetyChecker
from sim.control.raft.statemachine import Change, MetadataStateMachine

if TYPE_CHECKING:
    from sim.control.raft.buggify import Buggify

Tracer = Callable[[float, int, str], None]
ApplyHook = Callable[[int, Change | None], None]

#: the entry a new leader appends when ``RaftConfig.leader_noop`` is set
NOOP = Command("noop", "", None, -1, 0)


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


class ReplicaBase(abc.ABC):
    """The state of one replica and the operations its parts call in one another."""

    # identity and configuration
    env: simpy.Environment
    id: int
    members: tuple[int, ...]
    peers: tuple[int, ...]
    majority: int
    cfg: RaftConfig
    checker: SafetyChecker
    #: BUGGIFY perturbation (sim.control.raft.buggify); None: none
    buggify: Buggify | None
    # persistent state (survives a restart with the disk)
    current_term: int
    voted_for: int | None
    log: RaftLog
    # incarnation
    alive: bool
    #: restarted without its disk and not yet a voter again (see sim.control.raft.node)
    recovering: bool
    # volatile state
    role: Role
    leader_id: int | None
    commit_index: int
    last_applied: int
    sm: MetadataStateMachine
    applied: list[Command]
    votes: set[int]
    next_index: dict[int, int]
    match_index: dict[int, int]
    #: log index -> client endpoint awaiting the reply (leader only)
    _pending: dict[int, int]
    #: replicate new entries before the process sleeps again
    _flush: bool
    #: when the timer is next due (election timeout, or the leader's heartbeat)
    _deadline: float
    _on_apply: ApplyHook | None

    # -- provided by the node (sim.control.raft.node) ---------------------------------------------
    @abc.abstractmethod
    def tr(self, event: str) -> None:
        """Record ``event`` in the replica's trace (if it has one)."""

    @abc.abstractmethod
    def _send(self, dst: int, msg: object) -> None:
        """Send ``msg`` to replica or client endpoint ``dst`` (through BUGGIFY when set)."""

    @abc.abstractmethod
    def _reset_election_deadline(self) -> None:
        """Draw a new election deadline from now."""

    @abc.abstractmethod
    def crash(self) -> None:
        """Stop the replica now."""

    @abc.abstractmethod
    def restart(self, with_disk: bool = True) -> None:
        """Restart a crashed replica, keeping (or losing) its persistent state."""

    # -- provided by the election part (sim.control.raft.election) --------------------------------
    @abc.abstractmethod
    def _set_term(self, term: int) -> None:
        """Adopt a newer ``term``: forget the vote and step down."""

    @abc.abstractmethod
    def _become_follower(self) -> None:
        """Step down to follower."""

    # -- provided by the replication part (sim.control.raft.replication) --------------------------
    @abc.abstractmethod
    def _append_local(self, cmd: Command) -> int:
        """Append ``cmd`` to the leader's own log in its current term; returns its index."""

    @abc.abstractmethod
    def _broadcast_append(self) -> None:
        """Send AppendEntries to every peer."""

    @abc.abstractmethod
    def _advance_commit(self) -> None:
        """Commit what a majority stores, under the current-term rule."""
