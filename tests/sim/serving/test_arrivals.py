"""Open-loop arrivals: the events, times and order of a process yielding one timeout per
arrival (the reference below), without the process."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving import arrivals
from sim.serving.arrivals import OpenLoop
from sim.simenv import CountingEnvironment


def _reference(
    env: simpy.Environment, times: list[float], rej: list[bool], log: list[Any]
) -> Generator[simpy.Event, Any, None]:
    for rid, t in enumerate(times):
        dt = t - env.now
        if dt > 0:
            yield env.timeout(dt)
        log.append((env.now, "reject" if rej[rid] else "dispatch", rid))


def _rival(env: simpy.Environment, times: list[float], log: list[Any]) -> Generator[Any, Any, None]:
    """Another process with events at the arrival times: ties show the order of events."""
    for t in times[::2]:
        if t > env.now:
            yield env.timeout(t - env.now)
        log.append((env.now, "rival", -1))


def _run(times: list[float], rej: list[bool], ours: bool) -> tuple[list[Any], int]:
    env = CountingEnvironment()
    log: list[Any] = []
    env.process(_rival(env, times, log))
    if ours:
        OpenLoop(
            env,
            np.array(times, dtype=float),
            np.zeros(len(times), dtype=np.int64),
            np.array(rej, dtype=bool),
            lambda rid, m: log.append((env.now, "dispatch", rid)),
            lambda rid: log.append((env.now, "reject", rid)),
        ).start()
    else:
        env.process(_reference(env, times, rej, log))
    env.run(until=1e6)
    return log, env.steps


@settings(max_examples=120, deadline=None)
@given(
    gaps=st.lists(
        st.one_of(st.just(0.0), st.floats(1e-9, 5.0), st.sampled_from([0.1, 0.2, 0.3])),
        max_size=40,
    ),
    rej_bits=st.integers(0, 2**40),
)
def test_same_log_as_a_process_per_arrival(gaps: list[float], rej_bits: int) -> None:
    times = np.cumsum(gaps).tolist()  # float sums: times a clock cannot hit exactly
    rej = [bool(rej_bits >> i & 1) for i in range(len(times))]
    ref, ref_steps = _run(times, rej, ours=False)
    got, steps = _run(times, rej, ours=True)
    assert got == ref
    assert steps == ref_steps - 1  # no process to end after the last arrival


def test_each_request_once_in_order_across_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrivals, "SLICE", 3)  # slices of 3: every boundary case below
    times = [0.0, 0.0, 1.0, 1.0, 1.0, 2.5, 2.5, 4.0, 7.0, 7.0]
    models = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    env = CountingEnvironment()
    seen: list[tuple[float, int, int]] = []
    OpenLoop(
        env,
        np.array(times),
        np.array(models),
        np.zeros(len(times), dtype=bool),
        lambda rid, m: seen.append((env.now, rid, m)),
        lambda rid: pytest.fail(f"rejected {rid}"),
    ).start()
    env.run(until=100.0)
    assert seen == [(t, i, m) for i, (t, m) in enumerate(zip(times, models, strict=True))]
    assert env.steps == 1 + 4 + 1  # the start, one timeout per later distinct time, the stop


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in length: 2, 1, 2"):
        OpenLoop(
            CountingEnvironment(),
            np.zeros(2),
            np.zeros(1, dtype=np.int64),
            np.zeros(2, dtype=bool),
            lambda rid, m: None,
            lambda rid: None,
        )
