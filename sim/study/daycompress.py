"""Quasi-static compression of a day plan's day: the largest factor ``c`` the day can be
played faster by while the autoscaler still follows its rate as it does in real time.

Compressing by ``c`` divides ``workload.rate_profile.day``, ``workload.duration`` and a
non-zero ``metrics.warmup`` and ``metrics.cooldown`` by ``c`` and keeps every rate: the
load, the batches and the queues of each moment are those of the real day, only the day is
shorter, so attainment carries over and GPU-hours scale back by ``c``. What changes is the
autoscaler's lag measured on the day clock: it reacts in ``R`` simulated seconds, which
cover ``c R`` seconds of the day.

**Reaction time** ``R = interval + max(cooldown + start, scale_in_delay)``: a decision
waits for the next tick, a scale-out for the cooldown and the new replica's start
(``provision + warmup``, the cold start's own terms; a coupled checkpoint load is not in
the estimate, and the plan checks the measured decision-to-serving times afterwards), a
scale-in for the stabilisation window.

**Catch-up share** ``s(c) = c R TV / Lambda``: ``TV`` is the total variation of the day's
rate table (requests/s summed over every step and tabulated slope: noise edges, bursts,
surges, the diurnal shape) plus its first rate (the day starts from a cluster at
``min_replicas``, a step from nothing) and ``Lambda`` its expected requests. After a rate
change of ``d`` the autoscaler is wrong by about ``d`` for ``c R`` seconds, so ``s`` bounds
the share of the day's load that meets a cluster still catching up: GPU-hours held by a lagging
scale-in (an overestimate) and requests arriving before a scale-out serves (an attainment
risk). Real time has ``s(1)``; compression adds ``(c - 1) R TV / Lambda``.

**Validity condition**: ``s(c) <= min(MAX_CATCH_UP, 1 - attainment)`` (5%, or the plan's
miss allowance when smaller: the requests arriving while a scale-out lags are the ones at
risk of missing; on a 100 req/s day every miss was the day's start, a fixed number of
requests in simulated time, so their share grew with ``c``). ``c`` is the largest whole
number that keeps it (capped at :data:`MAX_FACTOR`), computed for every seed's rate table (drawn
from the seed's own generator: the same distribution as the run's draws, not the same
realisation), the smallest over seeds. A day too large to validate as given (a day at 100
req/s is over the request limit) is measured on a probe compressed to an hour: ``TV`` is
the same at every factor and ``Lambda`` divides by it, so ``s(1) = s_probe(1) / c_probe``.
``c = 1`` (the day as given) when no compression is safe, the workload is not a
``profile`` with a ``duration``, or the policy is ``scheduled`` (its steps are on the
simulated clock).

What compression does not keep is an overload (the rate above the capacity of a static
count or of an autoscaler at its ``max_replicas``): it lasts ``c`` times less and queues
``c`` times less deep, so a count the peak overloads briefly can pass compressed
(:data:`sim.study.dayplan.OVERLOAD_NOTE`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.units import parse_duration
from sim.daysections import DAY
from sim.serving.rateprofile import day_table
from sim.study.sweep.spec import override_text

#: the largest catch-up share a compressed day may have (see the module docstring)
MAX_CATCH_UP = 0.05
#: the largest factor used
MAX_FACTOR = 1000
#: seconds of simulated time the probe that measures a day plays it in
PROBE_S = 3600.0


@dataclass(frozen=True)
class GivenDay:
    """The durations of a day plan's scenario as given (seconds; raw data, not validated)."""

    duration_s: float
    day_s: float
    warmup_s: float | None
    cooldown_s: float
    stretch: float = 1.0
    """How many times slower than the scenario file this day is played (``real_day``)."""

    @classmethod
    def of(cls, raw: dict[str, Any]) -> GivenDay | None:
        """The durations of raw scenario data; None unless a ``profile`` workload with a
        ``duration``."""
        w = raw.get("workload") or {}
        if w.get("kind") != "profile" or not w.get("duration"):
            return None
        m = raw.get("metrics") or {}
        warm = m.get("warmup")
        return cls(
            parse_duration(w["duration"]),
            parse_duration((w.get("rate_profile") or {}).get("day", DAY)),
            None if warm is None else parse_duration(warm),
            parse_duration(m.get("cooldown", 0.0)),
        )

    def stretched(self, k: float) -> GivenDay:
        """The same day played ``k`` times slower (``k < 1``: faster)."""
        warm = None if self.warmup_s is None else self.warmup_s * k
        return GivenDay(
            self.duration_s * k, self.day_s * k, warm, self.cooldown_s * k, self.stretch * k
        )

    def overrides(self, factor: float) -> list[str]:
        """``--set`` strings that play the day ``factor`` times faster (none at 1 unless
        stretched)."""
        if factor == 1 and self.stretch == 1:
            return []
        out = [
            override_text("workload.duration", self.duration_s / factor),
            override_text("workload.rate_profile.day", self.day_s / factor),
        ]
        if self.warmup_s:  # null (10% of the arrival span) and 0 scale by themselves
            out.append(override_text("metrics.warmup", self.warmup_s / factor))
        if self.cooldown_s:
            out.append(override_text("metrics.cooldown", self.cooldown_s / factor))
        return out

    def probe_factor(self) -> float:
        """The factor the day is measured at: at most :data:`PROBE_S` of simulated time."""
        return max(1.0, self.duration_s / PROBE_S)


