"""Claims over seeds: verdicts against a reference, effects, README markers, fair baselines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from sim.runner import evaluate_claims, run_scenario
from sim.scenario import load_scenario, variant
from sim.study.claim_capacity import class_slo, climb, rung_passes, rung_points
from sim.study.claims import (
    README_BEGIN,
    README_END,
    ClaimOutcome,
    claim_points,
    claim_scenarios,
    effect,
    fmt_measured,
    markdown_table,
    replace_between_markers,
    verdict,
)

ROOT = Path(__file__).resolve().parents[3]


def _reference_verdict(kind: str, expected: float, lo: float, hi: float) -> str:
    """The issue's definitions, written out case by case on the interval and the figure."""
    null = 1.0 if kind == "ratio" else 0.0
    if lo <= null <= hi:
        return "no effect"
    if expected > null:
        if hi < null:
            return "opposite"
        return "reproduced" if hi >= expected else "same direction, smaller"
    if lo > null:
        return "opposite"
    return "reproduced" if lo <= expected else "same direction, smaller"


@settings(max_examples=200)
@given(
    kind=st.sampled_from(["relative", "ratio"]),
    expected=st.floats(-90, 900, allow_nan=False),
    a=st.floats(-100, 1000, allow_nan=False),
    width=st.floats(0, 500, allow_nan=False),
)
def test_verdict_matches_the_definitions(
    kind: str, expected: float, a: float, width: float
) -> None:
    if kind == "ratio":
        expected, a, width = abs(expected) / 10 + 0.01, abs(a) / 100, width / 100
    null = 1.0 if kind == "ratio" else 0.0
    if expected == null:
        return
    assert verdict(kind, expected, a, a + width) == _reference_verdict(kind, expected, a, a + width)


def test_verdict_examples() -> None:
    assert verdict("relative", 23, 25, 40) == "reproduced"  # beyond the figure
    assert verdict("relative", 23, 10, 30) == "reproduced"  # covers it
    assert verdict("relative", 23, 5, 12) == "same direction, smaller"
    assert verdict("relative", 23, -3, 12) == "no effect"
    assert verdict("relative", 23, -12, -5) == "opposite"
    assert verdict("relative", -63, -70, -50) == "reproduced"
    assert verdict("relative", -63, -40, -20) == "same direction, smaller"
    assert verdict("ratio", 1.8, 0.8, 0.9) == "opposite"
    assert verdict("ratio", 1.8, 1.1, 1.3) == "same direction, smaller"
    assert verdict("value", 3.0, 1, 2) is None and verdict("ratio", None, 1.1, 1.3) is None


def test_effect_relative_and_ratio_of_means() -> None:
    a = np.array([10.0, 20.0, 30.0, 40.0])
    b = a * 1.5
    rel = effect("relative", a, b, np.random.default_rng(0), 500)
    assert rel is not None and rel == pytest.approx((50.0, 50.0, 50.0))
    ratio = effect("ratio", a, b, np.random.default_rng(0), 500)
    assert ratio is not None and ratio == pytest.approx((1.5, 1.5, 1.5))
    assert effect("ratio", np.zeros(4), b, np.random.default_rng(0)) is None
    assert effect("ratio", a[:1], b[:1], np.random.default_rng(0)) is None


@settings(max_examples=50)
@given(st.lists(st.tuples(st.floats(1, 100), st.floats(1, 100)), min_size=2, max_size=20))
def test_effect_interval_contains_estimate_and_lies_within_the_pairs(
    pairs: list[tuple[float, float]],
) -> None:
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    est = effect("ratio", a, b, np.random.default_rng(1), 300)
    assert est is not None
    m, lo, hi = est
    assert lo <= m <= hi
    assert m == pytest.approx(b.mean() / a.mean())
    # a ratio of means of resampled pairs lies within the range of the per-pair ratios
    r = b / a
    assert r.min() - 1e-9 <= lo and hi <= r.max() + 1e-9


def test_table_and_readme_markers() -> None:
    o = ClaimOutcome("R3", "+23% hit rate", "hit_rate.hbm", "relative", "lru-k", "lru", 23.0,
                     4.2, 1.5, 7.25, 10, "same direction, smaller", "lruk-vs-lru")  # fmt: skip
    assert fmt_measured(o) == "+4.2% [+1.5%, +7.2%]"
    table = markdown_table([o])
    assert "| R3 |" in table and "same direction, smaller" in table and "| 10 |" in table
    text = f"intro\n{README_BEGIN}\nold table\n{README_END}\nrest\n"
    new = replace_between_markers(text, table)
    assert "old table" not in new and table in new
    assert new.startswith("intro\n") and new.endswith(f"{README_END}\nrest\n")
    assert replace_between_markers(new, table) == new  # idempotent
    with pytest.raises(InputError, match="markers"):
        replace_between_markers("no markers here", table)


def test_claim_points_need_two_seeds_and_claims() -> None:
    with pytest.raises(InputError, match="2 paired seeds"):
        claim_points(ROOT / "scenarios" / "lruk-vs-lru.yaml", [0])
    with pytest.raises(InputError, match="claims"):
        claim_points(ROOT / "scenarios" / "quickstart.yaml", [0, 1])


def test_readme_table_is_between_markers_and_names_every_claim() -> None:
    text = (ROOT / "README.md").read_text()
    i, j = text.index(README_BEGIN), text.index(README_END)
    block = text[i:j]
    ids = {c.id for p in claim_scenarios() for c in load_scenario(p).claims}
    assert ids == {"R3", "R11", "R12", "R13", "R19", "R20", "R21", "R22"}
    for cid in ids:
        assert f"| {cid} |" in block


