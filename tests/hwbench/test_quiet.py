"""hwbench.quiet: the share of the machine's CPU that went to other processes or to steal
between two samples; this process's own work does not count; warnings name the shares."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwbench.quiet import (
    KEY,
    QUIET_LIMIT,
    SPEED_LIMIT,
    Load,
    Sample,
    between,
    recorded,
    recorded_reference,
    reference_seconds,
    sample,
    speed_warning,
    warning,
)

SPIN = "import time\nend = time.perf_counter() + {s}\nwhile time.perf_counter() < end: pass\n"


@given(
    cap=st.floats(1.0, 1e4),
    busy=st.floats(0.0, 1.0),
    own=st.floats(0.0, 1.0),
    steal=st.floats(0.0, 1.0),
)
def test_between_is_others_busy_and_steal_over_capacity(
    cap: float, busy: float, own: float, steal: float
) -> None:
    """Reference: the shares written out; busy includes our own time (clamped to [0, 1])."""
    a = Sample(busy=100.0, steal=5.0, capacity=1000.0, own=20.0)
    b = Sample(100.0 + busy * cap, 5.0 + steal * cap, 1000.0 + cap, 20.0 + own * cap)
    load = between(a, b)
    assert load is not None
    assert load.others == pytest.approx(min(max(busy - own, 0.0), 1.0), abs=1e-9)
    assert load.steal == pytest.approx(steal, abs=1e-9)
    assert load.quiet == (load.others <= QUIET_LIMIT and load.steal <= QUIET_LIMIT)


def test_between_without_samples_or_time_is_none() -> None:
    s = Sample(1.0, 0.0, 10.0, 0.5)
    assert between(None, s) is None and between(s, None) is None
    assert between(s, s) is None  # no capacity elapsed


def test_warning_names_the_shares_only_when_not_quiet() -> None:
    assert warning(None, "calibration") is None
    assert warning(Load(QUIET_LIMIT, 0.0), "calibration") is None
    text = warning(Load(0.35, 0.02), "calibration")
    assert text is not None and "calibration" in text and "35%" in text and "2%" in text


def test_recorded_reads_what_calibrate_wrote() -> None:
    assert recorded({}) is None and recorded({KEY: []}) is None
    load = recorded({KEY: [{"others": 0.4, "steal": 0.01}], "other": [{"x": 1.0}]})
    assert load == Load(0.4, 0.01) and not load.quiet
    text = warning(load, "its calibration")
    assert text is not None and "its calibration" in text and "40%" in text


def test_speed_warning_only_beyond_the_limit_and_says_which_way() -> None:
    assert speed_warning(None, 0.1, "now") is None and speed_warning(0.1, None, "now") is None
    assert speed_warning(0.1 * (1 + SPEED_LIMIT * 0.99), 0.1, "now") is None
    assert speed_warning(0.1 * (1 - SPEED_LIMIT * 0.99), 0.1, "now") is None
    slow = speed_warning(0.13, 0.1, "now than at calibration")
    assert slow is not None and "30% slower now than at calibration" in slow
    fast = speed_warning(0.08, 0.1, "now")
    assert fast is not None and "20% faster" in fast


def test_recorded_reference_and_load_read_their_own_fields() -> None:
    only_ref = {KEY: [{"reference_s": 0.1}]}  # a machine without /proc counters
    assert recorded_reference(only_ref) == 0.1 and recorded(only_ref) is None
    assert recorded_reference({}) is None
    assert recorded_reference({KEY: [{"others": 0.0, "steal": 0.0}]}) is None


def test_reference_workload_rejects_no_repeats() -> None:
    with pytest.raises(ValueError, match="repeats"):
        reference_seconds(repeats=0)


@pytest.mark.timing
def test_reference_workload_time_grows_with_its_work() -> None:
    """Wall-clock times: a busy machine can invert them, so the ``timing`` tier runs it."""
    short = reference_seconds(repeats=3, steps=100)
    long = reference_seconds(repeats=3, steps=1000)
    assert 0 < short < long  # ten times the work; a steady machine gives ~10x


needs_proc = pytest.mark.skipif(sample() is None, reason="no /proc CPU counters here")


@pytest.mark.timing
@needs_proc
def test_other_processes_count_and_our_own_work_does_not() -> None:
    """Reads the whole machine's CPU counters: another process's load shows up in the "own"
    half, so it runs in the ``timing`` tier only."""
    n = os.cpu_count() or 1
    spin = [sys.executable, "-c", SPIN.format(s=1.5)]
    # our own threads' work and children we have waited for are this process's time
    a = sample()
    stop = time.perf_counter() + 0.5
    while time.perf_counter() < stop:  # the same spin, in this process
        pass
    kids = [subprocess.Popen(spin) for _ in range(n)]
    for k in kids:
        k.wait()
    own = between(a, sample())
    assert own is not None and own.others < 0.5
    # the same spinners, still running at the second sample: other processes
    mid = sample()
    kids = [subprocess.Popen(spin) for _ in range(n)]
    time.sleep(1.4)
    end = sample()
    for k in kids:
        k.wait()
    others = between(mid, end)
    assert others is not None and others.others > 0.5
    assert warning(others, "x") is not None


def test_speed_moved_against_calibration_and_within_the_validation() -> None:
    """Samples 100 and 110 ms against 100 ms at calibration: 10%; against 120 ms: the larger
    of their own spread (110 / 100 - 1 = 10%) and |100 / 120 - 1| = 16.7%; unknown
    calibration: the spread alone; no samples: 0."""
    from hwbench.quiet import speed_moved

    assert speed_moved([0.100, 0.110], 0.100) == pytest.approx(0.10)
    assert speed_moved([0.100, 0.110], 0.120) == pytest.approx(1 / 6)
    assert speed_moved([0.100, 0.110], None) == pytest.approx(0.10)
    assert speed_moved([0.100, 0.100], 0.100) == 0.0
    assert speed_moved([], 0.1) == 0.0


def test_reference_workload_reads_the_injected_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that advances 50 ms per reading makes every timed run 50 ms long."""
    import hwbench.quiet

    ticks = iter([0.05 * i for i in range(1, 100)])
    monkeypatch.setattr(hwbench.quiet, "reference_clock", lambda: float(next(ticks)))
    assert hwbench.quiet.reference_seconds(repeats=3, steps=2) == pytest.approx(0.05)
