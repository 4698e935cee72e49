"""The sections of a ``profile`` workload's day (``workload.rate_profile``): its shape, noise,
random bursts and planned surges. One strict pydantic model each, every field documented
(:mod:`sim.docgen`); :class:`sim.sections.WorkloadCfg` holds a :class:`RateProfileCfg`, and
:mod:`sim.serving.rateprofile` turns it into a rate table and arrivals.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from engine.config import Duration, StrictModel
from engine.limits import MAX_REQUEST_RATE

__all__ = [
    "DAY",
    "MAX_MULTIPLIER",
    "MAX_PROFILE_PIECES",
    "RandomBurstsCfg",
    "RateProfileCfg",
    "SurgeCfg",
]


class _M(StrictModel, BaseModel):  # BaseModel named too, so linters see a pydantic model
    """Every section's base (see :class:`engine.config.StrictModel`)."""


#: seconds of one uncompressed day: the clock of a `profile` workload's shape, noise and surges
DAY = 86_400.0
#: most piecewise-constant pieces of a `profile` workload's tabulated rate (all its days)
MAX_PROFILE_PIECES = 5_000_000
#: largest rate multiplier of a surge or a random burst
MAX_MULTIPLIER = 1e4


class SurgeCfg(_M):
    """A planned surge of a ``profile`` workload's rate: the rate is multiplied by a factor
    that ramps linearly from 1 to `multiplier` over `rise`, stays there for `hold`, and falls
    linearly back to 1 over `decay`. A step burst has `rise` and `decay` 0; a flash crowd a
    short `rise` and a longer `decay`. Times are on the profile's day clock (see
    `workload.rate_profile.day`)."""

    at: Duration
    """When the rise starts, on the day clock (e.g. `13h`; later days continue the clock:
    `30h` is 06:00 of the second day), seconds or a duration."""
    multiplier: float = Field(gt=1, le=MAX_MULTIPLIER)
    """Rate multiplier at the top of the surge, in (1, 1e4]."""
    rise: Duration = 0.0
    """Linear ramp from 1 to `multiplier`, day clock; 0: a step up."""
    hold: Duration = Field(default=600.0, gt=0)
    """Time at `multiplier`, day clock (> 0)."""
    decay: Duration = 0.0
    """Linear ramp back to 1, day clock; 0: a step down."""


class RandomBurstsCfg(_M):
    """Random step bursts of a ``profile`` workload: per day a Poisson number of bursts (mean
    `per_day`), each starting at a uniformly drawn time of the day and multiplying the rate by
    `multiplier` for `length` (day clock); drawn from the run's `workload` random stream."""

    per_day: float = Field(default=0.0, ge=0, le=1000)
    """Mean number of bursts a day, 0..1000; 0: none."""
    multiplier: float = Field(default=2.0, gt=1, le=MAX_MULTIPLIER)
    """Rate multiplier during a burst, in (1, 1e4]."""
    length: Duration = Field(default=600.0, gt=0)
    """Length of each burst on the day clock (> 0), seconds or a duration."""


class RateProfileCfg(_M):
    """The rate over a day of a ``profile`` workload (non-homogeneous Poisson arrivals).

    rate(t) = `workload.rate` x shape(c) x noise(c) x bursts(c) x surges(c), with c the day clock
    ``t x 86400 / day``. The shape has mean 1 over a day: a cosine with its maximum at
    `peak_hour` and min / max = `trough_ratio`, or the 24 `hourly` values (linear between the
    hours' midpoints, scaled to mean 1). The noise is lognormal with mean 1, one factor per
    `noise_interval`; bursts and surges multiply on top. The rate is tabulated as a
    piecewise-constant function: pieces of `resolution`, split at every noise, burst and surge
    edge, each at the rate of its midpoint; arrivals invert its cumulative (time rescaling of a
    unit-rate Poisson process), so the same seed gives the same arrivals."""

    day: Duration = Field(default=DAY, gt=0)
    """Simulated seconds one day of the profile lasts: 24h plays it in real time, 10min
    compresses a day into ten minutes (rates stay requests per simulated second)."""
    peak_hour: float = Field(default=14.0, ge=0, lt=24)
    """Hour of the day (0..24) where the cosine shape peaks; its trough is 12 hours away."""
    trough_ratio: float = Field(default=0.3, gt=0, le=1)
    """Lowest / highest rate of the cosine shape, in (0, 1]; 1: flat."""
    hourly: list[Annotated[float, Field(gt=0, le=MAX_REQUEST_RATE)]] = []
    """24 relative rates for hours 0..23 (> 0) replacing the cosine shape; empty: the cosine."""
    noise: float = Field(default=0.0, ge=0, le=3)
    """Sigma of the lognormal multiplicative noise (mean 1), 0..3; 0: none."""
    noise_interval: Duration = Field(default=900.0, ge=1)
    """Each noise factor holds this long on the day clock (>= 1 s)."""
    resolution: Duration = Field(default=60.0, ge=1)
    """Piece length of the tabulated rate on the day clock (>= 1 s)."""
    bursts: RandomBurstsCfg = RandomBurstsCfg()
    """Random step bursts (none by default)."""
    surges: list[SurgeCfg] = Field(default=[], max_length=1000)
    """Planned surges: step bursts and flash crowds (at most 1,000)."""

    @model_validator(mode="after")
    def _hourly_has_24_hours(self) -> RateProfileCfg:
        if self.hourly and len(self.hourly) != 24:
            raise ValueError(
                f"hourly has {len(self.hourly)} values; allowed: 24 (hours 0..23) or none"
            )
        return self

    def pieces_per_day(self) -> float:
        """About how many pieces one day of the tabulated rate has: one per `resolution`, one
        per `noise_interval`, two per expected burst (surges aside: a few in all)."""
        return DAY / self.resolution + DAY / self.noise_interval + 2 * self.bursts.per_day

    def peak_shape(self) -> float:
        """Largest value of the shape (its mean is 1)."""
        if self.hourly:
            return max(self.hourly) * 24 / sum(self.hourly)
        amp = (1 - self.trough_ratio) / (1 + self.trough_ratio)
        return 1 + amp
