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

from sim.cli import app
from sim.plan import PlanFile, Planner, Probe, SloCfg, run_passes, utilisation

SCEN = Path(__file__).resolve().parents[2] / "scenarios"


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
        "requests": 100, "rejected": 0, "unfinished": 1, "shed": 4, "latency.p99": 0.9,
        "per_class.high.latency.p99": 0.4, "per_class.high.n": 50,
        "per_class.low.latency.p99": None, "per_class.low.n": 50,
    }  # fmt: skip
    assert run_passes(m, SloCfg(p99={"high": 0.5, "all": 1.0})) == (True, [])
    ok, why = run_passes(m, SloCfg(p99={"high": 0.3}))
    assert not ok and "high p99" in why[0]
    assert run_passes(m, SloCfg(p99={"low": 9.0}))[1] == ["low: no request finished"]
    assert run_passes(m, SloCfg(availability=0.99))[0]  # 99/100 answered
    assert not run_passes(m, SloCfg(availability=0.995))[0]
    assert run_passes(m, SloCfg(degraded_rate=0.04))[0]
    assert not run_passes(m, SloCfg(degraded_rate=0.03))[0]
    assert run_passes(None, SloCfg(p99={"all": 1.0})) == (False, ["run failed"])


def test_utilisation_prefers_the_dedicated_fields() -> None:
    m = {
        "compute_utilisation": 0.5, "peak_hbm_bytes_per_node": 30.0, "hbm_bytes_per_node": 60.0,
        "pcie_utilisation": 0.1, "node_nic_utilisation": 0.2, "max_nic_utilisation": 0.9,
        "ps_utilisation": 0.9, "param_wait_share": 0.05,
    }  # fmt: skip
    u = utilisation(m, 80.0)
    assert u == {
        "compute": 0.5, "hbm": 0.5, "pcie": 0.1, "network": 0.2, "parameter_servers": 0.9,
    }  # fmt: skip
    assert max(u, key=u.__getitem__) == "parameter_servers"


def test_utilisation_reads_the_summary() -> None:
    u = utilisation(
        {"compute_utilisation": 0.9, "peak_hbm_bytes_per_node": 40.0, "pcie_utilisation": 0.1,
         "max_nic_utilisation": 0.3, "param_wait_share": 0.2},
        80.0,
    )  # fmt: skip
    assert u == {
        "compute": 0.9, "hbm": 0.5, "pcie": 0.1, "network": 0.3, "parameter_servers": 0.2,
    }  # fmt: skip


def _plan_cli(out: Path, plan: Path) -> Any:
    return CliRunner().invoke(
        app,
        ["plan", str(plan), "--out", str(out), "--quiet", "--seeds", "2", "--qps", "1200",
         "--p99", "high=3.5s", "--set", "workload.requests=500"],
    )  # fmt: skip


def test_burst_traffic_nodes_for_1200_qps_is_reproducible(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"scenario: {SCEN / 'burst-traffic.yaml'}\nslo: {{p99: {{high: 2s}}}}\n"
        "size_range: [1, 16]\nqps_key: workload.steps.0.rate\nqps: [600]\n"
        "costs: {cluster.nodes: 2.5}\n"
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
    assert row["question"] == "min-size" and row["qps"] == 1200 and 1 < n <= 16
    assert row["cost"] == 2.5 * n and row["cheapest"]
    assert row["saturates_first"] in {"compute", "hbm", "pcie", "network", "parameter_servers"}
    assert f"1200 QPS: smallest cluster.nodes = {n}" in r1.output
    # the answer is a true boundary: n passes on both seeds, n - 1 fails on some seed
    assert row["boundary_size"] == n - 1 and not row["boundary_passed"]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "p1" / "runs").glob("*.json")]
    p99 = {}
    for rec in runs:
        nodes = rec["params"]["cluster.nodes"]
        p99.setdefault(nodes, []).append(rec["metrics"]["per_class.high.latency.p99"])
    assert len(p99[n]) == 2 and max(p99[n]) <= 3.5
    assert max(p99[n - 1]) > 3.5
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
