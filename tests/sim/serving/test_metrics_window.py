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
