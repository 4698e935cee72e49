"""Was the machine quiet and steady while we measured? CPU used by other processes, steal,
and the speed of a fixed reference workload.

Calibration and validation time real work in wall-clock seconds. Another process competing
for the cores, or a hypervisor taking them away (steal), makes every measurement slower. A
profile calibrated that way predicts a slower machine than the one it will validate
against. :func:`sample` reads the machine's and this process's CPU counters (Linux
``/proc/stat`` and ``/proc/self/stat``). :func:`between` turns two samples into the share
of the machine's CPU capacity that went to other processes (``others``) or to the
hypervisor (``steal``) in between. The CLI warns above :data:`QUIET_LIMIT`.

Where ``/proc`` is missing, :func:`sample` returns None and no check is made.

A VM can also run slower for minutes because its host is busy, which need not show as
steal. On the 2-core VM one calibration ran during such a spell: the engine's serving terms
came out ~10% slow (decode scale 1.09 against 0.94-0.99 in other calibrations) and the
streaming overheads 3-8 ms against 0-1.8 ms. The simulator with that profile was then 16-33%
slow at P50. :func:`reference_seconds` times a fixed NumPy workload shaped like the
validation decoder's decode step. ``pdsim calibrate`` times it at its start and its end,
rejects the calibration when the two differ by more than :data:`SPEED_LIMIT`
(:func:`speed_warning` gives the reason) and records their mean in the profile; ``pdsim
validate`` times it again and warns when the machine runs more than :data:`SPEED_LIMIT`
slower or faster than at calibration.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "KEY",
    "QUIET_LIMIT",
    "SPEED_LIMIT",
    "Load",
    "Sample",
    "between",
    "recorded",
    "recorded_reference",
    "reference_clock",
    "reference_seconds",
    "sample",
    "speed_moved",
    "speed_warning",
    "warning",
]

#: the profile's ``fitted`` table where ``pdsim calibrate`` records its :class:`Load`
KEY = "calibration_load"

#: above this share of the machine's CPU capacity taken by other processes or by steal, the
#: measurements are not trusted (a quiet 2-core VM shows 0.5-3%: kernel threads, the shell)
QUIET_LIMIT = 0.10

#: above this change of the reference workload's time (now against the profile's, or over
#: one calibration) the timings are not comparable (its own spread on a steady machine: ~1%)
SPEED_LIMIT = 0.05


class Sample(NamedTuple):
    """CPU counters at one instant (seconds): the machine's busy time outside steal (all
    cores), its steal time, the time its cores existed in all (busy, idle and steal), and
    this process's own CPU time (all its threads and waited-for children)."""

    busy: float
    steal: float
    capacity: float
    own: float


class Load(NamedTuple):
    """Between two samples: the shares of the machine's CPU capacity that other processes
    used (``others``) and the hypervisor took (``steal``), each in [0, 1]."""

    others: float
    steal: float

    @property
    def quiet(self) -> bool:
        """Both shares at most :data:`QUIET_LIMIT`."""
        return self.others <= QUIET_LIMIT and self.steal <= QUIET_LIMIT


def sample() -> Sample | None:
    """This instant's counters; None where ``/proc`` does not give them."""
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        with open("/proc/stat", encoding="ascii") as fh:
            head = fh.readline().split()
        with open("/proc/self/stat", encoding="ascii") as fh:
            own_fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, AttributeError):
        return None
    if not head or head[0] != "cpu" or len(head) < 9:
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    user, nice, system, idle, iowait, irq, softirq, steal = (float(x) for x in head[1:9])
    busy = user + nice + system + irq + softirq
    # after the command name: state is field 3, utime..cstime are fields 14-17 (1-based)
    utime, stime, cutime, cstime = (float(x) for x in own_fields[11:15])
    return Sample(
        busy=busy / tick,
        steal=steal / tick,
        capacity=(busy + idle + iowait + steal) / tick,
        own=(utime + stime + cutime + cstime) / tick,
    )


def between(a: Sample | None, b: Sample | None) -> Load | None:
    """The :class:`Load` from ``a`` to ``b`` (None when either is None or no time passed).
    Counters tick in jiffies, so a window under a second or two is coarse."""
    if a is None or b is None:
        return None
    cap = b.capacity - a.capacity
    if cap <= 0:
        return None
    others = (b.busy - a.busy) - (b.own - a.own)
    return Load(
        others=min(max(others / cap, 0.0), 1.0),
        steal=min(max((b.steal - a.steal) / cap, 0.0), 1.0),
    )


