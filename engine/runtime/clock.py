"""The engine's clock: wall time, optionally minus the time its thread waited for a CPU.

On a shared machine the operating system takes the engine's core away now and then; the
wall-clock cost of the same work then varies from minute to minute with other people's load
(on the 2-core VM this project runs on, the same workload's median latency moved by 45%
between consecutive runs). A calibration measured at one load level cannot predict a run at
another. :class:`RunClock` with ``exclude_cpu_wait=True`` subtracts the time the calling
thread spent *runnable but not running* (Linux ``/proc/<tid>/schedstat``, second field: time
waiting on a run queue), i.e. it measures the engine as if it had its core to itself. The
calibration probe and the validation runs use the same clock, so contention cancels out.
Where ``schedstat`` is missing the clock is plain wall time (``exclude_cpu_wait`` is then
reported False).

Caveat: the run-queue wait also counts time the engine's *own* other threads (the prefetch
worker) ran on the engine thread's core, which is the engine's work, not other people's. The
scheduler moves threads between sharing a core and not, so with ``exclude_cpu_wait=True`` the
same streamed iteration reads very differently from one moment to the next (on the 2-core VM
~2.7 ms while both threads share a core, ~5 ms while they do not; wall time: 4.5-4.8 ms either
way). ``hwbench.validate`` therefore serves with plain wall time on a quiet machine.

Invariant: readings never decrease (run-queue wait grows at most as fast as wall time; the
reading is clamped to the previous one regardless).

:class:`VirtualClock` has the same interface but no relation to wall time: it moves only when
told (``sleep``) plus a fixed tick per reading, so a run driven by it does not depend on how
fast the machine is or what else runs on it (tests that compare decisions use it).
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["RunClock", "VirtualClock", "thread_cpu_wait"]


def thread_cpu_wait(native_id: int) -> float:
    """Seconds thread ``native_id`` of this process has spent runnable but not running
    (0.0 where ``/proc`` does not say)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return 0.0


class RunClock:
    """Seconds since construction; see the module docstring. Call from the thread whose CPU
    waits are to be excluded (its id is taken at construction); reading from another thread
    is allowed (it reads the same thread's counters)."""

    def __init__(self, exclude_cpu_wait: bool = True) -> None:
        self._fd: int | None = None
        if exclude_cpu_wait:
            try:
                path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
                self._fd = os.open(path, os.O_RDONLY)
            except OSError:
                self._fd = None
        self.exclude_cpu_wait = self._fd is not None
        self._t0 = time.perf_counter()
        self._w0 = self._waited()
        self._last = 0.0
        self._excluded = 0.0  # other threads' CPU waits the engine thread blocked on

    def _waited(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 128, 0).split()[1]) * 1e-9

    def __call__(self) -> float:
        t = time.perf_counter() - self._t0 - (self._waited() - self._w0) - self._excluded
        if t < self._last:
            t = self._last
        self._last = t
        return t

    def exclude(self, seconds: float) -> None:
        """Also leave out ``seconds`` the engine thread spent blocked on another thread
        while that thread waited for a CPU (see :func:`thread_cpu_wait`)."""
        if self.exclude_cpu_wait and seconds > 0:
            self._excluded += seconds

    def close(self) -> None:
        """Release the counters file (the clock keeps working as wall time)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class VirtualClock:
    """A clock that ignores wall time: each reading advances it by ``tick`` seconds and
    :meth:`sleep` advances it by the time slept (without sleeping). Work therefore takes
    (almost) no time on it, and an engine that sleeps until the next arrival reaches it
    exactly, however slow the machine is. Same interface as :class:`RunClock` (``exclude``
    and ``close`` do nothing; ``exclude_cpu_wait`` is False). Safe to read from several
    threads; readings never decrease."""

    exclude_cpu_wait = False

    def __init__(self, tick: float = 1e-6) -> None:
        if tick < 0:
            raise ValueError(f"tick must be >= 0, got {tick}")
        self.tick = tick
        self._t = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._t += self.tick
            return self._t

    def sleep(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` (negative: no change); returns at once."""
        if seconds > 0:
            with self._lock:
                self._t += seconds

    def exclude(self, seconds: float) -> None:
        """Nothing to leave out: the virtual clock never counts waits."""

    def close(self) -> None:
        """Nothing to release."""
