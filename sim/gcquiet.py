"""Garbage collection while a simulation runs: what exists at the start is frozen, and
young collections run less often.

A run allocates and frees millions of short-lived objects (events, tuples, floats) and makes
few reference cycles, yet CPython's cyclic collector traverses every tracked object of the
older generations at each of their collections: the whole cluster (cache entries, block
tables, queues). :func:`quiet_gc` moves every object that exists when the run starts into the
permanent generation (:func:`gc.freeze`), where no collection looks, and raises the youngest
generation's threshold from CPython's 700 allocations to :data:`YOUNG_THRESHOLD`. Reference
counting frees objects exactly as before and cycles the run makes are still collected, so
nothing observable changes: the simulator has no finalizer or weak reference whose timing
could alter a result (the determinism tests hash whole runs), and peak memory stays the same
(``benchmarks/sim_speed.py`` reports it).

Re-entrant: a run inside a run (a plan's simulations in one process) leaves the settings to
the outermost, which restores the thresholds and unfreezes on exit, exception or not.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: allocations (net of deallocations) between two collections of the youngest generation
YOUNG_THRESHOLD = 50_000

_depth = 0


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Freeze the objects that exist now and collect young objects less often until the
    block ends (see the module docstring); nested uses are no-ops."""
    global _depth
    outer = _depth == 0
    _depth += 1
    saved = gc.get_threshold()
    if outer:
        gc.freeze()
        gc.set_threshold(YOUNG_THRESHOLD, saved[1], saved[2])
    try:
        yield
    finally:
        _depth -= 1
        if outer:
            gc.set_threshold(*saved)
            gc.unfreeze()
