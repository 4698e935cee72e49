"""Raft metadata service: replicas, transport, client, state machine, safety checkers.

A standalone SimPy component: :class:`RaftGroup` builds ``n`` replicas over any
:class:`Transport` (default :class:`SimTransport`). See ``sim/raft/node.py`` for the protocol
and the diskless-restart caveat (its handlers are in ``sim/raft/election.py`` and
``sim/raft/replication.py``), ``sim/raft/checkers.py`` for what is checked online, and
``sim/raft/linearizability.py`` for the offline client-history check.
"""

from sim.raft.chaos import ChaosConfig, SeedResult, run_seed
from sim.raft.checkers import SafetyChecker, SafetyViolation, Violation
from sim.raft.client import UNKNOWN, HistoryOp, RaftClient
from sim.raft.config import RaftConfig
from sim.raft.group import EventTrace, RaftGroup
from sim.raft.log import RaftLog
from sim.raft.messages import Command, Entry
from sim.raft.node import RaftNode, Role
from sim.raft.statemachine import Change, MetadataStateMachine, WatchHub
from sim.raft.transport import SimTransport, Transport

__all__ = [
    "UNKNOWN",
    "Change",
    "ChaosConfig",
    "Command",
    "Entry",
    "EventTrace",
    "HistoryOp",
    "MetadataStateMachine",
    "RaftClient",
    "RaftConfig",
    "RaftGroup",
    "RaftLog",
    "RaftNode",
    "Role",
    "SafetyChecker",
    "SafetyViolation",
    "SeedResult",
    "SimTransport",
    "Transport",
    "Violation",
    "WatchHub",
    "run_seed",
]
