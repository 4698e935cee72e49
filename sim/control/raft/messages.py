"""Messages of the Raft protocol and of its client interface (immutable records).

Node ids are small ints (replicas ``0..n-1``); client endpoints use ids >= 1000 so that one
transport can carry both. Every message carries ``src`` (the sender's id) so a receiver never
needs the transport to tell it who sent a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: first endpoint id used for clients (replicas are 0..n-1, n <= 999)
CLIENT_ID_BASE = 1000


@dataclass(frozen=True, slots=True)
class Command:
    """A state-machine command submitted by a client.

    ``op`` names the operation (see :mod:`sim.control.raft.statemachine`), ``key``/``value`` its
    arguments. ``(client, seq)`` identifies the logical request: a retried request reuses it,
    and the state machine applies each ``(client, seq)`` at most once.
    """

    op: str
    key: str
    value: Any
    client: int
    seq: int


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry: the term of the leader that created it and its command."""

    term: int
    command: Command


@dataclass(frozen=True, slots=True)
class RequestVote:
    src: int
    term: int
    last_log_index: int
    last_log_term: int


@dataclass(frozen=True, slots=True)
class RequestVoteReply:
    src: int
    term: int
    granted: bool


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """Replicate ``entries`` after ``prev_index``; an empty tuple is a heartbeat."""

    src: int
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    leader_commit: int


@dataclass(frozen=True, slots=True)
class AppendEntriesReply:
    """``match_index`` is valid when ``success``; otherwise ``conflict_index`` is where the
    leader should retry (<= the failed request's ``prev_index``)."""

    src: int
    term: int
    success: bool
    match_index: int
    conflict_index: int


@dataclass(frozen=True, slots=True)
class ClientRequest:
    src: int
    command: Command


@dataclass(frozen=True, slots=True)
class ClientReply:
    """Answer to a :class:`ClientRequest`.

    ``ok`` -> the command was committed at ``index`` and applied, ``result`` is its output.
    Not ``ok`` -> the receiver is not the leader; ``leader_hint`` is whom it believes leads
    (``None`` when unknown).
    """

    src: int
    client: int
    seq: int
    ok: bool
    result: Any = None
    index: int = 0
    leader_hint: int | None = None


Message = (
    RequestVote
    | RequestVoteReply
    | AppendEntries
    | AppendEntriesReply
    | ClientRequest
    | ClientReply
)
