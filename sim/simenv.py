"""The simulator's SimPy environment: SimPy's event loop, counting the events it processes.

:class:`CountingEnvironment` is a :class:`simpy.Environment` whose :meth:`~CountingEnvironment.step`
and :meth:`~CountingEnvironment.run` (with a numeric ``until``, the run loop's slices) process
events exactly as SimPy does -- the same queue, the same order, the same callbacks, the same
failure and stop semantics -- and count them in ``steps`` (``summary.events``). Both are
written out here (one loop, :meth:`CountingEnvironment._loop`), rather than wrapping SimPy's,
because the run loop is the simulator's innermost loop: per event it saves the wrapper's call
and ``run``'s call of ``step``. The clock ``now`` is a plain attribute, not SimPy's property
(the simulator reads it several times an event); the loop keeps it equal to SimPy's ``_now``.

The environment's ``schedule``, ``timeout``, ``process`` and ``event`` are written out here
as well, with the same semantics as SimPy's: ``schedule`` queues an event exactly as SimPy
does; ``timeout`` makes a :class:`simpy.events.Timeout` and ``process`` a
:class:`simpy.events.Process` (subclasses whose constructor and ``_resume`` live here, so the
compiled build compiles them; ``docs/native-build.md``).

Contract (tested against SimPy's own loop in ``tests/sim/test_simenv.py``): for any process
set, ``run(until=t)`` leaves the clock, the queue and every event's state as
``simpy.Environment.run(until=t)`` does and returns the same value; an event that failed and
was not defused crashes the run with a copy of its exception, chained to the original; a
process resumes, fails and ends as SimPy's does.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import EmptySchedule, SimTime, StopSimulation
from simpy.events import NORMAL, URGENT, Event, EventPriority, Process, ProcessGenerator, Timeout

from engine.errors import SimulationStalled
from engine.limits import MIN_INTERVAL

__all__ = [
    "STALL_EVENTS",
    "CountingEnvironment",
    "ReadyEvent",
    "SimProcess",
    "SimTimeout",
    "SimulationStalled",
]

#: events at one instant after which a guarded run (``run(until, stall_events)``) counts the
#: simulation as stalled, unless its caller knows more may come at once (many arrivals)
STALL_EVENTS = 1_000_000

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

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: SimTime = 0) -> None:
        """Queue ``event`` at ``now + delay`` with ``priority`` (SimPy's ``schedule``)."""
        heappush(self._queue, (self._now + delay, priority, next(self._eid), event))

    def timeout(self, delay: SimTime = 0, value: Any = None) -> Timeout:
        """A :class:`simpy.events.Timeout` of ``delay`` (scheduled now) with ``value``."""
        return SimTimeout(self, delay, value)

    def process(self, generator: ProcessGenerator) -> Process:
        """Start ``generator`` as a :class:`simpy.events.Process` (it runs from an urgent
        event scheduled now)."""
        return SimProcess(self, generator)

    def event(self) -> Event:
        """A new pending :class:`simpy.events.Event`."""
        return Event(self)

    def step(self) -> None:
        """Process the next event (SimPy's ``step``), counting it; raises
        :class:`simpy.core.EmptySchedule` when none is left."""
        self._loop(1)

    def run(self, until: Any = None, stall_events: int | None = None) -> Any:
        """SimPy's ``run``; a numeric ``until`` runs :meth:`_loop` directly (no call per
        event), anything else goes through SimPy's ``run`` (and this ``step``).

        With a numeric ``until`` and ``stall_events``, the loop runs in slices of that many
        events and raises :class:`SimulationStalled` when a slice moves the clock by less
        than :data:`engine.limits.MIN_INTERVAL` (events that keep scheduling events at one
        instant or a hair later, e.g. an interval too small to move a float clock); the
        events, their order and the result are those of a run without it."""
        if until is None or isinstance(until, Event):
            return super().run(until)
        at = until if isinstance(until, int) else float(until)
        if at <= self._now:
            raise ValueError(f"until ({at}) must be greater than the current simulation time")
        stop = ReadyEvent(self)  # the stop event, ahead of every regular event at `at`
        self.schedule(stop, URGENT, at - self._now)
        stop.callbacks.append(StopSimulation.callback)
        try:
            if stall_events is None:
                self._loop(-1)
            while stall_events is not None:
                start = self._now
                self._loop(stall_events)
                if self._now - start < MIN_INTERVAL:
                    raise SimulationStalled(
                        f"simulated time stopped advancing at t={start:.9g} s: "
                        f"{stall_events:,} events in less than {MIN_INTERVAL:g} s of it"
                        f"{self._culprit()}"
                    )
        except StopSimulation as exc:
            return exc.args[0]
        except EmptySchedule:
            raise RuntimeError(
                f'No scheduled events left but "until" event was not triggered: {stop}'
            ) from None
        raise AssertionError("unreachable: the loop ends by StopSimulation or EmptySchedule")

    def _culprit(self) -> str:
        """``" (next: NAME)"``: the process the next queued event resumes, if any."""
        if not self._queue:
            return ""
        event = self._queue[0][3]
        for cb in event.callbacks or []:
            proc = getattr(cb, "__self__", None)
            gen = getattr(proc, "_generator", None)
            if gen is not None:
                return f" (next: the process {getattr(gen, '__qualname__', gen)})"
        return ""

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


class ReadyEvent(Event):
    """An event triggered at creation (succeeded with ``value``) and not yet scheduled: the
    creator schedules it (with the priority and delay it needs) and adds its callbacks."""

    def __init__(self, env: simpy.Environment, value: Any = None) -> None:
        super().__init__(env)
        self._ok = True
        self._value = value


class SimTimeout(Timeout):
    """SimPy's :class:`~simpy.events.Timeout`: triggered at creation, processed ``delay``
    later with ``value``; a negative delay is a ``ValueError``."""

    def __init__(self, env: simpy.Environment, delay: SimTime, value: Any = None) -> None:
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        self.env = env
        self.callbacks = []
        self._value = value
        self._delay = delay
        self._ok = True
        # env.schedule(self, NORMAL, delay), without the call
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))


