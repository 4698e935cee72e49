"""The autoscaler's decision rule: a policy's ask, made safe.

:class:`Controller` turns a policy's desired count into an action ``(+k add | -k drain | 0)``
given the current size. Invariants kept here (tested with Hypothesis,
tests/sim/control/autoscale/test_controller.py):

* the size after the action stays in ``[min_replicas, max_replicas]`` whenever the size
  before it did (``current`` counts serving and starting replicas; draining ones are
  leaving); a size outside the bounds only moves toward them;
* a scale-out adds at most ``scale_up_step`` and comes no sooner than ``cooldown`` after
  the previous scale-out; a scale-in drains at most ``scale_down_step``, only while no
  replica is starting, never within ``scale_in_delay`` of a scale-out, and only down to
  the largest count asked for over the last ``scale_in_delay`` seconds (HPA's
  stabilisation window).
"""

from __future__ import annotations

from collections import deque

from sim.control.autoscale.section import AutoscaleCfg


class Controller:
    """See the module docstring. ``decide`` must be called with non-decreasing ``now``."""

    def __init__(self, cfg: AutoscaleCfg) -> None:
        self.cfg = cfg
        self.last_up: float | None = None
        self._asks: deque[tuple[float, int]] = deque()

    def clamp(self, n: int) -> int:
        """``n`` within ``[min_replicas, max_replicas]``."""
        return min(max(n, self.cfg.min_replicas), self.cfg.max_replicas)

    def decide(
        self, now: float, desired: int, current: int, starting: int, draining: int = 0
    ) -> int:
        """Replicas to add (> 0) or drain (< 0) now, or 0. ``current``: serving + starting;
        ``starting``: of those, not yet serving; ``draining``: replicas still holding GPUs
        while they drain (they count against ``max_replicas``)."""
        cfg = self.cfg
        want = self.clamp(desired)
        asks = self._asks
        asks.append((now, want))
        while asks and asks[0][0] < now - cfg.scale_in_delay:
            asks.popleft()
        if want > current:
            if self.last_up is not None and now - self.last_up < cfg.cooldown:
                return 0
            room = cfg.max_replicas - current - draining
            add = min(want - current, cfg.scale_up_step, room)
            if add <= 0:
                return 0
            self.last_up = now
            return add
        if want < current:
            if starting or (self.last_up is not None and now - self.last_up < cfg.scale_in_delay):
                return 0
            floor = max(max(w for _, w in asks), cfg.min_replicas)
            drop = min(current - floor, cfg.scale_down_step)
            return -drop if drop > 0 else 0
        return 0
