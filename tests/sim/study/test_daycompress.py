"""Quasi-static compression of a day plan's day: the factor chosen on hand-made profiles
against the catch-up share computed by hand, and the rate table it reads."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from sim.scenario import Scenario, apply_overrides, validate
from sim.serving.rateprofile import RateTable, day_table, profile_arrivals
from sim.study.daycompress import MAX_CATCH_UP, GivenDay, bound_for, choose, reaction_s
from tests.sim.control.autoscale.conftest import BASE

# interval 2 + max(cooldown 5 + provision 2 + warm-up 1, scale_in_delay 6) (conftest BASE)
R = 10.0


def _day(duration: float, **profile: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["workload"] = {
        "kind": "profile",
        "rate": 10,
        "duration": duration,
        "rate_profile": {"day": duration, "trough_ratio": 1.0, **profile},
        "input_tokens": {"dist": "fixed", "mean": 256},
        "output_tokens": {"dist": "fixed", "mean": 64},
        "classes": [{"name": "normal", "slo": "10s", "ttft_slo": "2s"}],
    }
    return data


def _sc(duration: float, *sets: str, **profile: Any) -> Scenario:
    return validate(apply_overrides(_day(duration, **profile), list(sets), "<test>"))


STEP = {"at": "6h", "hold": "6h", "multiplier": 3}  # a quarter of the day at 3x


def test_reaction_time_is_interval_plus_the_slower_of_scale_out_and_scale_in() -> None:
    sc = _sc(1000.0)
    assert reaction_s(sc, 2.0, 1.0) == R
    slow_in = _sc(1000.0, "autoscale.scale_in_delay=30")
    assert reaction_s(slow_in, 2.0, 1.0) == 2 + 30
    own = _sc(1000.0, "autoscale.cold_start.provision=20")  # the scenario's term wins
    assert reaction_s(own, 2.0, 1.0) == 2 + 5 + 20 + 1


def test_a_step_surge_compresses_by_the_hand_computed_factor() -> None:
    # flat 10 req/s for 10,000 s, 30 req/s over a quarter of it: TV = 10 (the start, from
    # nothing) + 2 x 20 req/s, Lambda = 10 x 10,000 + 20 x 2,500 = 150,000;
    # s(1) = R TV / Lambda = 500 / 150,000
    s1 = R * 50 / 150_000
    comp = choose(_sc(10_000.0, surges=[STEP]), 1.0, [1], 2.0, 1.0)
    assert comp.factor == math.floor(MAX_CATCH_UP / s1 + 1e-9) == 15
    assert comp.share == pytest.approx(15 * s1)
    assert comp.reason.startswith("day compressed 15x")


def test_the_plans_miss_allowance_tightens_the_bound() -> None:
    # the same day as above under attainment 0.99: at most 1% of the load may meet a lagging
    # cluster, so c = floor(0.01 / s(1)) = 3
    assert bound_for(0.9) == MAX_CATCH_UP and bound_for(0.99) == pytest.approx(0.01)
    s1 = R * 50 / 150_000
    comp = choose(_sc(10_000.0, surges=[STEP]), 1.0, [1], 2.0, 1.0, bound_for(0.99))
    assert comp.factor == math.floor(0.01 / s1 + 1e-9) == 3
    assert choose(_sc(10_000.0, surges=[STEP]), 1.0, [1], 2.0, 1.0, bound_for(1.0)).factor == 1


def test_a_ramp_of_the_same_height_gets_the_same_factor() -> None:
    # total variation counts how far the rate moves, not how fast: a 3 h rise and a 2 h decay
    # leave the autoscaler as far behind, in requests, as the steps
    ramp = {**STEP, "rise": "3h", "decay": "2h"}
    s1 = R * 50 / choose_lambda(ramp)
    comp = choose(_sc(10_000.0, surges=[ramp]), 1.0, [1], 2.0, 1.0)
    assert comp.factor == math.floor(MAX_CATCH_UP / s1)


def choose_lambda(surge: dict[str, Any]) -> float:
    """Expected requests of the flat 10 req/s day of 10,000 s with ``surge`` (hand: the
    ramps carry half their extra rate)."""
    scale = 10_000 / 86_400
    hours = {"rise": 3 * 3600, "decay": 2 * 3600, "hold": 6 * 3600}
    extra = 20 * scale * (hours["hold"] + (hours["rise"] + hours["decay"]) / 2)
    assert set(surge) >= {"rise", "decay"}
    return 100_000 + extra


def test_a_cosine_day_compresses_by_its_swing() -> None:
    # trough 0.5: the cosine spans 10 (1 +- 1/3) req/s, so over a whole day it rises and
    # falls by 2 x 2/3 x 10 req/s: TV = 40/3 plus the first minute's rate (the start, from
    # nothing: the cosine peaking at 14:00 taken at 00:00:30), Lambda = 10 x 20,000
    first = 10 * (1 + math.cos(2 * math.pi * (30 / 3600 - 14) / 24) / 3)
    s1 = R * (40 / 3 + first) / 200_000
    comp = choose(_sc(20_000.0, trough_ratio=0.5), 1.0, [1], 2.0, 1.0)
    assert comp.factor == math.floor(MAX_CATCH_UP / s1) == 48


def test_a_flat_day_compresses_by_its_start_and_a_short_busy_one_not_at_all() -> None:
    flat = choose(_sc(10_000.0), 1.0, [1], 2.0, 1.0)  # only the start: s(1) = 100 / 100,000
    assert flat.factor == 50 and flat.share == pytest.approx(0.05)
    busy = choose(_sc(500.0, surges=[STEP]), 1.0, [1], 2.0, 1.0)  # s(1) = 500 / 7,500
    assert busy.factor == 1 and busy.share == pytest.approx(500 / 7_500)
    assert busy.reason.startswith("warning: day not compressed, no compression is safe")
    tight = choose(_sc(1_000.0, surges=[STEP]), 1.0, [1], 2.0, 1.0)  # 0.033: safe, not 2x
    assert tight.factor == 1 and tight.reason.startswith("day not compressed: at c = 2")


def test_noise_lowers_the_factor_and_seeds_take_the_smallest() -> None:
    noisy = _sc(20_000.0, trough_ratio=0.5, noise=0.2, noise_interval="1h")
    each = [choose(noisy, 1.0, [s], 2.0, 1.0).factor for s in (1, 2, 3)]
    assert max(each) < 48  # the steps between noise factors add to the cosine's swing
    assert choose(noisy, 1.0, [1, 2, 3], 2.0, 1.0).factor == min(each)


def test_scheduled_policy_and_other_workloads_are_not_compressed() -> None:
    sched = _sc(
        10_000.0, "autoscale.policy=scheduled", 'autoscale.schedule=[{"at": 0, "replicas": 2}]'
    )
    assert choose(sched, 1.0, [1], 2.0, 1.0).factor == 1
    step = validate(copy.deepcopy(BASE))  # kind: step
    comp = choose(step, 1.0, [1], 2.0, 1.0)
    assert comp.factor == 1 and math.isnan(comp.share)


def test_a_probe_played_faster_measures_the_same_share() -> None:
    given = GivenDay.of(_day(10_000.0, surges=[STEP]))
    assert given is not None
    full = choose(_sc(10_000.0, surges=[STEP]), 1.0, [1], 2.0, 1.0)
    fast = _sc(10_000.0, *given.overrides(10), surges=[STEP])
    assert fast.workload.duration == 1_000 and fast.workload.rate_profile.day == 1_000
    probed = choose(fast, 10.0, [1], 2.0, 1.0)
    assert probed.factor == full.factor and probed.share == pytest.approx(full.share)


def test_given_day_overrides_divide_every_duration() -> None:
    data = _day(7200.0)
    data["metrics"] = {"warmup": "10min", "cooldown": 60}
    given = GivenDay.of(data)
    assert given is not None and given.overrides(1) == []
    sc = validate(apply_overrides(data, given.overrides(4), "<test>"))
    assert sc.workload.duration == 1800 and sc.workload.rate_profile.day == 1800
    assert sc.metrics.warmup == 150 and sc.metrics.cooldown == 15
    assert GivenDay.of(copy.deepcopy(BASE)) is None
    real = given.stretched(12)  # a 2 h day that stands for 24 h
    assert real.overrides(1) != [] and real.duration_s == 86_400
    sc = validate(apply_overrides(data, real.overrides(8), "<test>"))
    assert sc.workload.duration == 10_800 and sc.metrics.warmup == 900


def test_total_variation_by_hand() -> None:
    t = RateTable(np.array([0.0, 1, 2, 3, 5]), np.array([2.0, 5, 1, 1]))
    assert t.total_variation() == 3 + 4 + 0


def test_day_table_is_the_table_a_run_draws() -> None:
    sc = _sc(
        5_000.0,
        "workload.duration=12000",
        trough_ratio=0.4,
        noise=0.3,
        noise_interval="2h",
        bursts={"per_day": 3, "length": "1h"},
    )
    _, drawn = profile_arrivals(sc.workload, np.random.default_rng(7))
    seed = int(np.random.default_rng(7).integers(0, 2**63 - 1))
    table = day_table(sc.workload, seed)
    assert table.edges[-1] == 12_000
    n = len(table.rate)
    assert np.array_equal(table.edges[:n], drawn.edges[:n])
    assert np.array_equal(table.rate, drawn.rate[:n])