class SimProcess(Process):
    """SimPy's :class:`~simpy.events.Process`, resumed by :meth:`_resume` below.

    Resumption as SimPy's: the generator is sent each event's value (or thrown a copy of a
    failed event's exception, which defuses the event) until it yields an event not yet
    processed, whose callbacks then resume it; an event already processed is sent back at
    once. When the generator returns, the process succeeds with the returned value; when it
    raises, the process fails with that exception; either way it is scheduled now. Yielding
    anything that is not an event is a ``RuntimeError``.
    """

    def resume_with(self, event: Event) -> None:
        """Stop waiting for the current target (a pending or triggered event, which then
        fires without resuming this process) and resume now with ``event``'s outcome, as an
        interrupt resumes a process but without an exception."""
        self._target.callbacks.remove(self._resume)
        self._resume(event)

    def _resume(self, event: Event) -> None:
        env = self.env
        env._active_proc = self
        gen = self._generator
        nxt: Any = None
        while True:
            try:
                if event._ok:
                    nxt = gen.send(event._value)
                else:
                    event.defused = True  # the process handles (or dies of) the failure
                    nxt = gen.throw(_copy_failure(_failure(event)))
            except StopIteration as stop:
                self._ok = True
                self._value = stop.args[0] if stop.args else None
                env.schedule(self)
                nxt = None
                break
            except BaseException as err:
                self._ok = False
                tb = err.__traceback__
                if tb is not None and tb.tb_frame.f_code.co_name == "_resume":
                    err.__traceback__ = tb.tb_next  # this frame adds nothing (none compiled)
                self._value = err
                env.schedule(self)
                nxt = None
                break
            try:
                callbacks = nxt.callbacks
            except AttributeError:
                raise RuntimeError(f'Invalid yield value "{nxt}"') from None
            if callbacks is not None:  # pending or triggered: resume when it is processed
                callbacks.append(self._resume)
                break
            event = nxt  # already processed: its value goes straight back
        self._target = nxt
        env._active_proc = None


def _copy_failure(exc: BaseException) -> BaseException:
    """A copy of a failed event's exception, chained to it: each process that handles the
    failure gets its own (its traceback stays the original's).

    The copy has the original's type, ``args``, message and instance attributes (those its
    constructor set, and notes), and ``__cause__`` is the original, whose own chain is kept.
    SimPy rebuilds the exception as ``type(exc)(*exc.args)``; that is used when it gives back
    the same ``args`` and message. An exception whose constructor takes other arguments than
    its ``args`` (``KVOutOfBlocks(message, needed, available)``) is copied without calling
    its constructor, so the real error surfaces instead of a ``TypeError`` from rebuilding it.
    """
    cls = type(exc)
    copy: BaseException | None
    try:
        copy = cls(*exc.args)
    except Exception:  # the constructor wants other arguments than args
        copy = None
    if copy is None or copy.args != exc.args or str(copy) != str(exc):
        copy = cls.__new__(cls, *exc.args)
        copy.args = exc.args
    copy.__dict__.update(exc.__dict__)
    copy.__cause__ = exc
    return copy


def _crash(event: Event) -> None:
    """Raise a copy of failed ``event``'s exception, chained to it (its traceback stays)."""
    raise _copy_failure(_failure(event))


def _failure(event: Event) -> BaseException:
    """The exception a failed ``event`` holds (its ``value``)."""
    err = event.value
    if not isinstance(err, BaseException):
        raise TypeError(f"{event} failed with a value that is not an exception: {err!r}")
    return err
