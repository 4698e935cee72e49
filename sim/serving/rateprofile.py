"""The rate of a ``profile`` workload over its days, and its non-homogeneous Poisson arrivals.

The rate (see :class:`sim.daysections.RateProfileCfg`) is tabulated as a piecewise-constant function
of simulated time, a :class:`RateTable`: pieces of ``resolution`` on the day clock, split at
every noise, burst and surge edge, each at the rate of its midpoint (so a piece inside a
linear surge ramp carries the ramp's exact mean). Its cumulative intensity
``Lambda(t) = integral_0^t rate`` is then piecewise linear, and arrivals invert it: with
``E_1, E_2, ...`` unit exponentials, ``t_i = Lambda^-1(E_1 + ... + E_i)`` (time rescaling),
which is exactly a Poisson process of that rate. :func:`invert_cumulative` is the one
inversion; the ``step`` and ``diurnal`` kinds use it too.

Randomness: one integer drawn from the run's ``workload`` generator seeds the profile's own
generator, which draws day 0's noise factors and bursts, then day 1's, ...; the unit
exponentials come from the ``workload`` generator. A day's draws do not depend on how many
days are tabulated, and the same seed gives the same table and the same arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.errors import InputError
from engine.limits import MAX_REQUESTS
from sim.daysections import DAY, MAX_PROFILE_PIECES, RateProfileCfg, SurgeCfg
from sim.sections import WorkloadCfg

F64 = npt.NDArray[np.float64]

__all__ = [
    "RateTable",
    "day_table",
    "invert_cumulative",
    "profile_arrivals",
    "shape",
    "surge_factor",
]


def invert_cumulative(breaks_t: F64, breaks_cum: F64, last_rate: float, targets: F64) -> F64:
    """The times where a piecewise-linear cumulative intensity (``breaks_cum`` at
    ``breaks_t``, both increasing) reaches ``targets``; beyond the last break it grows at
    ``last_rate``."""
    out = np.interp(targets, breaks_cum, breaks_t)
    beyond = targets > breaks_cum[-1]
    out[beyond] = breaks_t[-1] + (targets[beyond] - breaks_cum[-1]) / last_rate
    return out


@dataclass(frozen=True)
class RateTable:
    """A piecewise-constant rate: ``rate[k]`` requests/s on ``[edges[k], edges[k + 1])``
    (simulated seconds, ``edges[0] = 0``, increasing). Invariant: ``len(edges) ==
    len(rate) + 1`` and every rate > 0."""

    edges: F64
    rate: F64

    def cumulative(self) -> F64:
        """Lambda at each edge: expected arrivals in ``[0, edges[k])``."""
        return np.concatenate([[0.0], np.cumsum(self.rate * np.diff(self.edges))])

    def expected(self, t0: float, t1: float) -> float:
        """Expected arrivals in ``[t0, t1)``, both within the table."""
        cum = self.cumulative()
        return float(np.interp(t1, self.edges, cum) - np.interp(t0, self.edges, cum))

    def total_variation(self) -> float:
        """Sum of the rate's absolute changes from piece to piece (requests/s): every step
        (noise, burst and surge edges) and the tabulated slopes of the shape."""
        return float(np.sum(np.abs(np.diff(self.rate))))


def shape(cfg: RateProfileCfg, clock: F64) -> F64:
    """The daily shape at day-clock seconds ``clock`` (periodic in :data:`DAY`, mean 1 over a
    day): the cosine peaking at ``peak_hour``, or ``hourly`` interpolated linearly between
    the hours' midpoints (cyclically) and scaled to mean 1."""
    hour = np.mod(clock, DAY) / 3600.0
    if cfg.hourly:
        vals = np.asarray(cfg.hourly, dtype=np.float64)
        xs = np.arange(-0.5, 25.0, 1.0)  # midpoints of hours -1..24 (cyclic neighbours)
        ys = np.concatenate([[vals[-1]], vals, [vals[0]]])
        out: F64 = np.interp(hour, xs, ys) / float(vals.mean())
        return out
    amp = (1 - cfg.trough_ratio) / (1 + cfg.trough_ratio)
    cosine: F64 = 1 + amp * np.cos(2 * np.pi * (hour - cfg.peak_hour) / 24.0)
    return cosine


def surge_factor(surges: list[SurgeCfg], clock: F64) -> F64:
    """The product of the surges' multipliers at day-clock seconds ``clock``: each ramps
    linearly from 1 to its ``multiplier`` over ``rise``, holds for ``hold``, falls back over
    ``decay``."""
    out = np.ones_like(clock)
    for s in surges:
        up = s.at + s.rise
        down = up + s.hold
        end = down + s.decay
        frac = np.zeros_like(clock)
        if s.rise > 0:
            ramp = (clock >= s.at) & (clock < up)
            frac[ramp] = (clock[ramp] - s.at) / s.rise
        frac[(clock >= up) & (clock < down)] = 1.0
        if s.decay > 0:
            ramp = (clock >= down) & (clock < end)
            frac[ramp] = 1.0 - (clock[ramp] - down) / s.decay
        out *= 1.0 + (s.multiplier - 1.0) * frac
    return out


