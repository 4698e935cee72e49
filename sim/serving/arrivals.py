"""Open-loop arrivals: each request placed (or rejected) at its arrival time.

An open-loop workload draws every arrival time in advance (:mod:`sim.serving.workload`).
:class:`OpenLoop` walks them in order with one event per distinct arrival time, the events
a SimPy process yielding ``env.timeout(t - env.now)`` per arrival would make, at the same
times and in the same order: it starts from an urgent event scheduled when the run starts
(as a process starts), and each time it wakes it hands over the request it woke for, then
every later one already due (``t <= now``), and schedules a timeout ``t - now`` ahead for
the next. A callback rather than a process: no generator to resume per arrival, and the
optional compiled build compiles it (``docs/native-build.md``).

Times, models and the rejected mask are read a slice at a time as plain Python lists (no
NumPy scalar per request; memory bounded whatever the request count).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from simpy.events import URGENT, Event

from sim.simenv import CountingEnvironment, ReadyEvent, SimTimeout

#: arrivals are read this many at a time as plain Python lists
SLICE = 4096


class OpenLoop:
    """Arrivals at ``times`` (non-decreasing seconds, one per request id): ``reject(rid)``
    where ``rejected[rid]``, else ``dispatch(rid, models[rid])``; :meth:`start` once."""

    def __init__(
        self,
        env: CountingEnvironment,
        times: np.ndarray,
        models: np.ndarray,
        rejected: np.ndarray,
        dispatch: Callable[[int, int], None],
        reject: Callable[[int], None],
    ) -> None:
        if not len(times) == len(models) == len(rejected):
            raise ValueError(
                f"times, models and rejected differ in length: {len(times)}, {len(models)}, "
                f"{len(rejected)}"
            )
        self.env = env
        self._times = times
        self._models = models
        self._rejected = rejected
        self._dispatch = dispatch
        self._reject = reject
        self._n = len(times)
        self._next = 0  # the next request to hand over
        self._woken = False  # whether the pending timeout is request _next's own
        self._lo = 0  # the first request of the slice read
        self._t: list[float] = []
        self._m: list[int] = []
        self._rej: list[bool] = []

    def start(self) -> None:
        """Schedule the first wake-up: an urgent event now, as a process's start."""
        ev = ReadyEvent(self.env)
        ev.callbacks.append(self._wake)
        self.env.schedule(ev, URGENT)

    def _read(self, lo: int) -> None:
        hi = min(lo + SLICE, self._n)
        self._lo = lo
        self._t = self._times[lo:hi].tolist()
        self._m = self._models[lo:hi].tolist()
        self._rej = self._rejected[lo:hi].tolist()

    def _wake(self, _event: Event) -> None:
        env = self.env
        i, n = self._next, self._n
        woken = self._woken
        while i < n:
            j = i - self._lo
            if j >= len(self._t):
                self._read(i)
                j = 0
            if not woken:
                dt = self._t[j] - env.now
                if dt > 0:
                    self._next = i
                    self._woken = True
                    SimTimeout(env, dt).callbacks.append(self._wake)
                    return
            woken = False  # its own timeout has fired: no second look at the clock
            if self._rej[j]:
                self._reject(i)
            else:
                self._dispatch(i, self._m[j])
            i += 1
        self._next = n
        self._woken = False
