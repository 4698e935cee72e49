"""engine.runtime.clock.VirtualClock: moves only by its tick per reading and by sleep."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.runtime.clock import VirtualClock


@given(
    tick=st.floats(0.0, 1e-3),
    ops=st.lists(st.one_of(st.none(), st.floats(-1.0, 10.0)), max_size=50),
)
def test_virtual_clock_is_the_sum_of_ticks_and_sleeps(tick: float, ops: list[float | None]) -> None:
    """Reference: a running total (a reading adds ``tick``; a sleep adds max(s, 0))."""
    vc = VirtualClock(tick)
    total, last = 0.0, 0.0
    for op in ops:
        if op is None:
            total += tick
            now = vc()
            assert now == pytest.approx(total, abs=1e-9)
            assert now >= last
            last = now
        else:
            vc.sleep(op)
            total += max(op, 0.0)
    assert vc() == pytest.approx(total + tick, abs=1e-9)
    assert vc.exclude_cpu_wait is False


def test_virtual_clock_counts_every_reading_from_every_thread() -> None:
    vc = VirtualClock(tick=1.0)
    threads = [threading.Thread(target=lambda: [vc() for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert vc() == 4001.0


def test_virtual_clock_rejects_a_negative_tick() -> None:
    with pytest.raises(ValueError, match="tick"):
        VirtualClock(-1.0)
