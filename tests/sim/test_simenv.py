"""The counting environment processes events exactly as SimPy's own loop does."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.simenv import CountingEnvironment

#: one process's plan: (delay, action) steps; action 0 = wait, 1 = interrupt the next
#: process, 2 = succeed a shared event, 3 = wait on the shared event
Plan = list[tuple[float, int]]


def _world(env: simpy.Environment, plans: list[Plan], log: list[Any]) -> None:
    procs: list[simpy.Process] = []
    shared = [env.event()]

    def proc(i: int, plan: Plan) -> Generator[simpy.Event, Any, None]:
        for j, (delay, action) in enumerate(plan):
            try:
                if action == 3 and not shared[0].triggered:
                    v = yield shared[0]
                    log.append((env.now, i, j, "shared", v))
                else:
                    yield env.timeout(delay, value=(i, j))
                    log.append((env.now, i, j, "timeout"))
                if action == 1:
                    k = (i + 1) % len(procs)
                    if k != i and procs[k].is_alive:
                        procs[k].interrupt((i, j))
                elif action == 2 and not shared[0].triggered:
                    shared[0].succeed((i, j))
                    shared.append(shared[0])
            except simpy.Interrupt as intr:
                log.append((env.now, i, j, "interrupted", intr.cause))

    for i, plan in enumerate(plans):
        procs.append(env.process(proc(i, plan)))


_plans = st.lists(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.25]), st.integers(0, 3)),
        max_size=8,
    ),
    min_size=1,
    max_size=5,
)


def _run_slices(env: simpy.Environment, untils: list[float]) -> list[Any]:
    out: list[Any] = []
    for u in untils:
        if u > env.now:
            out.append(env.run(until=u))
        out.append((env.now, len(env._queue)))
    return out


@settings(max_examples=150, deadline=None)
@given(_plans, st.lists(st.sampled_from([0.5, 1.0, 2.0, 2.5, 4.0, 9.0]), min_size=1, max_size=4))
def test_same_events_as_simpy(plans: list[Plan], slices: list[float]) -> None:
    """The same log, clock and queue length after every slice as SimPy's own loop, and a
    count of processed events equal to the number of events SimPy stepped through."""
    untils = sorted(set(slices))
    ref_env, ref_log = simpy.Environment(), []
    _world(ref_env, plans, ref_log)
    stepped = [0]
    real_step = ref_env.step

    def counting_step() -> None:
        stepped[0] += 1
        real_step()

    ref_env.step = counting_step  # type: ignore[method-assign]
    ref = _run_slices(ref_env, untils)
    env, log = CountingEnvironment(), []
    _world(env, plans, log)
    got = _run_slices(env, untils)
    assert log == ref_log
    assert got == ref
    assert env.steps == stepped[0]


def test_until_in_the_past_is_refused() -> None:
    env = CountingEnvironment()
    env.run(until=1.0)
    with pytest.raises(ValueError, match="must be greater"):
        env.run(until=1.0)


def test_failed_event_crashes_the_run_with_a_chained_copy() -> None:
    env = CountingEnvironment()
    boom = ValueError("boom")
    env.timeout(1.0).callbacks.append(lambda _e: None)
    ev = env.event()
    ev.fail(boom)
    with pytest.raises(ValueError, match="boom") as info:
        env.run(until=5.0)
    assert info.value is not boom and info.value.__cause__ is boom


def test_defused_failure_does_not_crash() -> None:
    env = CountingEnvironment()
    ev = env.event()
    ev.fail(ValueError("handled"))
    ev.defused = True
    env.run(until=2.0)
    assert env.now == 2.0 and env.steps == 2  # the failed event, then the stop event


def test_until_an_event_and_until_none_use_simpy_semantics() -> None:
    env = CountingEnvironment()
    done = env.timeout(3.0, value="v")
    assert env.run(until=done) == "v"
    assert env.now == 3.0
    env.timeout(1.0)
    assert env.run() is None
    assert env.now == 4.0
    assert env.steps == 3  # `done`, `done` again (re-queued by its stop), the timeout


def test_stop_inside_callbacks_keeps_the_rest() -> None:
    """A StopSimulation raised by one callback re-queues the event with the callbacks not
    yet run, which run on the next slice (SimPy's rule)."""
    seen: list[str] = []
    for make in (simpy.Environment, CountingEnvironment):
        env = make()
        ev = env.timeout(1.0)
        stopper: Callable[[Any], None] = simpy.core.StopSimulation.callback
        ev.callbacks.extend([lambda _e: seen.append("a"), stopper, lambda _e: seen.append("b")])
        assert env.run(until=5.0) is None
        assert env.now == 1.0 and seen[-1] == "a"
        env.run(until=5.0)
        assert seen[-1] == "b" and env.now == 5.0
    assert seen == ["a", "b", "a", "b"]


def _lives(env: simpy.Environment, log: list[Any]) -> None:
    """Processes that return, raise, catch a failed event, wait on each other and on an event
    already processed: what each sees, and when."""

    def child(v: int) -> Generator[simpy.Event, Any, int]:
        yield env.timeout(1.0)
        if v < 0:
            raise KeyError(v)
        return v * 10

    def catcher() -> Generator[simpy.Event, Any, None]:
        bad = env.event()
        bad.fail(ValueError("x"))
        try:
            yield bad
        except ValueError as exc:
            log.append(
                (env.now, "caught", exc.args, exc is not bad.value, exc.__cause__ is bad.value)
            )
        done = env.timeout(0.5, value="early")
        yield env.timeout(1.0)
        log.append((env.now, "late", (yield done)))  # processed before: its value at once

    def parent() -> Generator[simpy.Event, Any, None]:
        log.append((env.now, "child", (yield env.process(child(3)))))
        try:
            yield env.process(child(-1))
        except KeyError as exc:
            log.append((env.now, "child failed", exc.args))

    env.process(catcher())
    p = env.process(parent())
    p.callbacks.append(lambda e: log.append((env.now, "parent done", e.value, e.ok)))


def test_processes_return_raise_and_catch_as_in_simpy() -> None:
    ref_env, ref_log = simpy.Environment(), []
    _lives(ref_env, ref_log)
    ref_env.run(until=10.0)
    env, log = CountingEnvironment(), []
    _lives(env, log)
    env.run(until=10.0)
    assert log == ref_log
    assert [e[1] for e in log] == ["caught", "late", "child", "child failed", "parent done"]


def test_a_process_that_raises_crashes_the_run_unless_someone_waits() -> None:
    env = CountingEnvironment()

    def bad() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(1.0)
        raise RuntimeError("bad process")

    proc = env.process(bad())
    with pytest.raises(RuntimeError, match="bad process"):
        env.run(until=5.0)
    assert not proc.ok and not proc.is_alive


def test_yielding_a_non_event_is_an_error() -> None:
    env = CountingEnvironment()

    def odd() -> Generator[Any, Any, None]:
        yield 42

    env.process(odd())
    with pytest.raises(RuntimeError, match='Invalid yield value "42"'):
        env.run(until=1.0)


def test_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="Negative delay -1"):
        CountingEnvironment().timeout(-1)


