"""The op tables' clock: NumPy ops are timed on the calling thread's CPU time
(load-robust), and the timer reads the clock it is given."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hwbench.opprobe import op_clock
from hwbench.probes import time_op
from sim.serving.opcost import TableOrigin

ORG = TableOrigin(device="cpu", framework="numpy", measured_at="2026-12-01", source="test")


def test_numpy_ops_are_timed_on_thread_cpu_time() -> None:
    assert op_clock(np) is time.thread_time


def test_time_op_reads_the_clock_it_is_given() -> None:
    ticks = iter([0.0, 1.0, 1.0, 3.0, 3.0, 6.0])  # start/end pairs: 1, 2, 3 s
    calls: list[int] = []
    out = time_op(lambda: calls.append(1), 1, 3, clock=lambda: next(ticks))
    assert out == [1.0, 2.0, 3.0] and len(calls) == 4  # one warm-up call, untimed


def test_thread_cpu_time_leaves_out_a_wait() -> None:
    """A call that blocks (as a preempted thread does) accrues no CPU time: the wall clock
    reads the 50 ms wait, the op clock much less."""
    clock = op_clock(np)
    ev = threading.Event()
    wall = time_op(lambda: ev.wait(0.05), 0, 1)[0]
    cpu = time_op(lambda: ev.wait(0.05), 0, 1, clock=clock)[0]
    assert wall >= 0.045 and cpu < 0.02


def _streamed_weights(tmp_path: Path) -> Any:
    from hwbench.validate import run_engine
    from hwbench.workloads import ValidationWorkload

    w = ValidationWorkload(
        "t", "streaming", requests=3, rate=1e9, hbm_fraction=0.6, input_low=16,
        input_high=32, output_low=2, output_high=3, seed=1,
    )  # fmt: skip
    _, weights = run_engine(w, tmp_path)
    return weights


def test_weight_reads_count_their_cpu_time(tmp_path: Path) -> None:
    """The fetch probe's copy rate on NumPy divides the bytes by the reads' thread CPU time
    (``fetch_cpu_s``): positive whenever bytes moved."""
    weights = _streamed_weights(tmp_path)
    assert weights.fetch_bytes > 0
    assert weights.fetch_cpu_s > 0.0 and weights.fetch_s > 0.0


@pytest.mark.timing
def test_weight_reads_cpu_time_stays_within_their_wall_time(tmp_path: Path) -> None:
    """A thread cannot run longer than it takes: the reads' CPU seconds are at most their wall
    seconds, up to the two clocks' resolution (a few microseconds per read)."""
    weights = _streamed_weights(tmp_path)
    assert weights.fetch_cpu_s <= weights.fetch_s * 1.01 + 1e-4
