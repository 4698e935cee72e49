"""Autoscaling policies: what replica count to ask for, given what a real autoscaler reads.

One registry (``POLICIES``): a policy is a class with ``desired(obs) -> int`` registered by
name; adding a policy is one class and one ``@register`` line. A policy only *asks*: the
:class:`sim.control.autoscale.controller.Controller` clamps the answer to ``[min, max]`` and
applies the step limits, the cooldown and the scale-in delay.

* ``target-utilisation`` -- as a Kubernetes HPA on a per-pod metric (KEDA's queue scaler):
  ``ceil(replicas x utilisation / target)`` with HPA's 10% tolerance, where utilisation is
  the larger of the batch in use (queued + running requests over ``max_num_seqs`` per
  serving replica) and the KV blocks in use;
* ``slo`` -- one ``scale_up_step`` more while the recent P90 TTFT exceeds ``slo_high`` x the
  tightest TTFT objective, one fewer while it is under ``slo_low`` x it and utilisation is
  under ``target / 2``;
* ``scheduled`` -- the replicas of the latest ``schedule`` step that has started;
* ``predictive`` -- the arrival rate's least-squares line over the last ``lookback``
  seconds, read ``horizon`` ahead, over ``replica_rate`` (and never fewer than the current
  rate needs).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.control.autoscale.section import AutoscaleCfg

#: HPA's default tolerance: no change while the metric is within 10% of its target
TOLERANCE = 0.1


@dataclass(frozen=True)
class Observation:
    """What the loop reads at ``t``: replica counts by state, the requests queued and
    running on them, their batch limit, the KV share in use, the arrival rate over the last
    interval, and the recent P90 TTFT / mean TPOT (None: no request in the window)."""

    t: float
    serving: int
    starting: int  # provisioning or loading
    draining: int
    queued: int
    running: int
    max_num_seqs: int
    kv_use: float
    arrival_rate: float
    ttft_p90: float | None
    tpot_mean: float | None

    @property
    def utilisation(self) -> float:
        """The larger of batch use (queued + running over the serving replicas' batch
        slots) and KV use; 0 with nothing serving."""
        slots = self.serving * self.max_num_seqs
        batch = (self.queued + self.running) / slots if slots else 0.0
        return max(batch, self.kv_use)

    @property
    def current(self) -> int:
        """Replicas counted against the size (serving and starting; not draining)."""
        return self.serving + self.starting


class Policy:
    """Base autoscaling policy: ``desired(obs)`` is the replica count it asks for."""

    name = ""

    def __init__(self, cfg: AutoscaleCfg, ttft_slo: float | None, horizon: float) -> None:
        self.cfg = cfg
        self.ttft_slo = ttft_slo
        self.horizon = horizon

    def desired(self, obs: Observation) -> int:
        raise NotImplementedError


POLICIES: dict[str, type[Policy]] = {}


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    def deco(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        POLICIES[name] = cls
        return cls

    return deco


@register("target-utilisation")
class TargetUtilisation(Policy):
    def desired(self, obs: Observation) -> int:
        n = max(obs.serving, 1)
        ratio = obs.utilisation / self.cfg.target
        if abs(ratio - 1.0) <= TOLERANCE:
            return obs.current
        return max(math.ceil(n * ratio - 1e-9), 1)


@register("slo")
class SloDriven(Policy):
    def desired(self, obs: Observation) -> int:
        slo, p = self.ttft_slo, obs.ttft_p90
        if slo is None or p is None:
            return obs.current
        if p > self.cfg.slo_high * slo:
            return obs.current + self.cfg.scale_up_step
        if p < self.cfg.slo_low * slo and obs.utilisation < self.cfg.target / 2:
            return obs.current - 1
        return obs.current


@register("scheduled")
class Scheduled(Policy):
    def desired(self, obs: Observation) -> int:
        started = [s for s in self.cfg.schedule if s.at <= obs.t]
        if not started:
            return obs.current
        return max(started, key=lambda s: s.at).replicas


@register("predictive")
class Predictive(Policy):
    def __init__(self, cfg: AutoscaleCfg, ttft_slo: float | None, horizon: float) -> None:
        super().__init__(cfg, ttft_slo, horizon)
        self.history: deque[tuple[float, float]] = deque()

    def desired(self, obs: Observation) -> int:
        h = self.history
        h.append((obs.t, obs.arrival_rate))
        while h and h[0][0] < obs.t - self.cfg.lookback:
            h.popleft()
        rate = obs.arrival_rate
        if len(h) >= 2:
            t = np.array([x for x, _ in h])
            r = np.array([y for _, y in h])
            slope, icpt = np.polyfit(t - t[-1], r, 1)
            rate = max(float(icpt + slope * self.horizon), obs.arrival_rate)
        per = self.cfg.replica_rate
        assert per is not None  # AutoscaleCfg requires it for this policy
        return max(math.ceil(rate / per - 1e-9), 1)
