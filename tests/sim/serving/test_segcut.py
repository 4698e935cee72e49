"""A segment cut wakes the waiting process as an interrupt would, with the value CUT."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from sim.serving.segcut import CUT, SegmentCut
from sim.simenv import CountingEnvironment


def _waiter(env: simpy.Environment, log: list[Any], box: dict[str, Any], mode: str) -> Generator:
    """Three segments of 10 s; an arrival cuts (mode "cut") or interrupts one; a kill ends it."""
    try:
        for _ in range(3):
            seg = box["seg"] = env.timeout(10.0)
            if mode == "cut":
                v = yield seg
                log.append((env.now, "cut" if v is CUT else "done"))
                continue
            try:
                yield seg
                log.append((env.now, "done"))
            except simpy.Interrupt as intr:
                if intr.cause is not None:
                    raise
                log.append((env.now, "cut"))
    except simpy.Interrupt:
        log.append((env.now, "killed"))


def _arrivals(
    env: simpy.Environment,
    proc: simpy.Process,
    box: dict[str, Any],
    mode: str,
    at: list[float],
    kill_at: float | None,
) -> Generator:
    for t in at:
        yield env.timeout(t - env.now)
        if kill_at is not None and t == kill_at:
            proc.interrupt("kill")
        if not proc.is_alive:
            continue
        if mode == "cut":
            SegmentCut(proc, box["seg"])
        else:
            proc.interrupt()


def _run(mode: str, at: list[float], kill_at: float | None = None) -> tuple[list[Any], int]:
    env = CountingEnvironment()
    log: list[Any] = []
    box: dict[str, Any] = {}
    proc = env.process(_waiter(env, log, box, mode))
    env.process(_arrivals(env, proc, box, mode, at, kill_at))
    env.run(until=100.0)
    return log, env.steps


def test_cut_wakes_now_like_an_interrupt() -> None:
    """Same wake-up times, same outcome and the same number of events as SimPy's interrupt."""
    at = [3.0, 3.0 + 2.5, 40.0]
    got, got_steps = _run("cut", at)
    ref, ref_steps = _run("interrupt", at)
    assert got == ref == [(3.0, "cut"), (5.5, "cut"), (15.5, "done")]
    assert got_steps == ref_steps


def test_cut_after_the_process_ended_does_nothing() -> None:
    """A kill processed before the cut ends the process; the cut then leaves it alone."""
    got, got_steps = _run("cut", [4.0], kill_at=4.0)
    ref, ref_steps = _run("interrupt", [4.0], kill_at=4.0)
    assert got == ref == [(4.0, "killed")]
    assert got_steps == ref_steps


def test_a_cut_segment_still_fires_with_nobody_waiting() -> None:
    env = CountingEnvironment()
    seen: list[Any] = []

    def proc() -> Generator:
        seg = env.timeout(10.0)
        holder.append(seg)
        seen.append((yield seg))
        yield env.timeout(20.0)  # keep waiting on something else past the old timeout

    holder: list[simpy.Event] = []
    p = env.process(proc())
    env.run(until=1.0)
    SegmentCut(p, holder[0])
    env.run(until=2.0)
    assert seen == [CUT]
    env.run(until=15.0)
    assert holder[0].processed and p.is_alive  # fired at 10 s without resuming the process