class _Days:
    """Tabulates a profile day by day (draws in day order from its own generator)."""

    def __init__(self, cfg: WorkloadCfg, seed: int) -> None:
        self.cfg = cfg
        self.p = cfg.rate_profile
        self.gen = np.random.default_rng(seed)
        self.bursts: list[tuple[float, float]] = []  # (start, end) on the day clock
        self.days = 0
        self.pieces = 0
        self.total = 0.0  # expected arrivals of the days tabulated (Lambda at their end)
        self.edges: list[F64] = []
        self.rates: list[F64] = []

    def add_day(self) -> None:
        """Draw the next day's noise and bursts and tabulate it."""
        p, d = self.p, self.days
        lo, hi = d * DAY, (d + 1) * DAY
        n_noise = math.ceil(DAY / p.noise_interval)
        noise = self.gen.lognormal(-(p.noise**2) / 2, p.noise, size=n_noise)
        k = int(self.gen.poisson(p.bursts.per_day))
        starts = np.sort(self.gen.uniform(lo, hi, size=k))
        # bursts that ended before this day cannot touch it (nor any later one)
        self.bursts = [b for b in self.bursts if b[1] > lo]
        self.bursts += [(float(s), float(s) + p.bursts.length) for s in starts]
        cuts = [
            np.arange(lo, hi, p.resolution),
            lo + np.arange(n_noise) * p.noise_interval,
            np.asarray([x for b in self.bursts for x in b], dtype=np.float64),
            np.asarray([x for s in p.surges for x in _surge_edges(s)], dtype=np.float64),
            np.asarray([hi]),
        ]
        edges = np.unique(np.concatenate(cuts))
        edges = edges[(edges >= lo) & (edges <= hi)]
        mid = (edges[:-1] + edges[1:]) / 2
        value = shape(p, mid) * noise[((mid - lo) // p.noise_interval).astype(np.int64)]
        for b0, b1 in self.bursts:
            value[(mid >= b0) & (mid < b1)] *= p.bursts.multiplier
        value *= surge_factor([s for s in p.surges if _overlaps(s, lo, hi)], mid)
        self.pieces += len(mid)
        if self.pieces > MAX_PROFILE_PIECES:
            raise InputError(
                f"{self.days + 1} days of the rate profile tabulate more than "
                f"{MAX_PROFILE_PIECES:.0e} pieces; allowed: fewer (a coarser resolution or "
                "noise_interval, or fewer requests)",
                where="workload.rate_profile",
            )
        rate = self.cfg.rate * value
        self.total += float(np.sum(rate * np.diff(edges))) * (p.day / DAY)
        self.edges.append(edges if d == 0 else edges[1:])
        self.rates.append(rate)
        self.days += 1

    def table(self) -> RateTable:
        """The days tabulated so far, in simulated seconds."""
        scale = self.p.day / DAY
        return RateTable(np.concatenate(self.edges) * scale, np.concatenate(self.rates))


def _surge_edges(s: SurgeCfg) -> tuple[float, float, float, float]:
    up = s.at + s.rise
    return (s.at, up, up + s.hold, up + s.hold + s.decay)


def _overlaps(s: SurgeCfg, lo: float, hi: float) -> bool:
    """Whether surge ``s`` raises the rate anywhere in ``[lo, hi)`` (day clock)."""
    return s.at < hi and _surge_edges(s)[3] > lo


def day_table(cfg: WorkloadCfg, seed: int) -> RateTable:
    """The rate table of a ``profile`` workload over ``[0, duration)`` (``duration`` > 0),
    its days drawn from a generator seeded with ``seed``: the table a run draws, without the
    arrivals."""
    days = _Days(cfg, seed)
    for _ in range(max(1, math.ceil(cfg.duration / cfg.rate_profile.day))):
        days.add_day()
    table = days.table()
    keep = int(np.searchsorted(table.edges, cfg.duration, side="left"))
    edges = np.concatenate([table.edges[:keep], [cfg.duration]])
    return RateTable(edges, table.rate[: len(edges) - 1])


def profile_arrivals(cfg: WorkloadCfg, rng: np.random.Generator) -> tuple[F64, RateTable]:
    """A ``profile`` workload's arrivals (every one in ``[0, duration)``, or the first
    ``requests``) and the rate table they follow; deterministic in ``rng`` (see the module
    docstring)."""
    days = _Days(cfg, int(rng.integers(0, 2**63 - 1)))
    if cfg.duration > 0:
        for _ in range(max(1, math.ceil(cfg.duration / cfg.rate_profile.day))):
            days.add_day()
        table = days.table()
        cum = table.cumulative()
        total = float(np.interp(cfg.duration, table.edges, cum))
        if total > MAX_REQUESTS:
            raise InputError(
                f"the rate profile expects {total:.3g} requests in {cfg.duration:g} s; allowed: "
                f"at most {MAX_REQUESTS:.0e} (a lower rate or a shorter duration)",
                where="workload.rate_profile",
            )
        block = int(total * 1.1) + 64
        n = block
        while True:
            targets = np.cumsum(rng.exponential(1.0, size=n))
            if targets[-1] >= total:
                targets = targets[targets < total]
                break
            n += block
    else:
        targets = np.cumsum(rng.exponential(1.0, size=cfg.requests))
        days.add_day()
        while days.total < targets[-1]:
            days.add_day()
        table = days.table()
        cum = table.cumulative()
    arrival = invert_cumulative(table.edges, cum, float(table.rate[-1]), targets)
    return arrival, table