def warning(load: Load | None, what: str) -> str | None:
    """A one-line warning when ``load`` is not quiet (None otherwise): what was measured
    and how much of the machine went elsewhere."""
    if load is None or load.quiet:
        return None
    return (
        f"the machine was not quiet during {what}: other processes used {load.others:.0%} and "
        f"steal {load.steal:.0%} of its CPU (limit {QUIET_LIMIT:.0%}), so the timings are "
        "skewed; rerun on a quiet machine"
    )


def _recorded_row(fitted: Mapping[str, Any]) -> Mapping[str, Any]:
    """The row ``pdsim calibrate`` wrote to ``fitted[KEY]`` (empty when there is none)."""
    rows = fitted.get(KEY) or []
    return rows[0] if rows else {}


def recorded(fitted: Mapping[str, Any]) -> Load | None:
    """The :class:`Load` a profile's calibration recorded (``fitted[KEY]``); None if none."""
    row = _recorded_row(fitted)
    return Load(float(row["others"]), float(row["steal"])) if "others" in row else None


def recorded_reference(fitted: Mapping[str, Any]) -> float | None:
    """The reference workload's seconds a profile's calibration recorded (``fitted[KEY]``,
    ``reference_s``); None if none."""
    row = _recorded_row(fitted)
    return float(row["reference_s"]) if "reference_s" in row else None


#: the clock :func:`reference_seconds` times with (read at each call: a test injects a slowed
#: one to stand for a machine whose speed moved)
reference_clock: Callable[[], float] = time.perf_counter


def reference_seconds(repeats: int = 5, steps: int = 900) -> float:
    """Median wall seconds, over ``repeats`` timed runs after one untimed run, of a fixed NumPy
    workload shaped like a decode step of the validation decoder: ``steps`` times, a 512-wide
    float32 row through an RMS norm, a 512 x 1376 projection, a SiLU and a 1376 x 512
    projection (~0.19 s per run on the 2-core VM, BLAS on one thread). Seeded: the same
    work on every call."""
    if repeats < 1 or steps < 1:
        raise ValueError(f"repeats and steps must be >= 1, got {repeats}, {steps}")
    rng = np.random.default_rng(0)
    up = rng.standard_normal((512, 1376), dtype=np.float32) * np.float32(0.05)
    down = rng.standard_normal((1376, 512), dtype=np.float32) * np.float32(0.05)
    x0 = rng.standard_normal((1, 512), dtype=np.float32)

    def run(n: int) -> None:
        x = x0
        for _ in range(n):
            x = x / np.sqrt(np.mean(x * x) + np.float32(1e-6))  # RMS norm: values stay O(1)
            h = x @ up
            x = (h / (np.float32(1.0) + np.exp(-h))) @ down

    run(steps)  # a cold first run reads 2-8% slow (first-touch, clocks ramping up)
    times = []
    clock = reference_clock
    for _ in range(repeats):
        t0 = clock()
        run(steps)
        times.append(clock() - t0)
    return float(np.median(times))


def speed_warning(now_s: float | None, then_s: float | None, what: str) -> str | None:
    """A one-line warning when the reference workload took ``now_s`` against ``then_s``
    (both seconds) and they differ by more than :data:`SPEED_LIMIT` (None otherwise, or
    when either is missing): how much slower or faster, and ``what`` the two are."""
    if now_s is None or then_s is None or then_s <= 0:
        return None
    drift = now_s / then_s - 1.0
    if abs(drift) <= SPEED_LIMIT:
        return None
    way = "slower" if drift > 0 else "faster"
    return (
        f"the machine runs a fixed reference workload {abs(drift):.0%} {way} {what} "
        f"(limit {SPEED_LIMIT:.0%}), so its timings are not comparable; rerun on a steady "
        "machine"
    )


def speed_moved(samples: Sequence[float], then_s: float | None) -> float:
    """How far the machine's speed moved, as a share: the largest relative change of the
    reference workload's ``samples`` (seconds, timed during a validation) against ``then_s``
    (its calibration's; None: unknown) and against each other (``max / min - 1``). 0 without
    samples."""
    if not samples:
        return 0.0
    moved = max(samples) / min(samples) - 1.0
    if then_s is not None and then_s > 0:
        moved = max(moved, *(abs(x / then_s - 1.0) for x in samples))
    return moved
