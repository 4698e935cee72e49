"""The ``profile`` workload: its tabulated rate against hand integrals, its arrivals against
the rate (a statistical test with a fixed seed), determinism and validation.

Arrival counts: in a Poisson process the counts N_h of disjoint hours are independent Poisson
variables of mean Lambda_h (the rate's integral over the hour). With Lambda_h >= 10,000 the
normal approximation is close, so z_h = (N_h - Lambda_h) / sqrt(Lambda_h) are about N(0, 1):
each |z_h| < 4.5 (a correct generator breaks it with probability 24 x 6.8e-6 = 1.6e-4 over a
day) and sum z_h^2 < 51.18, the 99.9% point of chi-square with 24 degrees of freedom. A
generator whose hourly counts were off by 1% would add about (0.01 x sqrt(Lambda_h))^2 >= 1
per hour to the sum, 24 or more in all, and the hour-by-hour shape errors it is meant to catch
(a phase shift of the day, a wrong mean) far more. The seed is fixed, so the test is
deterministic; the bounds say how unlikely a failure of a correct generator would have been.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from engine.errors import InputError
from sim.daysections import DAY
from sim.scenario import WorkloadCfg
from sim.serving.rateprofile import profile_arrivals, shape, surge_factor
from sim.serving.workload import make_workload

CHI2_24_999 = 51.18


def _hourly_z(arrival: np.ndarray, expected: list[float], hour: float) -> np.ndarray:
    counts = np.histogram(arrival, bins=24, range=(0.0, 24 * hour))[0]
    lam = np.asarray(expected)
    return np.asarray((counts - lam) / np.sqrt(lam))


def _cosine_hour(rate: float, trough: float, peak: float, h: int, hour: float) -> float:
    """Hand integral of rate x (1 + A cos(2 pi (x - peak) / 24)) over hour h (x in hours)."""
    amp = (1 - trough) / (1 + trough)
    k = 2 * math.pi / 24
    mean_shape = 1 + amp / k * (math.sin(k * (h + 1 - peak)) - math.sin(k * (h - peak)))
    return rate * hour * mean_shape


@pytest.mark.parametrize(("day", "rate"), [(DAY, 20.0), (600.0, 2000.0)])
def test_hourly_arrival_counts_match_the_integral_of_the_cosine_rate(
    day: float, rate: float
) -> None:
    cfg = WorkloadCfg(
        kind="profile",
        rate=rate,
        duration=day,
        rate_profile={"day": day, "peak_hour": 15.5, "trough_ratio": 0.25},
    )
    arrival, table = profile_arrivals(cfg, np.random.default_rng(7))
    hour = day / 24
    hand = [_cosine_hour(rate, 0.25, 15.5, h, hour) for h in range(24)]
    tab = [table.expected(h * hour, (h + 1) * hour) for h in range(24)]
    assert np.allclose(tab, hand, rtol=1e-5)  # 1-minute pieces, midpoint rule
    assert min(hand) > 10_000
    z = _hourly_z(arrival, hand, hour)
    assert np.max(np.abs(z)) < 4.5 and float(np.sum(z**2)) < CHI2_24_999, z
    assert int(np.argmax(np.histogram(arrival, bins=24, range=(0, day))[0])) in (14, 15, 16)


def test_hourly_counts_follow_the_drawn_noise_bursts_and_surges() -> None:
    cfg = WorkloadCfg(
        kind="profile",
        rate=15.0,
        duration=DAY,
        rate_profile={
            "noise": 0.3,
            "noise_interval": "20min",
            "bursts": {"per_day": 6, "multiplier": 2.5, "length": "25min"},
            "surges": [
                {"at": "19h", "multiplier": 4, "rise": "5min", "hold": "10min", "decay": "1h"}
            ],
        },
    )
    arrival, table = profile_arrivals(cfg, np.random.default_rng(11))
    lam = [table.expected(h * 3600.0, (h + 1) * 3600.0) for h in range(24)]
    z = _hourly_z(arrival, lam, 3600.0)
    assert np.max(np.abs(z)) < 4.5 and float(np.sum(z**2)) < CHI2_24_999, z
    flat = WorkloadCfg(kind="profile", rate=15.0, duration=DAY)
    assert (
        table.cumulative()[-1]
        != profile_arrivals(flat, np.random.default_rng(11))[1].cumulative()[-1]
    )


def test_a_step_burst_and_a_flash_crowd_add_their_hand_computed_requests() -> None:
    base = {"trough_ratio": 1.0}  # a flat day: the rate is `rate` outside the surges
    step = {"at": "10h", "multiplier": 4, "hold": "1h"}
    crowd = {"at": "20h", "multiplier": 3, "rise": "30min", "hold": "10min", "decay": "1h"}
    cfg = WorkloadCfg(
        kind="profile", rate=5.0, duration=DAY, rate_profile={**base, "surges": [step, crowd]}
    )
    _, table = profile_arrivals(cfg, np.random.default_rng(0))
    mid = (table.edges[:-1] + table.edges[1:]) / 2
    in_step = (mid >= 36_000) & (mid < 39_600)
    assert np.all(table.rate[in_step] == 20.0)
    assert np.all(table.rate[(mid < 36_000) | ((mid >= 39_600) & (mid < 72_000))] == 5.0)
    # step: 3 x 5/s x 3600 s; crowd: 2 x 5/s x (1800/2 + 600 + 3600/2) s (linear ramps)
    extra = 3 * 5 * 3600 + 2 * 5 * (900 + 600 + 1800)
    assert table.cumulative()[-1] == pytest.approx(5 * DAY + extra, rel=1e-12)
    clock = np.asarray([72_000.0, 72_900.0, 73_800.0, 74_400.0, 76_200.0, 78_000.0])
    # the rise starts at 20:00, tops at 20:30, holds to 20:40, falls to 1 at 21:40
    assert surge_factor(cfg.rate_profile.surges, clock).tolist() == [1.0, 2.0, 3.0, 3.0, 2.0, 1.0]


def test_hourly_values_shape_the_day_with_mean_one() -> None:
    hourly = [1.0] * 6 + [2.0] * 6 + [4.0] * 6 + [3.0] * 6  # mean 2.5
    cfg = WorkloadCfg(kind="profile", rate=2.0, duration=DAY, rate_profile={"hourly": hourly})
    mids = (np.arange(24) + 0.5) * 3600
    assert np.allclose(shape(cfg.rate_profile, mids), np.asarray(hourly) / 2.5, rtol=1e-12)
    assert shape(cfg.rate_profile, np.asarray([0.0]))[0] == pytest.approx((3.0 + 1.0) / 2 / 2.5)
    _, table = profile_arrivals(cfg, np.random.default_rng(0))
    assert table.cumulative()[-1] == pytest.approx(2.0 * DAY, rel=1e-12)  # linear pieces


def test_the_same_seed_gives_the_same_arrivals_and_a_day_does_not_depend_on_the_horizon() -> None:
    prof = {"noise": 0.2, "bursts": {"per_day": 4}, "day": "1h"}
    one = WorkloadCfg(kind="profile", rate=3.0, duration=3600, rate_profile=prof)
    two = one.model_copy(update={"duration": 7200.0})
    a1, t1 = profile_arrivals(one, np.random.default_rng(5))
    b1, _ = profile_arrivals(one, np.random.default_rng(5))
    c1, _ = profile_arrivals(one, np.random.default_rng(6))
    assert np.array_equal(a1, b1) and not np.array_equal(a1[:50], c1[:50])
    _, t2 = profile_arrivals(two, np.random.default_rng(5))
    k = len(t1.rate)
    assert np.array_equal(t2.edges[: k + 1], t1.edges) and np.array_equal(t2.rate[:k], t1.rate)
    assert not np.array_equal(t2.rate[k : 2 * k], t1.rate)  # day 2 draws its own noise
    w1 = make_workload(one, [1.0], np.random.default_rng(5))
    w2 = make_workload(one, [1.0], np.random.default_rng(5))
    assert np.array_equal(w1.arrival, w2.arrival) and np.array_equal(w1.inp, w2.inp)


def test_a_request_bound_tabulates_as_many_days_as_it_needs() -> None:
    cfg = WorkloadCfg(kind="profile", rate=2.0, requests=5000, rate_profile={"day": "10min"})
    arrival, table = profile_arrivals(cfg, np.random.default_rng(3))
    assert arrival.size == 5000 and bool(np.all(np.diff(arrival) >= 0))
    assert table.edges[-1] >= arrival[-1] and table.edges[-1] % 600 == 0
    assert table.edges[-1] - 600 < arrival[-1]  # no day more than needed


@pytest.mark.parametrize(
    ("profile", "extra", "what"),
    [
        ({"hourly": [1.0] * 23}, {}, "hourly has 23 values"),
        ({"hourly": [1.0] * 23 + [0.0]}, {}, "hourly"),
        ({"surges": [{"at": 0, "multiplier": 1}]}, {}, "multiplier"),
        ({"resolution": 0.5}, {}, "resolution"),
        ({"trough_ratio": 0}, {}, "trough_ratio"),
        ({"peak_hour": 24}, {}, "peak_hour"),
        ({"resolution": 1, "noise_interval": 1}, {"duration": 86400 * 100}, "rate pieces"),
        ({}, {"rate": 1e4, "duration": 86400 * 10}, "rate x duration"),
    ],
)
def test_bad_profiles_are_refused(profile: dict, extra: dict, what: str) -> None:
    with pytest.raises(ValidationError, match=what):
        WorkloadCfg(kind="profile", **{"duration": 60.0, **extra, "rate_profile": profile})


def test_a_profile_expecting_too_many_requests_is_refused_before_drawing() -> None:
    surge = {"at": 0, "multiplier": 1e4, "hold": "23h"}
    cfg = WorkloadCfg(kind="profile", rate=1.0, duration=DAY, rate_profile={"surges": [surge]})
    with pytest.raises(InputError, match=r"workload\.rate_profile: the rate profile expects"):
        profile_arrivals(cfg, np.random.default_rng(0))


def test_a_burst_runs_on_past_midnight() -> None:
    # 50 bursts a day of 6 h each: 00:00-00:01 of day 2 is inside one of day 1's with
    # probability 1 - exp(-50 x 6 / 24) (all but 4e-6); day 1 starts with none carried in
    prof = {"trough_ratio": 1.0, "bursts": {"per_day": 50, "multiplier": 1.1, "length": "6h"}}
    cfg = WorkloadCfg(kind="profile", rate=0.01, duration=2 * DAY, rate_profile=prof)
    _, table = profile_arrivals(cfg, np.random.default_rng(4))
    first = np.searchsorted(table.edges, [0.0, DAY], side="right") - 1
    assert table.rate[first[1]] >= 0.011 and table.rate[first[0]] < table.rate[first[1]]


def test_a_request_bound_too_sparse_for_the_table_is_refused() -> None:
    cfg = WorkloadCfg(kind="profile", rate=1e-5, requests=1000, rate_profile={"day": "1s"})
    with pytest.raises(InputError, match=r"days of the rate profile tabulate more than"):
        profile_arrivals(cfg, np.random.default_rng(0))
