"""engine.units: sizes, rates and durations parse to finite numbers within documented limits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.units import (
    MAX_DURATION,
    MAX_RATE,
    MAX_SIZE,
    parse_duration,
    parse_rate,
    parse_size,
)

PARSERS = [parse_size, parse_rate, parse_duration]
HOSTILE = [
    float("inf"),
    float("-inf"),
    float("nan"),
    "1e999",
    "inf",
    ".inf",
    "nan",
    10**400,
    "9" * 400,
    "9" * 400 + "GiB",
    True,
    False,
]


@pytest.mark.parametrize("parse", PARSERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:20])
def test_hostile_values_are_value_errors_with_a_short_message(parse, value) -> None:
    with pytest.raises(ValueError) as err:
        parse(value)
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 160


@pytest.mark.parametrize(
    ("parse", "limit", "unit"),
    [
        (parse_size, MAX_SIZE, "B"),
        (parse_rate, MAX_RATE, "B/s"),
        (parse_duration, MAX_DURATION, "s"),
    ],
)
def test_the_limit_is_accepted_and_just_above_it_is_not(parse, limit, unit) -> None:
    assert parse(limit) == limit
    with pytest.raises(ValueError, match="too large"):
        parse(limit * 2)
    with pytest.raises(ValueError, match="too large"):
        parse(f"{limit * 2:.0f}{unit if unit != 'B/s' else 'B/s'}")


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_whole_byte_counts_round_trip(n: int) -> None:
    assert parse_size(n) == n
    assert parse_size(str(n)) == n
    assert parse_size(f"{n} B") == n


@given(st.floats(min_value=0, max_value=MAX_DURATION, allow_nan=False))
def test_finite_durations_in_range_parse_to_themselves(x: float) -> None:
    assert parse_duration(x) == x
    assert parse_duration(f"{x!r}s") == float(repr(x))


def test_units_still_scale() -> None:
    assert parse_size("4MiB") == 4 * 1024**2
    assert parse_rate("100Gbit/s") == 100e9 / 8
    assert parse_duration("20ms") == pytest.approx(0.02)
