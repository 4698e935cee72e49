"""The steady window of :func:`sim.serving.metrics.summarize` at its edges, by hand: a request
arriving exactly at either end of the window counts in it (arrival times on a grid, as a
trace replay or a fixed-rate workload gives them), and achieved throughput counts the
window's completions shifted by the median time in the system, so a long but steady time in
the system is not lost throughput. Mutation harness: these kill ``serving:window-open-end``
and ``serving:achieved-no-lag`` (tests/mutation/serving_mutants.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.serving.metrics import Metrics, summarize

CLASSES = {"normal": {"e2e": None, "ttft": None, "tpot": None}}


def _frame(arrival: np.ndarray, in_system: float) -> pd.DataFrame:
    n = len(arrival)
    return pd.DataFrame(
        {
            "model": pd.Categorical(["m"] * n),
            "cls": pd.Categorical(["normal"] * n),
            "arrival": arrival,
            "first_token": arrival + in_system / 2,
            "end": arrival + in_system,
            "input_tokens": np.full(n, 10, dtype=np.int32),
            "output_tokens": np.full(n, 3, dtype=np.int32),
            "status": pd.Categorical(["done"] * n, categories=["pending", "done"]),
        }
    )


def test_arrivals_on_both_edges_of_the_window_count() -> None:
    df = _frame(np.arange(0.0, 11.0), 0.5)  # one arrival each second, 0..10 s
    s = summarize(df, Metrics(len(df)), 11.0, CLASSES, {}, (2.0, 8.0))
    assert s["requests"]["in_window"] == 7  # 2, 3, ..., 8
    assert s["throughput"]["offered_rps"] == pytest.approx(7 / 6, rel=1e-8)  # 9 digits


def test_achieved_throughput_is_shifted_by_the_time_in_the_system() -> None:
    df = _frame(np.arange(0.0, 10.0, 0.5), 5.0)  # 2 req/s, each 5 s in the system
    s = summarize(df, Metrics(len(df)), 15.0, CLASSES, {}, (0.0, 9.5))
    # every request of the window finishes in the window shifted by 5 s: achieved = offered
    tp = s["throughput"]
    assert tp["offered_rps"] == tp["achieved_rps"] == pytest.approx(20 / 9.5, rel=1e-8)
    assert s["overloaded"] is False


def _with(df: pd.DataFrame, **cols: object) -> pd.DataFrame:
    out = df.copy()
    for k, v in cols.items():
        out[k] = v
    return out


def test_achieved_throughput_shifts_by_the_median_not_the_mean() -> None:
    """One straggler (50 s in the system) among 1 s requests moves the mean lag to 5.9 s but
    not the median (1 s): the shifted window [1, 10] holds the 9 other completions."""
    arr = np.arange(0.0, 10.0)  # 0, 1, ..., 9
    df = _frame(arr, 1.0)
    df = _with(df, end=np.where(arr == 0.0, 50.0, arr + 1.0))
    s = summarize(df, Metrics(len(df)), 60.0, CLASSES, {}, (0.0, 9.0))
    assert s["throughput"]["achieved_rps"] == pytest.approx(9 / 9, rel=1e-8)


def test_slo_attainment_divides_by_the_windows_arrivals() -> None:
    """4 arrivals in the window, 2 done within the SLO, 2 never finished: 50 %."""
    df = _frame(np.arange(0.0, 4.0), 1.0)
    df = _with(df, status=pd.Categorical(["done", "pending", "done", "pending"],
                                         categories=["pending", "done"]))  # fmt: skip
    classes = {"normal": {"e2e": 2.0, "ttft": None, "tpot": None}}
    s = summarize(df, Metrics(len(df)), 10.0, classes, {}, (0.0, 3.0))
    assert s["requests"]["in_window"] == 4
    assert s["slo_attainment"] == 0.5 and s["goodput_rps"] == pytest.approx(2 / 3, rel=1e-8)


def test_the_tpot_objective_is_the_gap_between_tokens_after_the_first() -> None:
    """3 output tokens, first at 1 s, end at 3 s: two gaps of 1 s, TPOT 1 s. An objective of
    0.9 s fails it, 1 s meets it (a TPOT over all 3 tokens, 0.67 s, would meet both)."""
    df = _frame(np.array([0.0]), 3.0)
    df = _with(df, first_token=np.array([1.0]))
    for limit, good in ((0.9, 0), (1.0, 1)):
        classes = {"normal": {"e2e": None, "ttft": None, "tpot": limit}}
        s = summarize(df, Metrics(1), 5.0, classes, {}, (0.0, 1.0))
        assert s["slo_attainment"] == good
    assert s["latency"]["tpot"]["p50"] == 1.0


def test_tpot_percentiles_leave_out_one_token_requests() -> None:
    df = _frame(np.array([0.0, 1.0, 2.0]), 2.0)  # first token 1 s after arrival, end 2 s
    df = _with(df, output_tokens=np.array([1, 3, 5], dtype=np.int32))
    s = summarize(df, Metrics(3), 5.0, CLASSES, {}, (0.0, 2.0))
    tpot = s["latency"]["tpot"]
    # 3 tokens: 1 s / 2 gaps; 5 tokens: 1 s / 4 gaps; the 1-token request has no gap
    assert tpot["mean"] == pytest.approx((0.5 + 0.25) / 2, rel=1e-8)
    assert tpot["p50"] == pytest.approx(0.375, rel=1e-8)


def test_overloaded_only_below_95_percent_of_the_offered_load() -> None:
    """25 arrivals, one never finishes: achieved is 96 % of offered, not overloaded; two
    unfinished (92 %): overloaded."""
    arr = np.arange(0.0, 25.0)
    for pending, over in ((1, False), (2, True)):
        st = ["pending"] * pending + ["done"] * (25 - pending)
        df = _with(_frame(arr, 0.5), status=pd.Categorical(st, categories=["pending", "done"]))
        s = summarize(df, Metrics(25), 30.0, CLASSES, {}, (0.0, 24.0))
        tp = s["throughput"]
        assert tp["achieved_rps"] == pytest.approx((25 - pending) / 24, rel=1e-8)
        assert s["overloaded"] is over
