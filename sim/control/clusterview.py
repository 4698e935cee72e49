"""What the control plane reads of a built cluster.

The control plane sits below the cluster assembly (it must not import ``sim.cluster``), so it
names the part of :class:`sim.cluster.Cluster` it uses as a protocol: the shared run context,
the request placement and the workload. ``Cluster`` satisfies it structurally.
"""

from __future__ import annotations

from typing import Protocol

from sim.serving.context import SimContext
from sim.serving.placement import Scheduler
from sim.serving.workload import Workload


class ClusterView(Protocol):
    """A built cluster as the control plane sees it."""

    ctx: SimContext
    scheduler: Scheduler
    wl: Workload