#: per claim scenario, overrides that shrink it for the default test tier (default 8 s of
#: arrivals); the achieved-rate estimate needs ~20 requests in the window to be meaningful
REDUCED = {
    "burst-traffic": ["workload.duration=3s"],
    "lruk-vs-lru": ["workload.duration=12s"],
    "pd-vs-coupled": ["workload.duration=15s"],
    "elastic-scaling": ["workload.duration=16s"],  # before the burst (at 20 s): 2 req/s
}


@pytest.mark.parametrize("name", [p.stem for p in claim_scenarios()])
def test_claim_baseline_is_not_overloaded_at_reduced_size(name: str) -> None:
    """Each claim's baseline variant (side A) keeps up with its offered load: the claim then
    compares the mechanism, not backlog drain. One seed, a shorter duration: deterministic."""
    path = ROOT / "scenarios" / f"{name}.yaml"
    sc = load_scenario(path, overrides=REDUCED.get(name, ["workload.duration=8s"]))
    baselines = {c.baseline or sc.variants[0].name for c in sc.claims}
    for v in sc.variants:
        if v.name not in baselines:
            continue
        s = run_scenario(variant(sc, v), seed=0).summary
        t = s["throughput"]
        assert s["requests"]["unfinished"] == 0, (name, v.name)
        assert not s["overloaded"], (name, v.name, t)
        assert t["achieved_rps"] >= 0.95 * t["offered_rps"] > 0, (name, v.name, t)


# -- capacity claims (R21) --------------------------------------------------------------------


@settings(max_examples=100)
@given(
    table=st.dictionaries(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3)),
        st.lists(st.booleans(), min_size=5, max_size=5),
        min_size=8,
        max_size=8,
    )
)
def test_climb_is_the_highest_load_below_the_first_failure(
    table: dict[tuple[str, int], list[bool]],
) -> None:
    loads = [0.5, 1.0, 2.0, 4.0, 8.0]
    calls: list[tuple[tuple[str, int], float]] = []

    def passes(pairs: list[tuple[str, int]], load: float) -> dict[tuple[str, int], bool]:
        calls.extend((p, load) for p in pairs)
        return {p: table[p][loads.index(load)] for p in pairs}

    cap = climb(["a", "b"], [0, 1, 2, 3], loads, passes)
    for pair, row in table.items():
        k = row.index(False) if False in row else len(row)  # rungs passed before the first miss
        assert cap[pair] == (loads[k - 1] if k else 0.0)
        # a pair runs each rung up to and including its first miss, never beyond
        assert [ld for p, ld in calls if p == pair] == loads[: min(k + 1, len(loads))]


def test_capacity_loads_must_increase() -> None:
    path = ROOT / "scenarios" / "pd-vs-coupled.yaml"
    with pytest.raises(InputError, match="strictly increasing"):
        load_scenario(path, overrides=["claims.2.capacity.loads=[1.0, 1.0]"])
    with pytest.raises(InputError, match=r"no\.such"):
        bad = load_scenario(path, overrides=["claims.2.capacity.key=no.such"])
        assert bad.claims[2].capacity is not None
        claim_points_for(path, bad.claims[2].capacity.key)


def claim_points_for(path: Path, key: str) -> None:
    """Build the first rung of the R21 ladder with ``key`` as the load knob."""
    sc = load_scenario(path)
    cap = sc.claims[2].capacity
    assert cap is not None
    rung_points(path, cap.model_copy(update={"key": key}), "pd", [0], cap.loads[0])


def test_a_rung_fails_on_its_tail_or_a_lost_request_not_on_the_overload_flag() -> None:
    sc = load_scenario(ROOT / "scenarios" / "pd-vs-coupled.yaml")
    slo = class_slo(sc)  # one class, "normal", 10 s
    m = {"per_class.normal.latency.e2e.p99": 9.5, "per_class.normal.n": 30, "overloaded": True}
    assert rung_passes(m, slo) == (True, [])
    assert not rung_passes({**m, "per_class.normal.latency.e2e.p99": 10.5}, slo)[0]
    assert not rung_passes({**m, "requests.unfinished": 1}, slo)[0]
    assert not rung_passes({**m, "requests.rejected": 2}, slo)[0]
    assert rung_passes(None, slo) == (False, ["run failed"])


def test_capacity_claim_is_not_measured_by_one_run() -> None:
    sc = load_scenario(ROOT / "scenarios" / "pd-vs-coupled.yaml")
    caps = [c for c in sc.claims if c.capacity is not None]
    assert [c.id for c in caps] == ["R21"] and caps[0].kind == "ratio"
    summaries = {"coupled": {"goodput_rps": 1.0}, "pd": {"goodput_rps": 1.0}}
    (r21,) = [c for c in evaluate_claims(sc, summaries) if c["id"] == "R21"]
    assert r21["measured"] is None and r21["seeds"] == 1


@pytest.mark.parametrize("name", [p.stem for p in claim_scenarios()])
def test_capacity_ladders_start_where_both_variants_pass(name: str) -> None:
    """The lowest rung of every capacity ladder is one both variants sustain at the SLO (seed
    0, the scenario's duration), so each variant's capacity is measured, not zero."""
    path = ROOT / "scenarios" / f"{name}.yaml"
    sc = load_scenario(path)
    for c in sc.claims:
        if c.capacity is None:
            continue
        slo = class_slo(sc)
        for v in (c.baseline, c.variant):
            (pt,) = rung_points(path, c.capacity, v or "", [0], c.capacity.loads[0])
            s = run_scenario(pt.scenario, seed=0).summary
            flat = pd.json_normalize(s, sep=".").iloc[0].to_dict()
            ok, why = rung_passes(flat, slo)
            assert ok, (name, v, why)
