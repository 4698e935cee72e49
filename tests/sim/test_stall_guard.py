"""The runtime guard of the event loop: a run whose simulated clock cannot advance stops.

Intervals too small to move a float clock are refused on load (``engine.limits``); these tests
bypass that check to show the safety net behind it: :meth:`CountingEnvironment.run` with
``stall_events`` raises :class:`SimulationStalled` naming the process, and changes nothing
for a run that advances.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import typer

from sim.simenv import CountingEnvironment, SimulationStalled


def _ticker(env: CountingEnvironment, start: float, step: float) -> Generator[Any, Any, None]:
    yield env.timeout(start)
    while True:
        yield env.timeout(step)


@pytest.mark.parametrize(("start", "step"), [(1.0, 1e-300), (0.0, 1e-300), (3.0, 0.0)])
def test_a_clock_that_cannot_advance_raises_naming_the_process(start: float, step: float) -> None:
    env = CountingEnvironment()
    env.process(_ticker(env, start, step))
    with pytest.raises(SimulationStalled, match=r"_ticker") as err:
        env.run(until=10.0, stall_events=5_000)
    assert f"t={start:.9g} s" in str(err.value)
    assert env.steps <= 3 * 5_000


def _worker(env: CountingEnvironment, seed: int, log: list[tuple[float, int]]) -> Any:
    for i in range(200):
        yield env.timeout(((seed * 7919 + i * 104729) % 1000 + 1) * 1e-3)
        log.append((env.now, seed))


def test_the_guard_changes_nothing_for_a_run_that_advances() -> None:
    runs = []
    for guard in (None, 7):
        env = CountingEnvironment()
        log: list[tuple[float, int]] = []
        for seed in range(5):
            env.process(_worker(env, seed, log))
        env.run(until=50.0, stall_events=guard)
        runs.append((env.now, env.steps, log))
    assert runs[0] == runs[1]
    assert runs[0][1] > 400


@pytest.mark.slow
def test_a_run_whose_clock_stalls_exits_1_within_seconds(tmp_path: Path) -> None:
    """burst-traffic's degradation variant with ``max_wait`` forced below the load check."""
    from pdsim.cli.chaos import run_or_report
    from sim.scenario import load_scenario, variant
    from sim.shipped import resolve_scenario

    sc = load_scenario(resolve_scenario("burst-traffic"))
    sc = variant(sc, sc.variants[-1])
    sc.workload.requests = 2000
    assert sc.degradation.enabled
    sc.degradation.max_wait = 1e-300  # no validation on assignment: the guard must catch it
    t0 = time.process_time()
    with pytest.raises(typer.Exit) as err:
        run_or_report(sc, 0, tmp_path / "out")
    assert err.value.exit_code == 1
    assert time.process_time() - t0 < 60
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
