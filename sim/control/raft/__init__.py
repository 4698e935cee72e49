"""Raft metadata service: replicas, transport, client, state machine, safety checkers.

A standalone SimPy component: :class:`RaftGroup` builds ``n`` replicas over any
:class:`Transport` (default :class:`SimTransport`). See ``sim/control/raft/node.py`` for the protocol
and the diskless-restart caveat (its handlers are in ``sim/control/raft/election.py`` and
``sim/control/raft/replication.py``), ``sim/control/raft/safety.py`` for what is checked online, and
``sim/control/raft/linearizability.py`` for the offline client-history check.
"""

from sim.control.raft.client import UNKNOWN, HistoryOp, RaftClient
from sim.control.raft.group import EventTrace, RaftGroup
from sim.control.raft.groupconfig import RaftConfig
from sim.control.raft.log import RaftLog
from sim.control.raft.messages import Command, Entry
from sim.control.raft.nemesis import ChaosConfig, SeedResult, run_seed
from sim.control.raft.node import RaftNode, Role
from sim.control.raft.safety import SafetyChecker, SafetyViolation, Violation
from sim.control.raft.statemachine import Change, MetadataStateMachine, WatchHub
from sim.control.raft.transport import SimTransport, Transport

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
