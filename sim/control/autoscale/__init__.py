"""Autoscaling of the simulated cluster (R22): the control loop, its policies (one
registry), the decision rule, and the figures (see docs/design/autoscaling.md)."""

from __future__ import annotations

from typing import Any

from sim.control.autoscale.loop import Autoscaler, ScalableCluster
from sim.control.autoscale.policies import POLICIES
from sim.control.autoscale.section import AutoscaleCfg, check_autoscale

__all__ = ["POLICIES", "AutoscaleCfg", "Autoscaler", "attach", "check_autoscale"]


def attach(cluster: ScalableCluster, profile: Any) -> Autoscaler | None:
    """Start the autoscaler on a built cluster when ``autoscale.enabled``; else None."""
    sc = cluster.ctx.sc
    if not sc.autoscale.enabled:
        return None
    check_autoscale(sc)
    scaler = Autoscaler(cluster, profile.coldstart)
    scaler.start()
    return scaler
