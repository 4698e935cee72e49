"""Vector clocks for chunk versions (R4) and the rule that settles concurrent updates.

A :class:`VectorClock` maps writer ids (strings) to counters; it is immutable and stored as a
tuple of ``(writer, counter)`` pairs sorted by writer, with no zero counters (so two equal
clocks have equal representations, and iteration order never depends on hashing).

Ordering: ``a`` happened *before* ``b`` when every counter of ``a`` is <= the one in ``b`` and
the clocks differ; *concurrent* when neither is before the other.

Conflict rule (documented, deterministic, symmetric): of two versions whose clocks are
concurrent, the winner is the one with the larger *Lamport sum* (sum of its counters); on a tie,
the one whose ``writer`` id sorts higher; on a further tie (same writer, same sum, different
clocks -- only possible with a misbehaving writer), the clock whose sorted pair tuple is larger.
The loser is returned as a :class:`Conflict` record so the caller can count/report it. The
resolved version carries the *merge* of both clocks ticked once for the resolving writer, so it
dominates both inputs and later comparisons see the conflict as settled.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InputError


class Order(enum.Enum):
    """Result of :func:`compare`."""

    BEFORE = "before"
    AFTER = "after"
    EQUAL = "equal"
    CONCURRENT = "concurrent"


@dataclass(frozen=True, slots=True)
class VectorClock:
    """An immutable vector clock. Build with :meth:`of` or :meth:`empty`.

    Invariant: ``entries`` is sorted by writer, writers are unique, every counter is > 0.
    """

    entries: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def empty() -> VectorClock:
        """The clock of nothing (before every other clock)."""
        return VectorClock(())

    @staticmethod
    def of(counters: Mapping[str, int] | Iterable[tuple[str, int]]) -> VectorClock:
        """Build a clock from ``{writer: counter}``; zero counters are dropped.

        Raises :class:`InputError` for a negative counter or a non-string writer.
        """
        items = counters.items() if isinstance(counters, Mapping) else counters
        merged: dict[str, int] = {}
        for writer, count in items:
            if not isinstance(writer, str):
                raise InputError(f"vector clock writer {writer!r} must be a string")
            if not isinstance(count, int) or count < 0:
                raise InputError(
                    f"vector clock counter for {writer!r} is {count!r}; allowed: int >= 0"
                )
            if count:
                merged[writer] = max(count, merged.get(writer, 0))
        return VectorClock(tuple(sorted(merged.items())))

    def get(self, writer: str) -> int:
        """Counter of ``writer`` (0 when absent)."""
        for w, c in self.entries:
            if w == writer:
                return c
        return 0

    def as_dict(self) -> dict[str, int]:
        """The clock as a plain dict (writers in sorted order)."""
        return dict(self.entries)

    def tick(self, writer: str) -> VectorClock:
        """A new clock with ``writer``'s counter incremented by one."""
        d = dict(self.entries)
        d[writer] = d.get(writer, 0) + 1
        return VectorClock(tuple(sorted(d.items())))

    def lamport_sum(self) -> int:
        """Sum of all counters: a total-order hint used by the conflict rule."""
        return sum(c for _, c in self.entries)


def compare(a: VectorClock, b: VectorClock) -> Order:
    """How ``a`` relates to ``b``: BEFORE, AFTER, EQUAL or CONCURRENT."""
    da, db = dict(a.entries), dict(b.entries)
    a_le_b = all(c <= db.get(w, 0) for w, c in da.items())
    b_le_a = all(c <= da.get(w, 0) for w, c in db.items())
    if a_le_b and b_le_a:
        return Order.EQUAL
    if a_le_b:
        return Order.BEFORE
    if b_le_a:
        return Order.AFTER
    return Order.CONCURRENT


def merge(a: VectorClock, b: VectorClock) -> VectorClock:
    """The least upper bound of two clocks (element-wise max)."""
    d = dict(a.entries)
    for w, c in b.entries:
        if c > d.get(w, 0):
            d[w] = c
    return VectorClock(tuple(sorted(d.items())))


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a value (e.g. a chunk): its clock, the writer that made it, a payload."""

    clock: VectorClock
    writer: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class Conflict:
    """A concurrent update that lost under the conflict rule."""

    winner: Version
    loser: Version


def _rank(v: Version) -> tuple[int, str, tuple[tuple[str, int], ...]]:
    return (v.clock.lamport_sum(), v.writer, v.clock.entries)


def resolve(
    current: Version | None, incoming: Version, resolver: str | None = None
) -> tuple[Version, Conflict | None]:
    """Combine the stored ``current`` version with an ``incoming`` one.

    * no current, or current BEFORE incoming -> incoming wins, no conflict;
    * incoming BEFORE or EQUAL current -> current stays (a stale or duplicate update);
    * CONCURRENT -> the rule in the module docstring picks the winner; the result carries the
      merged clock ticked for ``resolver`` (default: the winner's writer) and a
      :class:`Conflict` naming the loser.

    The winner's *value and writer* do not depend on argument order (symmetric rule).
    """
    if current is None:
        return incoming, None
    order = compare(current.clock, incoming.clock)
    if order is Order.BEFORE:
        return incoming, None
    if order in (Order.AFTER, Order.EQUAL):
        return current, None
    winner, loser = (incoming, current) if _rank(incoming) > _rank(current) else (current, incoming)
    clock = merge(current.clock, incoming.clock).tick(resolver or winner.writer)
    return Version(clock, winner.writer, winner.value), Conflict(winner, loser)


__all__ = ["Conflict", "Order", "VectorClock", "Version", "compare", "merge", "resolve"]
