"""The metadata state machine replicated by Raft, and its watch (subscribe) API (R11).

State is one ordered key-value map. Keys are namespaced by convention:

* ``chunk/<id>``   -> :class:`sim.control.vclock.Version` whose value is ``(version_no, locations)``
  (chunk -> version + replica locations, R1/R4); concurrent updates are settled by
  :func:`sim.control.vclock.resolve` and the losers kept in :attr:`conflicts`;
* ``ring/<node>``  -> ring membership (value: weight or any marker);
* ``repl/<shard>`` -> replication decision (number of replicas of a hot shard);
* anything else    -> a plain register (used by the linearizability tests).

Operations (``Command.op``): ``put`` (returns the new value), ``get`` (returns the value or
``None``), ``delete`` (returns the old value), ``chunk`` (returns the resolved version).

Exactly-once: each ``(client, seq)`` is applied once; a retried request that was already
applied returns the cached result without changing state (so client retries are safe).
Invariant: ``apply`` is deterministic -- the same command sequence gives the same state and
results on every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import InputError
from sim.control.raft.messages import Command
from sim.control.vclock import Conflict, Version, resolve

OPS = ("put", "get", "delete", "chunk")


@dataclass(frozen=True, slots=True)
class Change:
    """A change of one key, as seen by watchers: ``old``/``new`` are ``None`` when absent."""

    index: int
    key: str
    old: Any
    new: Any


class MetadataStateMachine:
    """Deterministic key-value state machine; see the module docstring."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.conflicts: list[Conflict] = []
        self._last: dict[int, tuple[int, Any]] = {}

    def apply(self, index: int, cmd: Command) -> tuple[Any, Change | None]:
        """Apply ``cmd`` (log entry ``index``); return ``(result, change or None)``."""
        last = self._last.get(cmd.client)
        if last is not None and cmd.seq <= last[0]:
            return (last[1] if cmd.seq == last[0] else None), None
        change: Change | None = None
        old = self.data.get(cmd.key)
        if cmd.op == "get":
            result = old
        elif cmd.op == "put":
            self.data[cmd.key] = cmd.value
            result = cmd.value
            change = Change(index, cmd.key, old, cmd.value)
        elif cmd.op == "delete":
            result = self.data.pop(cmd.key, None)
            if result is not None:
                change = Change(index, cmd.key, old, None)
        elif cmd.op == "chunk":
            if not isinstance(cmd.value, Version):
                raise InputError(f"chunk command for {cmd.key!r} needs a Version value")
            winner, conflict = resolve(old, cmd.value)
            if conflict is not None:
                self.conflicts.append(conflict)
            self.data[cmd.key] = winner
            result = winner
            if winner is not old:
                change = Change(index, cmd.key, old, winner)
        else:
            raise InputError(f"unknown command op {cmd.op!r}; allowed: {', '.join(OPS)}")
        self._last[cmd.client] = (cmd.seq, result)
        return result, change


Watcher = Callable[[Change], None]


class WatchHub:
    """Fan-out of committed changes to subscribers, exactly once per log index.

    Every replica reports each applied index; replicas apply the same sequence (State Machine
    Safety), so the hub forwards index ``i`` the first time any replica applies it and ignores
    later reports of ``i`` (other replicas, or a replica replaying its log after a restart).
    Invariant: watchers see changes in strictly increasing index order.
    """

    def __init__(self) -> None:
        self._subs: list[tuple[str, Watcher]] = []
        self.notified_index = 0

    def subscribe(self, prefix: str, callback: Watcher) -> Callable[[], None]:
        """Call ``callback(change)`` for every committed change of a key starting with
        ``prefix``; returns a function that unsubscribes."""
        sub = (prefix, callback)
        self._subs.append(sub)

        def cancel() -> None:
            if sub in self._subs:
                self._subs.remove(sub)

        return cancel

    def on_apply(self, index: int, change: Change | None) -> None:
        """Report that some replica applied ``index`` (with its change, if any)."""
        if index <= self.notified_index:
            return
        assert index == self.notified_index + 1, "replicas apply indices in order"
        self.notified_index = index
        if change is None:
            return
        for prefix, cb in list(self._subs):
            if change.key.startswith(prefix):
                cb(change)
