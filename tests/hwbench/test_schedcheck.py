"""The scheduling-model check: an engine run (on a virtual clock, so every figure is
deterministic) replayed through the simulator on its own iteration times gives every request
the engine's token times, batch for batch; a recording the simulator cannot follow is a
reported mismatch; the workload's verdict takes the worst run."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import numpy as np
import pytest

from engine.runtime.clock import VirtualClock
from engine.runtime.engine import EngineResult
from hwbench.schedcheck import RunCheck, SchedCheck, check_run, replay
from hwbench.validate import engine_for, engine_parts, workload_for
from hwbench.workloads import ValidationWorkload
from tests.hwbench.test_validate import engine_profile

#: window 0: no copy thread reads the virtual clock, so its readings are deterministic
RESIDENT = ValidationWorkload("r", "tiny", requests=8, rate=30.0, window=0, seed=3)
STREAM = ValidationWorkload(
    "s", "tiny", requests=6, rate=5.0, hbm_fraction=0.6, window=0, max_batch=3, seed=5
)


def engine_run(w: ValidationWorkload, tmp: Path) -> EngineResult:
    """``w`` served on a virtual clock that advances 0.2 ms per reading (iterations take
    a few ms, deterministically) and sleeps exactly to each arrival."""
    import engine.runtime.engine as rt

    vclock = VirtualClock(2e-4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rt, "RunClock", lambda *a, **k: vclock)
        eng = engine_for(w, engine_parts(w, tmp), sleep=vclock.sleep)
        return eng.run(workload_for(w))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineResult]:
    """One engine run of each workload, shared (each test copies what it changes)."""
    return {w.name: engine_run(w, tmp_path_factory.mktemp(w.name)) for w in (RESIDENT, STREAM)}


@pytest.mark.parametrize("w", [RESIDENT, STREAM], ids=["resident", "stream"])
def test_iterations_record_when_they_were_due_and_settled(
    w: ValidationWorkload, runs: dict[str, EngineResult]
) -> None:
    """Each iteration is due when the previous one settled (back to back) or at an arrival
    the engine idled until (the first: the first arrival); it settles after it ends."""
    res = runs[w.name]
    log = res.iteration_log
    arrivals = set(res.arrival.tolist())
    assert log[0].due == res.arrival[0] == 0.0
    for prev, rec in itertools.pairwise(log):
        assert prev.settled >= prev.start + prev.seconds
        assert rec.due == prev.settled or (rec.due in arrivals and rec.due > prev.settled)
    assert any(rec.due > prev.settled for prev, rec in itertools.pairwise(log))
    assert log[-1].settled == log[-1].start + log[-1].seconds


@pytest.mark.parametrize("w", [RESIDENT, STREAM], ids=["resident", "stream"])
def test_replay_puts_each_token_where_the_engine_settled(
    w: ValidationWorkload, tmp_path: Path, runs: dict[str, EngineResult]
) -> None:
    """A request's first token and end come out in the replay when the engine's iteration
    that produced them settled (the engine's next arrival check): for every request, the
    iteration whose end is the engine's time, and the replay's time is that one's
    ``settled``. Same batches on both sides; since ``settled`` never comes before the end,
    no replayed TTFT or latency percentile is below the engine's."""
    res = runs[w.name]
    rep = replay(w, engine_profile(), res, tmp_path / "r")
    assert rep.mismatch is None and rep.frame is not None
    assert rep.batches == res.batch_log and len(rep.batches) == len(res.iteration_log)
    assert rep.param_wait_s < 1e-8  # copies are (all but) instant: time is the recording's
    ends = np.array([r.start + r.seconds for r in res.iteration_log])
    settled = np.array([r.settled for r in res.iteration_log])
    sim = rep.frame.sort_values("request_id")
    for col, eng in (("first_token", res.first), ("end", res.end)):
        idx = [int(np.argmin(np.abs(ends - t))) for t in eng]
        np.testing.assert_allclose(ends[idx], eng, rtol=0, atol=1e-12)
        np.testing.assert_allclose(sim[col].to_numpy(), settled[idx], rtol=0, atol=1e-8)
    rc = check_run(w, engine_profile(), res, tmp_path / "c")
    assert rc.mismatch is None and rc.batch_diff is None
    assert set(rc.errors) == {f"{m}_{s}" for m in ("ttft", "tpot", "e2e") for s in ("p50", "p99")}
    assert all(rc.errors[f"{m}_{s}"] >= 0 for m in ("ttft", "e2e") for s in ("p50", "p99"))


def test_a_recording_the_simulator_cannot_follow_is_a_reported_mismatch(
    tmp_path: Path, runs: dict[str, EngineResult]
) -> None:
    """One recorded decode batch one larger than the engine ran: the replay stops at that
    step, and the check reports it instead of latencies."""
    res = copy.copy(runs[RESIDENT.name])
    res.iteration_log = list(res.iteration_log)
    k = next(i for i, r in enumerate(res.iteration_log) if r.decode_batch and i > 2)
    rec = res.iteration_log[k]
    res.iteration_log[k] = rec._replace(decode_batch=rec.decode_batch + 1)
    rc = check_run(RESIDENT, engine_profile(), res, tmp_path / "c")
    assert rc.errors == {} and rc.mismatch is not None
    assert f"replay step {k}:" in rc.mismatch
    check = SchedCheck("r", [rc])
    assert check.failures() == [f"r run 1: {rc.mismatch}"]


def test_workload_verdict_takes_each_figures_worst_run() -> None:
    """Run errors +1% and -3% at P50 (limit 2%): the worst is -3%, over; P99 +4% and -1%
    (limit 5%): +4%, within."""
    runs = [
        RunCheck({"e2e_p50": 0.01, "e2e_p99": -0.01}, {}, None, None, 10),
        RunCheck({"e2e_p50": -0.03, "e2e_p99": 0.04}, {}, None, None, 10),
    ]
    check = SchedCheck("w", runs)
    assert check.worst() == {"e2e_p50": -0.03, "e2e_p99": 0.04}
    assert check.failures() == ["w: scheduling e2e_p50 -3.00% OVER 2%"]
    runs.append(RunCheck({}, {}, "batch 4: engine (4,), simulator (5,)", None, 10))
    assert check.failures()[-1] == "w run 3: batches differ: batch 4: engine (4,), simulator (5,)"