def test_a_failed_process_keeps_its_generators_frames() -> None:
    env = CountingEnvironment()

    def deep() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(1.0)
        raise KeyError("deep")

    proc = env.process(deep())
    proc.defused = True
    env.run(until=2.0)
    names = []
    tb = proc.value.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert names == ["deep"]  # the process's own frame, and no frame of the event loop


class _NeedsMore(RuntimeError):
    """An exception whose constructor takes more than its ``args`` (like KVOutOfBlocks)."""

    def __init__(self, message: str, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class _Defaulted(RuntimeError):
    """Rebuilding from ``args`` succeeds but would change the message."""

    def __init__(self, needed: int, available: int = 0) -> None:
        super().__init__(f"need {needed}, have {available}")
        self.needed = needed


def _root() -> _NeedsMore:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise _NeedsMore("out of KV blocks: need 3, have 1", 3, 1) from inner
    except _NeedsMore as exc:
        exc.add_note("while growing request 7")
        return exc


def test_a_failure_with_extra_constructor_arguments_crashes_the_run_as_itself() -> None:
    env = CountingEnvironment()
    boom = _root()
    env.event().fail(boom)
    with pytest.raises(_NeedsMore) as info:
        env.run(until=1.0)
    got = info.value
    assert got is not boom and got.__cause__ is boom
    assert got.args == boom.args and str(got) == "out of KV blocks: need 3, have 1"
    assert (got.needed, got.available) == (3, 1)
    assert got.__notes__ == ["while growing request 7"]
    assert isinstance(boom.__cause__, KeyError)  # the original's own chain is kept


@pytest.mark.parametrize("make", [_root, lambda: _Defaulted(5, 2)], ids=["extra", "default"])
def test_a_process_catches_a_copy_with_the_original_type_message_and_fields(
    make: Callable[[], RuntimeError],
) -> None:
    env = CountingEnvironment()
    boom = make()
    seen: list[Any] = []

    def waiter() -> Generator[simpy.Event, Any, None]:
        bad = env.event()
        bad.fail(boom)
        try:
            yield bad
        except RuntimeError as exc:
            seen.append((type(exc), exc.args, str(exc), exc.needed, exc.__cause__ is boom))

    env.process(waiter())
    env.run(until=1.0)
    assert seen == [(type(boom), boom.args, str(boom), boom.needed, True)]  # type: ignore[attr-defined]
