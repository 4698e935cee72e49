"""The trace-driven iteration cost: records handed out in order, a different batch stops the
replay, and a model priced by it runs one iteration per step with no memoised price."""

from __future__ import annotations

import pytest

from sim.serving.itercost import iteration_seconds
from sim.serving.iterprice import IterPricer
from sim.serving.recordedcost import RecordedCost, RecordedIteration, ReplayMismatch

RECS = [
    RecordedIteration(0.010, 100, 10000.0, 1, 0, 0.0),
    RecordedIteration(0.002, 0, 0.0, 0, 1, 101.0),
    RecordedIteration(0.003, 0, 0.0, 0, 1, 102.0),
]


def test_records_come_out_in_order_and_then_run_out() -> None:
    cost = RecordedCost(RECS)
    assert iteration_seconds(cost, 100, 10000.0, 1, 0, 0.0) == 0.010
    # the same decode shape twice in a row would be one memo entry for a price; here each
    # call is the next record
    assert iteration_seconds(cost, 0, 0.0, 0, 1, 101.0) == 0.002
    assert not cost.exhausted
    assert iteration_seconds(cost, 0, 0.0, 0, 1, 102.0) == 0.003
    assert cost.exhausted
    with pytest.raises(ReplayMismatch, match="no more iterations") as info:
        cost.work(0, 0.0, 0, 1, 103.0)
    assert info.value.step == 3


@pytest.mark.parametrize(
    "shape",
    [(0, 0.0, 0, 2, 101.0), (0, 0.0, 0, 1, 100.0), (64, 4096.0, 1, 1, 101.0)],
)
def test_another_batch_stops_the_replay_at_its_step(
    shape: tuple[int, float, int, int, float],
) -> None:
    cost = RecordedCost(RECS)
    cost.work(100, 10000.0, 1, 0, 0.0)
    with pytest.raises(ReplayMismatch) as info:
        cost.work(*shape)
    assert info.value.step == 1 and info.value.recorded == RECS[1]
    assert cost.cursor == 1  # a mismatch hands nothing out


def test_breakdown_shows_the_next_record_without_using_it() -> None:
    cost = RecordedCost(RECS[:1])
    assert cost.breakdown(100, 10000.0, 1, 0, 0.0) == [("recorded", 0.010, "recording")]
    assert cost.cursor == 0
    cost.work(100, 10000.0, 1, 0, 0.0)
    assert cost.breakdown(0, 0.0, 0, 1, 1.0) == [("recorded", 0.0, "not run")]


def test_counts_come_from_the_counting_cost() -> None:
    class Counts:
        tp, pp = 1, 1

        def work(self, *a: float) -> tuple[float, float, float, float]:
            return 99.0, 1.0, 2.0 * a[0] + 1.0, 3.0

        def breakdown(self, *a: float) -> list[tuple[str, float, str]]:
            return []

    cost = RecordedCost(RECS, counts=Counts())
    assert cost.work(100, 10000.0, 1, 0, 0.0) == (0.010, 0.0, 201.0, 3.0)


def test_pricer_without_memo_asks_the_cost_every_iteration() -> None:
    """With memo, two decode iterations in one context bucket are one memo entry (the cost is
    asked at the bucket's knots); without, each iteration is one call with its own shape."""
    recs = [RecordedIteration(0.001 * (i + 1), 0, 0.0, 0, 2, 200.0 + 2 * i) for i in range(4)]
    pricer = IterPricer(RecordedCost(recs), False, 1e-5, memo=False)
    times = [pricer.iter_cost(0, 0.0, 0, 2, 200.0 + 2 * i)[0] for i in range(4)]
    assert times == pytest.approx([0.001 + 1e-5, 0.002 + 1e-5, 0.003 + 1e-5, 0.004 + 1e-5])
    assert pricer.memo == {}
