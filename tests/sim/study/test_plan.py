"""Capacity planning: the bisection against a linear-scan reference, the SLO rule, and
``pdsim plan`` on the burst-traffic scenario at reduced size (same seeds -> same answer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pdsim.cli import app
from sim.study.plan import Planner
from sim.study.planspec import RESOURCES, PlanFile, Probe, SloCfg, run_passes, utilisation

SCEN = Path(__file__).resolve().parents[3] / "scenarios"


class _Oracle(Planner):
    """A planner whose probes pass by a monotone threshold instead of running anything."""

    def __init__(self, spec: PlanFile, min_ok: int, max_q: float) -> None:
        super().__init__(spec, Path("-"), None, None, [0])  # type: ignore[arg-type]
        self.min_ok, self.max_q, self.calls = min_ok, max_q, 0

    def probe(self, alt: dict[str, Any], size: int, qps: float) -> Probe:
        self.calls += 1
        ok = size >= self.min_ok and qps <= self.max_q
        return Probe(alt, size, qps, ok, float(ok), dict.fromkeys(("compute",), 0.0))


@settings(max_examples=80)
@given(lo=st.integers(1, 20), width=st.integers(0, 40), t=st.integers(0, 70))
def test_min_size_bisection_matches_linear_scan(lo: int, width: int, t: int) -> None:
    hi = lo + width
    spec = PlanFile(scenario="-", slo=SloCfg(p99={"all": 1.0}), size_range=(lo, hi), qps=[1])
    pl = _Oracle(spec, t, 1e9)
    size, boundary = pl.min_size({}, 1.0)
    expected = next((s for s in range(lo, hi + 1) if s >= t), None)
    assert size == expected
    if size is not None and size > lo:
        assert boundary.size == size - 1 and not boundary.passed  # the probe to blame
    assert pl.calls <= 3 + width.bit_length()


class _PerAlt(Planner):
    """A planner whose probes pass from a per-alternative size threshold (``alt["t"]``)."""

    def __init__(self, spec: PlanFile) -> None:
        super().__init__(spec, Path("-"), None, None, [0])  # type: ignore[arg-type]
        self.probed: list[tuple[int, int]] = []

    def prefetch(self, wanted: list[tuple[dict[str, Any], int, float]]) -> None:
        pass  # nothing to batch: probes are computed, not run

    def probe(self, alt: dict[str, Any], size: int, qps: float) -> Probe:
        self.probed.append((alt["i"], size))
        ok = size >= alt["t"]
        return Probe(alt, size, qps, ok, float(ok), dict.fromkeys(("compute",), 0.0))


@settings(max_examples=60)
@given(
    lo=st.integers(1, 10),
    width=st.integers(0, 30),
    ts=st.lists(st.integers(0, 50), min_size=1, max_size=5),
)
def test_lockstep_min_sizes_match_one_search_after_another(
    lo: int, width: int, ts: list[int]
) -> None:
    spec = PlanFile(
        scenario="-", slo=SloCfg(p99={"all": 1.0}), size_range=(lo, lo + width), qps=[1]
    )
    alts = [{"t": t, "i": i} for i, t in enumerate(ts)]
    together = _PerAlt(spec)
    got = together.min_sizes(alts, 1.0)
    for alt, (size, boundary) in zip(alts, got, strict=True):
        alone = _PerAlt(spec)
        size1, boundary1 = alone.min_size(alt, 1.0)
        expected = next((s for s in range(lo, lo + width + 1) if s >= alt["t"]), None)
        assert size == size1 == expected
        assert (boundary.size, boundary.passed) == (boundary1.size, boundary1.passed)
        # the same probes, in the same order, for this alternative
        mine = [sz for i, sz in together.probed if i == alt["i"]]
        assert mine == [sz for _, sz in alone.probed]


@settings(max_examples=80)
@given(q=st.floats(0.5, 3000, allow_nan=False), tol=st.sampled_from([0.01, 0.05, 0.2]))
def test_max_qps_bisection_brackets_the_threshold(q: float, tol: float) -> None:
    spec = PlanFile(
        scenario="-", slo=SloCfg(p99={"all": 1.0}), sizes=[1], qps_range=(1.0, 2000.0),
        qps_tolerance=tol,
    )  # fmt: skip
    qmax, boundary = _Oracle(spec, 0, q).max_qps({}, 1)
    if q < 1.0:
        assert qmax is None
    elif q >= 2000.0:
        assert qmax == 2000.0
    else:
        assert qmax is not None and qmax <= q < boundary.qps
        assert boundary.qps - qmax <= tol * boundary.qps * 1.01 + 1e-3


def test_run_passes_rules() -> None:
    m = {
        "requests.total": 100, "requests.rejected": 0, "requests.unfinished": 1,
        "requests.shed": 4, "requests.in_window": 90, "latency.e2e.p99": 0.9,
        "latency.ttft.p90": 0.2, "latency.tpot.p50": 0.03,
        "per_class.high.latency.e2e.p99": 0.4, "per_class.high.n": 50,
        "per_class.low.latency.e2e.p99": None, "per_class.low.n": 50,
        "overloaded": False,
    }  # fmt: skip
    lax = {"sustain": False}
    assert run_passes(m, SloCfg(p99={"high": 0.5, "all": 1.0}, **lax)) == (True, [])
    ok, why = run_passes(m, SloCfg(p99={"high": 0.3}, **lax))
    assert not ok and "high e2e p99" in why[0]
    assert run_passes(m, SloCfg(p99={"low": 9.0}, **lax))[1] == ["low: no request finished"]
    assert run_passes(m, SloCfg(ttft={"p90": {"all": 0.25}}, **lax))[0]
    assert not run_passes(m, SloCfg(ttft={"p90": {"all": 0.15}}, **lax))[0]
    assert not run_passes(m, SloCfg(tpot={"p50": {"all": 0.02}}, **lax))[0]
    assert run_passes(m, SloCfg(availability=0.99, **lax))[0]  # 99/100 answered
    assert not run_passes(m, SloCfg(availability=0.995, **lax))[0]
    assert run_passes(m, SloCfg(degraded_rate=0.04, **lax))[0]
    assert not run_passes(m, SloCfg(degraded_rate=0.03, **lax))[0]
    assert run_passes(None, SloCfg(p99={"all": 1.0})) == (False, ["run failed"])
    # sustaining the load is part of the SLO by default: an unfinished request fails it
    assert run_passes(m, SloCfg(p99={"all": 1.0}))[1] == ["1 requests unfinished"]
    over = {**m, "requests.unfinished": 0, "overloaded": True}
    assert "overloaded" in run_passes(over, SloCfg(p99={"all": 1.0}))[1][0]


def test_utilisation_reads_the_summary() -> None:
    m = {"utilisation.mfu": 0.6, "utilisation.kv": 0.2, "utilisation.nic": 0.9}
    u = utilisation(m)
    assert set(u) == set(RESOURCES)
    assert u["mfu"] == 0.6 and u["kv"] == 0.2 and u["pcie"] == 0.0
    assert max(u, key=u.__getitem__) == "nic"


def _plan_cli(out: Path, plan: Path) -> Any:
    return CliRunner().invoke(
        app,
        ["plan", str(plan), "--out", str(out), "--quiet", "--seeds", "2", "--qps", "40",
         "--p99", "all=5s", "--set", "workload.duration=30s"],
    )  # fmt: skip


def test_quickstart_servers_for_40_qps_is_reproducible(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"scenario: {SCEN / 'quickstart.yaml'}\nslo: {{p99: {{all: 2s}}}}\n"
        "size_range: [1, 8]\nqps: [10]\ncosts: {cluster.servers: 2.5}\n"
    )
    r1 = _plan_cli(tmp_path / "p1", plan)
    assert r1.exit_code == 0, r1.output
    r2 = _plan_cli(tmp_path / "p2", plan)  # fresh folder: nothing cached, same seeds
    assert r2.exit_code == 0, r2.output
    f1 = pd.read_parquet(tmp_path / "p1" / "frontier.parquet")
    f2 = pd.read_parquet(tmp_path / "p2" / "frontier.parquet")
    pd.testing.assert_frame_equal(f1, f2)
    (row,) = f1.to_dict("records")
    n = row["size"]
    assert row["question"] == "min-size" and row["qps"] == 40 and 1 < n <= 8
    assert row["cost"] == 2.5 * n and row["cheapest"]
    assert row["saturates_first"] in RESOURCES
    assert f"40 QPS: smallest cluster.servers = {n}" in r1.output
    # the answer is a true boundary: n passes on both seeds, n - 1 fails on some seed
    assert row["boundary_size"] == n - 1 and not row["boundary_passed"]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "p1" / "runs").glob("*.json")]
    p99 = {}
    for rec in runs:
        nodes = rec["params"]["cluster.servers"]
        p99.setdefault(nodes, []).append(rec["metrics"]["latency.e2e.p99"])
    runs_n = [r for r in runs if r["params"]["cluster.servers"] == n]
    assert row["gpus"] == n and row["tp"] == 1
    assert len(p99[n]) == 2 and max(p99[n]) <= 5.0
    assert all(not r["metrics"]["overloaded"] for r in runs_n)
    assert max(p99[n - 1]) > 5.0 or any(
        r["metrics"]["overloaded"] for r in runs if r["params"]["cluster.servers"] == n - 1
    )
    assert (tmp_path / "p1" / "frontier.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("slo: {p99: {high: 1s}}\nqps: [10]\nsize_rnge: [1, 2]\n", "size_rnge"),
        ("slo: {p99: {vip: 1s}}\nqps: [10]\n", "unknown class 'vip'"),
        ("slo: {p99: {high: 1s}}\n", "give qps"),
        ("slo: {}\nqps: [10]\n", "at least one of"),
        ("slo: {p99: {high: 1s}}\nqps: [10]\nsize_key: cluster.nodez\n", "cluster.nodez"),
        ("slo: {p99: {high: soon}}\nqps: [10]\n", "slo.p99.high"),
    ],
)
def test_bad_plan_files_exit_2_and_write_nothing(tmp_path: Path, text: str, match: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"scenario: {SCEN / 'burst-traffic.yaml'}\n" + text)
    r = CliRunner().invoke(app, ["plan", str(plan), "--out", str(tmp_path / "o"), "--quiet"])
    assert r.exit_code == 2, r.output
    assert match in r.output
    assert not (tmp_path / "o").exists()
