"""The cost-model check: iterations grouped by phase and shape, priced as the simulator
prices them, errors and the runs' spread computed as stated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.runtime.engine import EngineResult, IterationRecord
from hwbench.costcheck import CostRow, cost_rows, price, shape_key
from hwbench.validation_models import model_config, sim_catalogue
from hwbench.workloads import ValidationWorkload
from sim.serving.costmodel import CostModel
from sim.serving.itercost import iteration_seconds
from tests.hwbench.test_validate import engine_profile

W = ValidationWorkload("w", "tiny", requests=2, seed=3)


def rec(
    start: float, seconds: float, ptok: int = 0, batch: int = 0, wait: float = 0.0
) -> IterationRecord:
    return IterationRecord(
        start, seconds, 1 if ptok else 0, ptok, ptok * ptok, batch, 100 * batch, wait
    )


def result(log: list[IterationRecord]) -> EngineResult:
    z = np.zeros(1)
    return EngineResult(z, z, z, z, z, np.zeros((1, 11)), z, z, z, z, 0.0, 0.0, 0.0, len(log),
                        iteration_log=log)  # fmt: skip


@pytest.mark.parametrize(
    ("r", "idle", "key"),
    [
        (rec(0, 1, batch=1), False, "decode b1"),
        (rec(0, 1, batch=3), True, "decode b3-4"),  # a decode after idle is still a decode
        (rec(0, 1, ptok=100), True, "prefill after idle p<=128"),
        (rec(0, 1, ptok=300, batch=9), False, "mixed p257-512 b9-16"),
        (rec(0, 1, ptok=600, batch=17), False, "mixed p>512 b>16"),
    ],
)
def test_groups_by_phase_prompt_and_batch(r: IterationRecord, idle: bool, key: str) -> None:
    assert shape_key(r, idle) == key


def test_price_is_the_iteration_cost_plus_wake_after_idle() -> None:
    cfg = model_config(W)
    cost = CostModel(engine_profile(), sim_catalogue(cfg)[cfg.name])
    r = rec(0, 1, ptok=64, batch=2)
    base = iteration_seconds(cost.iteration, 64, 64.0 * 64, 1, 2, 200.0)
    assert price(cost, r, False) == base
    assert price(cost, r, True) == base + cost.wake_s


def test_rows_error_and_spread_by_hand() -> None:
    """Two runs of decode-b1 iterations back to back: run 1 measures 2 and 4 times the
    price P (median ratio 3), run 2 three times (3): error = median(P/m - 1) over
    {1/2, 1/4, 1/3} - 1 = -2/3, spread 0; with weights streaming a parameter wait is left
    out of the measured time; a stalled clock (0 s) is counted apart, not priced."""
    cfg = model_config(W)
    cost = CostModel(engine_profile(), sim_catalogue(cfg)[cfg.name])
    p = price(cost, rec(0, 1, batch=1), False)
    # the first iteration of a run follows idle; keep it a prefill so decode rows are plain
    lead = rec(0.0, 0.01, ptok=64)
    run1 = [lead, rec(0.0101, 2 * p, batch=1), rec(0.0102 + 2 * p, 4 * p + 0.5, batch=1, wait=0.5)]
    t = 0.0102 + 6 * p + 0.5
    run2 = [lead, rec(0.0101, 3 * p, batch=1), rec(t, 0.0, batch=1)]
    ws = ValidationWorkload("s", "tiny", requests=2, hbm_fraction=0.6, seed=3)
    rows = {r.group: r for r in cost_rows(ws, engine_profile(), [result(run1), result(run2)])}
    dec = rows["decode b1"]
    assert dec.iterations == 3 and dec.unmeasured == 1
    assert dec.error == pytest.approx(1 / 3 - 1)
    assert dec.measured_ms == pytest.approx(3 * p * 1e3)
    assert dec.run_spread == pytest.approx(0.0, abs=1e-12)
    assert dec.verdict == "few"  # 3 < MIN_ITERATIONS
    assert rows["prefill after idle p<=128"].iterations == 2
    # all weights resident: the simulator charges no weight wait, so the wait is priced too
    # (run 1's decodes measure 2P and 4P + 0.5 s: medians of two are their means)
    res_rows = {r.group: r for r in cost_rows(W, engine_profile(), [result(run1)])}
    assert res_rows["decode b1"].measured_ms == pytest.approx((3 * p + 0.25) * 1e3)
    assert res_rows["decode b1"].error == pytest.approx((-0.5 + p / (4 * p + 0.5) - 1) / 2)


def test_verdict_limits() -> None:
    def row(n: int, err: float) -> CostRow:
        return CostRow("w", "g", n, 1.0, 1.0, err, math.nan)

    assert row(5, 0.099).verdict == "ok" and row(5, -0.101).verdict == "OVER"
    assert row(4, 0.5).verdict == "few" and row(9, math.nan).verdict == "few"
