"""The engine probe: iterations grouped by shape, each with its overhead measured in place
(its seconds less its ops' seconds, the op timer's own cost taken out)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from engine.runtime.engine import IterationRecord
from hwbench.engine_probe import TINY_RUNS, _collect, _point, engine_probe, hook_cost
from hwbench.insitu_probe import OpTimer
from sim.serving.opcost.iteration import OP_NAMES


def ticking() -> Callable[[], float]:
    """A clock that advances one second per reading."""
    counter = itertools.count()
    return lambda: float(next(counter))


def test_hook_cost_on_a_ticking_clock() -> None:
    """A timed empty op reads the clock twice (two ticks added to its caller's time over a
    plain call) and records one tick as the op's own seconds."""
    timer = OpTimer(ticking())
    outside, inside = hook_cost(timer, calls=50)
    assert (outside, inside) == (2.0, 1.0)
    assert timer.calls == 0 and timer.take() == {}  # leaves the timer as it found it


def test_collect_leaves_iterations_after_idle_out_of_the_overhead() -> None:
    """Three decode iterations of one shape, the first after an idle spell (it starts the
    log) and the third 5 ms after the second ended: only the second's overhead counts."""
    log = [
        IterationRecord(0.0, 0.002, 0, 0, 0, 2, 100, 0.0),
        IterationRecord(0.00201, 0.002, 0, 0, 0, 2, 100, 0.0),
        IterationRecord(0.009, 0.002, 0, 0, 0, 2, 100, 0.0),
    ]
    rows: dict = {}
    _collect(rows, log, [7e-4, 4e-4, 9e-4])
    ((key, group),) = rows.items()
    p = _point(key, group)
    assert (p.count, p.overhead_count) == (3, 1)
    assert p.overhead_s == 4e-4 and p.mean_s == 0.002


def test_engine_probe_measures_every_iteration_in_place() -> None:
    """The tiny probe on NumPy: no run's first iteration (which follows the engine's start)
    carries an overhead, and the overheads are positive and a fraction of
    the iterations they belong to."""
    points = engine_probe(np, runs=TINY_RUNS, repeats=1, mixed=0)
    iterations = sum(max(out, 1) for _, _, out in TINY_RUNS)
    assert sum(p.count for p in points) == iterations
    # each run's first iteration follows the engine's start: never an overhead sample (a
    # later one may follow a pause of the machine and be left out too)
    assert 0 < sum(p.overhead_count for p in points) <= iterations - len(TINY_RUNS)
    firsts = {(p.tokens, p.batch) for p in points if p.batch == 0 and p.count == 1}
    assert all(p.overhead_count == 0 for p in points if (p.tokens, p.batch) in firsts)
    measured = [p for p in points if p.overhead_s is not None]
    assert measured and all(0.0 < p.overhead_s < p.mean_s for p in measured)  # type: ignore[operator]
    # every point carries its ops' seconds by the op model's names, less than its time
    names = set(OP_NAMES) | {"residual_add"}
    for p in points:
        ops = dict(p.op_s)
        assert {"qkv_gemm", "lm_head"} <= set(ops) <= names
        assert 0.0 < sum(ops.values()) < p.mean_s
