"""BUGGIFY for Raft replicas: seeded timing perturbation and message faults inside the node.

FoundationDB's simulator and TigerBeetle's VOPR find protocol bugs by making rare timings
common. A :class:`Buggify` attached to every replica of a group (``RaftNode.buggify``) does
that for Raft, drawing from its own seeded Generator (so it never shifts the replicas'
election timeouts or the transport's stream):

* ``hold`` -- each outgoing Raft message is, with this probability, held back for
  ``U(0, hold_max)`` seconds before it enters the transport. With ``hold_max`` above the
  election timeout a message (or the reply to it) arrives after elections have happened:
  delay spanning elections, and reordering with everything sent meanwhile.
* ``duplicate`` -- each outgoing Raft message is, with this probability, sent a second time
  ``U(0, hold_max)`` seconds later: a reply from an earlier term can reach a node that leads
  again in a later term.
* ``early_timer`` -- each election-timer reset draws, with this probability, a deadline of
  ``U(0, lo)`` instead of ``U(lo, hi)``: an election starts while a leader is healthy.
* ``mute_after_append`` -- the figure 8 schedule: right after a leader appends the first
  client entry of its term, with this probability its outgoing replica messages are dropped
  for ``U(mute[0], mute[1])`` seconds. Its followers' replies still reach it, so it counts
  acknowledgements of the earlier-term entries it replicated on election while its own
  entry stays on it alone; a later leader may then overwrite those entries.
* ``deafen_leader`` -- with this probability per new entry, a leader stops hearing the other
  replicas for ``U(mute[0], mute[1])`` seconds while they still hear it (a stale leader that
  does not learn of newer terms).
* ``restart_mid_replication`` -- with this probability, a follower that has just stored
  entries from an AppendEntries crashes at once (its acknowledgement is already on its way)
  and restarts with its disk ``U(0.05, 0.3)`` seconds later.

Client messages are never touched (clients are outside the replicas' failure domain).
All draws happen only when a knob is non-zero, so an all-zero :class:`Buggify` behaves
exactly like none.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from engine.errors import InputError
from sim.control.raft.messages import CLIENT_ID_BASE

if TYPE_CHECKING:
    from sim.control.raft.nodebase import ReplicaBase


@dataclass(frozen=True, slots=True)
class BuggifyConfig:
    """Probabilities and times of :class:`Buggify` (see the module docstring)."""

    hold: float = 0.0
    hold_max: float = 0.6
    duplicate: float = 0.0
    early_timer: float = 0.0
    mute_after_append: float = 0.0
    deafen_leader: float = 0.0
    mute: tuple[float, float] = (0.05, 0.6)
    restart_mid_replication: float = 0.0

    def validate(self) -> BuggifyConfig:
        """Raise :class:`InputError` naming the bad knob; return ``self`` when valid."""
        for name in (
            "hold",
            "duplicate",
            "early_timer",
            "mute_after_append",
            "deafen_leader",
            "restart_mid_replication",
        ):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise InputError(f"buggify.{name} = {p!r}; allowed: a probability in [0, 1]")
        if not 0.0 <= self.hold_max < 1e6:
            raise InputError(f"buggify.hold_max = {self.hold_max!r}; allowed: 0 <= s < 1e6")
        lo, hi = self.mute
        if not 0.0 <= lo <= hi < 1e6:
            raise InputError(f"buggify.mute = {self.mute!r}; allowed: 0 <= lo <= hi < 1e6")
        return self

    @property
    def active(self) -> bool:
        """Whether any knob is non-zero."""
        return any(
            (
                self.hold,
                self.duplicate,
                self.early_timer,
                self.mute_after_append,
                self.deafen_leader,
                self.restart_mid_replication,
            )
        )


class Buggify:
    """One group's perturbation source, shared by its replicas (see the module docstring).

    Counters (for reports): ``held``, ``duplicated``, ``early``, ``muted``, ``deafened``,
    ``restarts``.
    """

    def __init__(self, config: BuggifyConfig, rng: np.random.Generator) -> None:
        self.cfg = config.validate()
        self.rng = rng
        self._mute_until: dict[int, float] = {}
        self._deaf_until: dict[int, float] = {}
        self.held = self.duplicated = self.early = 0
        self.muted = self.deafened = self.restarts = 0

    # -- messages --------------------------------------------------------------------------
    def send(self, env: simpy.Environment, transport: Any, src: int, dst: int, msg: Any) -> None:
        """Send ``msg`` through ``transport`` as :meth:`send_delays` says: now, later (held
        in the network: it leaves even if ``src`` crashes meanwhile), twice, or not at all."""
        for delay in self.send_delays(src, dst, env.now):
            if delay <= 0.0:
                transport.send(src, dst, msg)
            else:
                env.timeout(delay).callbacks.append(partial(_send_later, transport, src, dst, msg))

    def send_delays(self, src: int, dst: int, now: float) -> list[float]:
        """Delays (seconds from now) at which copies of a message ``src -> dst`` enter the
        transport; empty: the message is dropped (a muted sender)."""
        if dst >= CLIENT_ID_BASE:
            return [0.0]
        if now < self._mute_until.get(src, -1.0):
            return []
        c = self.cfg
        first = 0.0
        if c.hold and self.rng.random() < c.hold:
            first = float(self.rng.random()) * c.hold_max
            self.held += 1
        out = [first]
        if c.duplicate and self.rng.random() < c.duplicate:
            out.append(float(self.rng.random()) * c.hold_max)
            self.duplicated += 1
        return out

    def deaf(self, node: int, src: int, now: float) -> bool:
        """Whether ``node`` does not hear a message from replica ``src`` now."""
        return src < CLIENT_ID_BASE and now < self._deaf_until.get(node, -1.0)

    # -- timers ----------------------------------------------------------------------------
    def election_timeout(self, lo: float, hi: float) -> float | None:
        """An early election timeout ``U(0, lo)``, or ``None`` for the normal draw."""
        if self.cfg.early_timer and self.rng.random() < self.cfg.early_timer:
            self.early += 1
            return float(self.rng.random()) * lo
        return None

    # -- schedule hooks ----------------------------------------------------------------------
    def after_append(self, node: ReplicaBase, index: int) -> None:
        """A leader just appended a client entry at ``index``: maybe mute or deafen it."""
        c, now = self.cfg, node.env.now
        first = node.log.term_at(index - 1) != node.current_term
        if first and c.mute_after_append and self.rng.random() < c.mute_after_append:
            self._mute_until[node.id] = now + float(self.rng.uniform(*c.mute))
            self.muted += 1
            node.tr("buggify mute")
        if c.deafen_leader and self.rng.random() < c.deafen_leader:
            self._deaf_until[node.id] = now + float(self.rng.uniform(*c.mute))
            self.deafened += 1
            node.tr("buggify deaf")

    def after_store(self, node: ReplicaBase) -> None:
        """A follower just stored entries: maybe crash it now and restart it soon."""
        c = self.cfg
        if not (c.restart_mid_replication and self.rng.random() < c.restart_mid_replication):
            return
        self.restarts += 1
        down = float(self.rng.uniform(0.05, 0.3))
        ev = node.env.timeout(0.0)

        def crash(_e: Any) -> None:
            if node.alive:
                node.crash()
                node.env.timeout(down).callbacks.append(lambda _x: node.restart(True))

        ev.callbacks.append(crash)


def _send_later(transport: Any, src: int, dst: int, msg: Any, _ev: Any = None) -> None:
    """Event callback: hand a held message to the transport."""
    transport.send(src, dst, msg)