@dataclass(frozen=True)
class Compression:
    """The factor a day plan plays its day faster by, and why (``reason``, one line)."""

    factor: int
    reaction_s: float
    share: float
    """Catch-up share at ``factor`` (``nan`` when the day is not measured)."""
    reason: str


def reaction_s(sc: Any, provision_s: float, warmup_s: float) -> float:
    """``R``: the seconds the autoscaler of ``sc`` takes to follow a rate change."""
    a = sc.autoscale
    cs = a.cold_start
    start = (cs.provision if cs.provision is not None else provision_s) + (
        cs.warmup if cs.warmup is not None else warmup_s
    )
    return float(a.interval + max(a.cooldown + start, a.scale_in_delay))


def catch_up(sc: Any, seed: int) -> float:
    """``TV / Lambda`` (1/s) of ``sc``'s rate table over its duration for ``seed``; ``TV``
    counts the first piece's rate too (the day starts on a cluster at ``min_replicas``: a
    step from nothing)."""
    table = day_table(sc.workload, seed)
    tv = float(table.rate[0]) + table.total_variation()
    return tv / float(table.cumulative()[-1])


def bound_for(attainment: float) -> float:
    """The catch-up share a plan keeping ``attainment`` allows: :data:`MAX_CATCH_UP`, or
    the plan's miss allowance ``1 - attainment`` when smaller."""
    return min(MAX_CATCH_UP, 1.0 - attainment)


def choose(
    sc: Any,
    played: float,
    seeds: list[int],
    provision_s: float,
    warmup_s: float,
    bound: float = MAX_CATCH_UP,
) -> Compression:
    """The compression of a day plan whose scenario, played ``played`` times faster than
    given, is ``sc``, keeping the catch-up share within ``bound`` (see the module
    docstring)."""
    w = sc.workload
    r = reaction_s(sc, provision_s, warmup_s)
    if w.kind != "profile" or w.duration <= 0:
        why = "day not compressed: only a profile workload with a duration is"
        return Compression(1, r, math.nan, why)
    if sc.autoscale.policy == "scheduled":
        why = "day not compressed: the scheduled policy's steps are on the simulated clock"
        return Compression(1, r, math.nan, why)
    s1 = r * max(catch_up(sc, s) for s in seeds) / played
    if s1 > bound:
        return Compression(
            1,
            r,
            s1,
            f"warning: day not compressed, no compression is safe: its catch-up share is "
            f"{s1:.3g} > {bound:g} already (R {r:g} s)",
        )
    c = MAX_FACTOR if s1 <= 0 else max(1, min(MAX_FACTOR, math.floor(bound / s1 + 1e-9)))
    if c == 1:
        why = (
            f"day not compressed: at c = 2 the catch-up share would be {2 * s1:.3g} > "
            f"{bound:g} (R {r:g} s)"
        )
        return Compression(1, r, s1, why)
    return Compression(
        c,
        r,
        c * s1,
        f"day compressed {c}x: R {r:g} s (interval + max(cooldown + start, "
        f"scale_in_delay)), catch-up share c R TV/Lambda = {c * s1:.3g} (bound "
        f"{bound:g}; {s1:.3g} in real time)",
    )
