"""A link of the simulated cluster (R2, R31): its bandwidth, latency, jitter, fault state and
traffic counters, and :class:`LinkDown`, the failure of a transfer over a dropped link.

A :class:`Link` keeps its own parameters and counters; the :class:`sim.serving.network.Network`
it is bound to (one for good, numbered by :meth:`Link.bind`) moves the flows over it, credits
``bytes_carried``, ``busy_time`` and ``rate``, and applies a fault or a bandwidth change
(``set_down``, ``set_up``, ``set_bandwidth`` go through the network so flow progress is
accounted first; an unbound link just records the change).

Faults: ``set_down("drop")`` fails every transfer that uses the link (waiting for its latency
or flowing) with :class:`LinkDown`, and so does every later transfer over it until
``set_up()``; ``set_down("hold")`` pauses them (rate 0) until ``set_up()``.

Counters: ``bytes_carried`` (bytes that crossed the link, including in-flight progress when
read through :meth:`Link.carried`), ``busy_time`` (time with at least one flow moving) and
:meth:`Link.utilisation` (mean fraction of bandwidth used since the link was created).
Invariant (kept by the network): ``rate <= bandwidth`` up to float rounding.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import simpy

if TYPE_CHECKING:
    from sim.serving.network import Network


class LinkDown(Exception):
    """A transfer failed because a link on its path went down in ``"drop"`` mode."""

    def __init__(self, link: str, at: float) -> None:
        super().__init__(link, at)  # SimPy re-creates failure exceptions from their args
        self.link = link
        self.at = at

    def __str__(self) -> str:
        return f"link {self.link!r} went down at t={self.at:.6f}s"


class Link:
    """A network or bus link (RDMA, PCIe, NVMe, object store) shared by concurrent flows."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        bandwidth: float,
        latency: float,
        jitter: float = 0.0,
    ) -> None:
        if not bandwidth > 0 or not math.isfinite(bandwidth):
            raise ValueError(f"link {name!r}: bandwidth must be a finite number > 0 B/s")
        if latency < 0 or jitter < 0:
            raise ValueError(f"link {name!r}: latency and jitter must be >= 0 s")
        self.env = env
        self.name = name
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)
        self.jitter = float(jitter)
        self.up = True
        self.down_mode: Literal["drop", "hold"] | None = None
        self.bytes_carried = 0.0
        self.busy_time = 0.0
        self.created_at = float(env.now)
        self.rate = 0.0  # sum of the rates of the flows on this link (<= bandwidth)
        self._network: Network | None = None
        self._idx = -1  # position in its network's link list, once attached

    @property
    def network(self) -> Network | None:
        """The network the link belongs to (``None`` until its first transfer or
        ``Network.add_link``)."""
        return self._network

    @property
    def index(self) -> int:
        """The link's number in its network (``Network`` numbers links 0, 1, ... as they are
        attached); -1 while it belongs to none."""
        return self._idx

    def bind(self, network: Network, index: int) -> None:
        """Make the link ``network``'s link number ``index``; a link belongs to one network for
        good (``ValueError`` if it is bound already)."""
        if self._network is not None:
            raise ValueError(f"link {self.name!r} belongs to a network already")
        self._network = network
        self._idx = index

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.bandwidth:.3g} B/s, {self.latency:.3g} s)"

    @property
    def n_flows(self) -> int:
        """Number of transfers currently using the link (waiting for latency or flowing)."""
        return 0 if self._network is None else self._network.flows_on(self)

    def set_down(self, mode: Literal["drop", "hold"] = "drop") -> None:
        """Cut the link: ``"drop"`` fails its transfers with :class:`LinkDown`, ``"hold"``
        pauses them until :meth:`set_up`."""
        if mode not in ("drop", "hold"):
            raise ValueError(f"mode must be 'drop' or 'hold', got {mode!r}")
        if self._network is not None:
            self._network.set_link_state(self, up=False, mode=mode)
        else:
            self.up, self.down_mode = False, mode

    def set_up(self) -> None:
        """Restore the link; held transfers resume."""
        if self._network is not None:
            self._network.set_link_state(self, up=True, mode=None)
        else:
            self.up, self.down_mode = True, None

    def set_bandwidth(self, bandwidth: float) -> None:
        """Change the bandwidth (e.g. a degraded link); flows are re-shared at once."""
        if not bandwidth > 0 or not math.isfinite(bandwidth):
            raise ValueError(f"link {self.name!r}: bandwidth must be a finite number > 0 B/s")
        if self._network is not None:
            self._network.set_link_bandwidth(self, float(bandwidth))
        else:
            self.bandwidth = float(bandwidth)

    def carried(self, now: float | None = None) -> float:
        """Bytes carried up to ``now`` (default ``env.now``), counting in-flight progress."""
        t = self.env.now if now is None else now
        last = self._network.accounted_until if self._network is not None else t
        return self.bytes_carried + self.rate * max(0.0, t - last)

    def utilisation(self, now: float | None = None) -> float:
        """Mean fraction of the bandwidth used between the link's creation and ``now``."""
        t = self.env.now if now is None else now
        span = t - self.created_at
        if span <= 0:
            return 0.0
        return self.carried(t) / (self.bandwidth * span)
