"""How Raft replicas and clients exchange messages.

:class:`Transport` is the small protocol the Raft code depends on: endpoints ``register`` a
delivery callback under an int id, and anyone may ``send(src, dst, msg)``. Delivery is
asynchronous, may be lost, duplicated or reordered, and never raises at the sender.

:class:`SimTransport` implements it in SimPy with a latency of ``min + U(0, jitter)`` seconds
per message, independent loss and duplication probabilities, and partition control. The
cluster simulator can provide another implementation backed by its network links.

Partition semantics: a message from ``a`` to ``b`` is dropped when, at send time *or* at
delivery time, (1) ``a`` or ``b`` is isolated, (2) both are listed in :meth:`partition` groups
and in different groups, or (3) the direction ``a -> b`` is blocked one way. Endpoints not
listed in any partition group (e.g. clients) reach every listed node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np
import simpy

from engine.errors import InputError

Deliver = Callable[[Any], None]


class Transport(Protocol):
    """Message passing between endpoints identified by ints."""

    def register(self, node: int, deliver: Deliver) -> None:
        """Deliver messages addressed to ``node`` by calling ``deliver(msg)``."""

    def send(self, src: int, dst: int, msg: Any) -> None:
        """Send ``msg`` from ``src`` to ``dst``; fire-and-forget."""


class SimTransport:
    """A SimPy transport with latency, loss, duplication and partitions.

    All randomness comes from ``rng``. ``latency = (min_s, jitter_s)``.
    Counters ``sent``, ``delivered``, ``dropped`` and ``duplicated`` are kept for reports.
    """

    def __init__(
        self,
        env: simpy.Environment,
        rng: np.random.Generator,
        latency: tuple[float, float] = (0.001, 0.004),
        loss: float = 0.0,
        duplicate: float = 0.0,
    ) -> None:
        self.env = env
        self.rng = rng
        self._endpoints: dict[int, Deliver] = {}
        self._isolated: set[int] = set()
        self._group_of: dict[int, int] = {}
        self._blocked: set[tuple[int, int]] = set()
        self.sent = self.delivered = self.dropped = self.duplicated = 0
        self.latency: tuple[float, float] = (0.0, 0.0)
        self.loss = 0.0
        self.duplicate = 0.0
        self.set_link(latency=latency, loss=loss, duplicate=duplicate)

    def set_link(
        self,
        latency: tuple[float, float] | None = None,
        loss: float | None = None,
        duplicate: float | None = None,
    ) -> None:
        """Change latency/loss/duplication for messages sent from now on."""
        if latency is not None:
            lo, jit = latency
            if lo < 0 or jit < 0:
                raise InputError(f"latency {latency!r}: allowed: (min >= 0, jitter >= 0)")
            self.latency = (float(lo), float(jit))
        for name, p in (("loss", loss), ("duplicate", duplicate)):
            if p is not None and not 0.0 <= p < 1.0:
                raise InputError(f"{name} = {p!r}: allowed: probability in [0, 1)")
        if loss is not None:
            self.loss = float(loss)
        if duplicate is not None:
            self.duplicate = float(duplicate)

    # -- endpoints and sending -------------------------------------------------------------
    def register(self, node: int, deliver: Deliver) -> None:
        """See :meth:`Transport.register`; re-registering replaces the callback."""
        self._endpoints[node] = deliver

    def can_reach(self, src: int, dst: int) -> bool:
        """Whether a message from ``src`` to ``dst`` would pass the partition rules now."""
        if src in self._isolated or dst in self._isolated:
            return False
        gs, gd = self._group_of.get(src), self._group_of.get(dst)
        if gs is not None and gd is not None and gs != gd:
            return False
        return (src, dst) not in self._blocked

    def send(self, src: int, dst: int, msg: Any) -> None:
        """See :meth:`Transport.send`."""
        self.sent += 1
        if not self.can_reach(src, dst) or (self.loss and self.rng.random() < self.loss):
            self.dropped += 1
            return
        copies = 1
        if self.duplicate and self.rng.random() < self.duplicate:
            copies = 2
            self.duplicated += 1
        lo, jit = self.latency
        for _ in range(copies):
            delay = lo + (self.rng.random() * jit if jit else 0.0)
            ev = self.env.timeout(delay)
            ev.callbacks.append(partial(self._arrive, src, dst, msg))

    def _arrive(self, src: int, dst: int, msg: Any, _ev: simpy.Event | None = None) -> None:
        deliver = self._endpoints.get(dst)
        if deliver is None or not self.can_reach(src, dst):
            self.dropped += 1
            return
        self.delivered += 1
        deliver(msg)

    # -- partition control -----------------------------------------------------------------
    def partition(self, groups: Sequence[Iterable[int]]) -> None:
        """Split the listed nodes into ``groups`` that cannot talk to each other (replaces
        any previous group partition; isolation and one-way blocks stay)."""
        self._group_of = {}
        for gi, group in enumerate(groups):
            for node in group:
                if node in self._group_of:
                    raise InputError(f"partition: node {node} is listed in two groups")
                self._group_of[node] = gi

    def isolate(self, node: int) -> None:
        """Cut ``node`` off from every other endpoint, both directions."""
        self._isolated.add(node)

    def one_way_block(self, src: int, dst: int) -> None:
        """Drop messages from ``src`` to ``dst`` (the reverse direction still works)."""
        self._blocked.add((src, dst))

    def heal(self) -> None:
        """Remove every partition, isolation and one-way block."""
        self._isolated.clear()
        self._group_of = {}
        self._blocked.clear()
