"""The simulator's SimPy environment: SimPy's event loop, counting the events it processes.

:class:`CountingEnvironment` is a :class:`simpy.Environment` whose :meth:`~CountingEnvironment.step`
and :meth:`~CountingEnvironment.run` (with a numeric ``until``, the run loop's slices) process
events exactly as SimPy does -- the same queue, the same order, the same callbacks, the same
failure and stop semantics -- and count them in ``steps`` (``summary.events``). Both are
written out here (one loop, :meth:`CountingEnvironment._loop`), rather than wrapping SimPy's,
because the run loop is the simulator's innermost loop: per event it saves the wrapper's call
and ``run``'s call of ``step``. The clock ``now`` is a plain attribute, not SimPy's property
(the simulator reads it several times an event); the loop keeps it equal to SimPy's ``_now``.

Contract (tested against SimPy's own loop in ``tests/sim/test_simenv.py``): for any process
set, ``run(until=t)`` leaves the clock, the queue and every event's state as
``simpy.Environment.run(until=t)`` does and returns the same value; an event that failed and
was not defused crashes the run with a copy of its exception, chained to the original.
"""

from __future__ import annotations

from heapq import heappop
from typing import Any

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import URGENT, Event, EventPriority

__all__ = ["CountingEnvironment"]

#: SimPy re-queues the event a StopSimulation interrupted one priority ahead of URGENT
_RESUME_FIRST = EventPriority(URGENT - 1)


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts processed events (``steps``)."""

    #: the current simulation time, SimPy's ``_now`` (invariant: ``now == _now``; only
    #: :meth:`_loop` advances the clock); an attribute where SimPy has a property
    now: float = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.now = self._now
        self.steps = 0

    def step(self) -> None:
        """Process the next event (SimPy's ``step``), counting it; raises
        :class:`simpy.core.EmptySchedule` when none is left."""
        self._loop(1)

    def run(self, until: Any = None) -> Any:
        """SimPy's ``run``; a numeric ``until`` runs :meth:`_loop` directly (no call per
        event), anything else goes through SimPy's ``run`` (and this ``step``)."""
        if until is None or isinstance(until, Event):
            return super().run(until)
        at = until if isinstance(until, int) else float(until)
        if at <= self._now:
            raise ValueError(f"until ({at}) must be greater than the current simulation time")
        stop = Event(self)  # the stop event, ahead of every regular event at `at`
        stop._ok = True
        stop._value = None
        self.schedule(stop, URGENT, at - self._now)
        stop.callbacks.append(StopSimulation.callback)
        try:
            self._loop(-1)
        except StopSimulation as exc:
            return exc.args[0]
        except EmptySchedule:
            raise RuntimeError(
                f'No scheduled events left but "until" event was not triggered: {stop}'
            ) from None
        raise AssertionError("unreachable: the loop ends by StopSimulation or EmptySchedule")

    def _loop(self, limit: int) -> None:
        """Process ``limit`` events (a negative limit: until an exception ends the loop),
        counting each: pop the next, run its callbacks (detached first, so none can be added
        meanwhile); on a StopSimulation put the ones not yet run back, re-queue the event
        first in line and re-raise; crash on a failed event nobody defused. Raises
        :class:`simpy.core.EmptySchedule` when no event is left."""
        queue = self._queue
        while limit:
            try:
                now, _, _, event = heappop(queue)
            except IndexError:
                raise EmptySchedule from None
            self._now = self.now = now
            self.steps += 1
            callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
            try:
                for cb in callbacks:
                    cb(event)
            except StopSimulation:
                event.callbacks = callbacks[callbacks.index(cb) + 1 :]
                self.schedule(event, _RESUME_FIRST)
                raise
            if not event._ok and not hasattr(event, "_defused"):
                _crash(event)
            limit -= 1


def _crash(event: Event) -> None:
    """Raise a copy of failed ``event``'s exception, chained to it (its traceback stays)."""
    exc = type(event._value)(*event._value.args)
    exc.__cause__ = event._value
    raise exc
