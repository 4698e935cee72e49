"""What the plots show (issue 20, items 15-16), read off the matplotlib figures before saving."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim.study.plots as plots
from sim.study.ab import MetricDiff


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Figures the plot functions would save, kept open for inspection."""
    kept: list[Any] = []

    def keep(fig: Any, path: Path) -> Path:
        kept.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    yield kept
    plt.close("all")


def _result(bytes_remote: float, classes: list[dict[str, Any]]) -> Any:
    n = 50
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 10, n))
    req = pd.DataFrame(
        {
            "variant": [""] * n, "model": ["m"] * n, "cls": ["high"] * n,
            "arrival": arrival, "end": arrival + rng.uniform(0.01, 3.0, n),
            "status": ["done"] * n, "bytes_host": 0.0, "bytes_nvme": 0.0,
            "bytes_remote": bytes_remote / n, "bytes_object": 0.0,
        }
    )  # fmt: skip
    t = np.linspace(0, 13, 27)
    ts = pd.DataFrame(
        {
            "variant": "",
            "t": t,
            "qps": 5.0,
            "queued": 0,
            "running": 2,
            "hbm_hit_rate": 1.0,
            "token_budget": 0.25,
        }
    )
    cfg = {"scenario": {"name": "demo", "workload": {"classes": classes},
                        "cluster": {"servers": 2, "replica": {"max_num_seqs": 4}}}}  # fmt: skip
    return SimpleNamespace(requests=req, timeseries=ts, summary={"scenario": "demo"}, config=cfg)


def test_latency_cdf_has_slo_lines_p99_dots_scenario_title_no_lone_legend(
    figures: list[Any], tmp_path: Path
) -> None:
    res = _result(1.0, [{"name": "high", "slo": 2.0}, {"name": "low", "slo": 8.0}])
    plots._latency_cdf(tmp_path, res)
    (ax,) = figures[0].axes
    assert "demo" in ax.get_title()
    vlines = [ln.get_xdata()[0] for ln in ax.lines if ln.get_linestyle() == "--"]
    assert sorted(vlines) == [2.0, 8.0]
    lat = (res.requests["end"] - res.requests["arrival"]).to_numpy()
    dots = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert len(dots) == 1 and dots[0].get_xdata()[0] == pytest.approx(np.quantile(lat, 0.99))
    assert ax.get_legend() is None  # one curve: nothing to tell apart
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all("^" not in x and "times" not in x for x in labels)


def test_bytes_chart_says_so_when_nothing_moved(figures: list[Any], tmp_path: Path) -> None:
    plots._bytes(tmp_path, _result(0.0, []))
    (ax,) = figures[0].axes
    assert not ax.patches and "No parameter bytes" in " ".join(t.get_text() for t in ax.texts)
    plots._bytes(tmp_path, _result(3 * 2**30, []))
    heights = [p.get_height() for p in figures[1].axes[0].patches]
    assert heights == pytest.approx([0.0, 0.0, 3.0, 0.0])


def test_timeseries_has_completions_latency_and_slot_use(
    figures: list[Any], tmp_path: Path
) -> None:
    plots._timeseries(tmp_path, _result(1.0, []))
    labels = {ln.get_label() for ax in figures[0].axes for ln in ax.lines}
    assert {"arrivals", "completions", "P50", "P99", "token budget in use"} <= labels
    slots = next(
        ln for ax in figures[0].axes for ln in ax.lines if ln.get_label() == "token budget in use"
    )
    assert np.allclose(slots.get_ydata(), 0.25 * 100)
    counts = figures[0].axes[1]  # queued / running requests: 0 and 2 here
    counts.figure.canvas.draw()
    ticks = [t for t in counts.get_yticks() if counts.get_ylim()[0] <= t <= counts.get_ylim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


@given(
    ends=st.lists(st.floats(0.0, 9.99), min_size=1, max_size=40),
    lat=st.floats(0.01, 5.0),
)
def test_per_bin_counts_and_percentiles_match_a_reference(ends: list[float], lat: float) -> None:
    edges = np.arange(0.0, 11.0, 1.0)
    done = pd.DataFrame({"end": ends, "arrival": [e - lat for e in ends]})
    rate, p50, p99 = plots._per_bin(done, edges)
    for b in range(10):
        inside = [e for e in ends if edges[b] <= e < edges[b + 1]]
        assert rate[b] == len(inside)  # 1 s bins: count per second
        assert (np.isnan(p50[b]) and not inside) or p50[b] == pytest.approx(lat)
        assert (np.isnan(p99[b]) and not inside) or p99[b] == pytest.approx(lat)


def test_frontier_sizes_get_whole_ticks_and_top_of_range_is_hollow(
    figures: list[Any], tmp_path: Path
) -> None:
    df = pd.DataFrame(
        [{"question": "min-size", "qps": 30.0, "size": 2},
         {"question": "max-qps", "qps": 200.0, "size": 4}]
    )  # fmt: skip
    plots.frontier_plot(df, "cluster.servers", [], 200.0, tmp_path / "f.png")
    size_ax, cap_ax = figures[0].axes
    assert all(float(t).is_integer() for t in size_ax.get_yticks())
    assert all(float(t).is_integer() for t in cap_ax.get_xticks())
    hollow = [ln for ln in cap_ax.lines if ln.get_marker() == "o" and ln.get_mfc() == "none"]
    assert len(hollow) == 1 and list(hollow[0].get_ydata()) == [200.0]
    assert any(">= 200" in t.get_text() for t in cap_ax.texts)


def test_ab_and_sweep_plots(figures: list[Any], tmp_path: Path) -> None:
    d = MetricDiff("latency.p99", 4, 2.0, 1.5, -0.5, -0.6, -0.4, "B better")
    assert plots.ab_plot([d], tmp_path / "a.png", "t") is not None
    (line,) = [ln for ln in figures[0].axes[0].lines if ln.get_marker() == "o"]
    assert line.get_xdata()[0] == pytest.approx(-25.0)  # % of A's mean
    assert plots.ab_plot([], tmp_path / "a.png", "t") is None
    df = pd.DataFrame({"status": "ok", "cluster.servers": [1, 1, 2, 2], "seed": [0, 1, 0, 1],
                       "throughput.achieved_rps": [1.0, 3.0, 4.0, 6.0],
                       "latency.e2e.p99": 1.0})  # fmt: skip
    assert plots.sweep_plot(df, ["cluster.servers"], tmp_path / "s.png", "t") is not None
    tp = figures[1].axes[0].lines[0]
    assert list(tp.get_ydata()) == [2.0, 5.0]  # mean over seeds
    assert plots.sweep_plot(df, [], tmp_path / "s.png", "t") is None


def test_one_load_over_alternatives_is_a_bar_per_alternative(
    figures: list[Any], tmp_path: Path
) -> None:
    nan = float("nan")
    df = pd.DataFrame(
        [{"question": "min-size", "cluster.tp": tp, "qps": 1200.0, "size": size, "reason": why}
         for tp, size, why in [(1, nan, "infeasible: weights do not fit"),
                               (2, nan, "latency floor: ..."), (8, 62.0, None)]]
    )  # fmt: skip
    plots.frontier_plot(df, "cluster.servers", ["cluster.tp"], 5000.0, tmp_path / "f.png")
    (ax,) = figures[0].axes
    assert [p.get_height() for p in ax.patches] == [62.0]  # one bar: the answered tp
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["cluster.tp=1", "cluster.tp=2", "cluster.tp=8"]
    texts = [t.get_text() for t in ax.texts]
    assert "none:\ninfeasible" in texts and "none:\nlatency floor" in texts and "62" in texts
