"""Flows over links: bandwidth shared max-min fairly between concurrent transfers (R2, R27, R31).

Model
-----
* A :class:`sim.serving.link.Link` has a bandwidth (bytes/s), a latency (s) and optional
  jitter (mean of an exponential extra delay, drawn from the network's seeded ``numpy``
  Generator); a :class:`Network` numbers the links it moves flows over (``Link.bind``).
* ``Network.transfer(path, nbytes, priority)`` returns a SimPy event. The transfer first waits
  its latency (sum of the path's link latencies plus jitter, added once), then its bytes flow
  at the rate the network allocates; the event succeeds with value ``nbytes`` when the last
  byte has arrived. An empty path is a local copy and succeeds at once.
* Rates are **weighted max-min fair** over all active flows (progressive filling): every flow
  on a bottleneck link gets the same rate per unit of weight, and no link carries more than
  its bandwidth. Rates are recomputed only when a flow starts or ends or a link changes; one
  timer is scheduled per change (for the next completion), never one event per byte.
  Transfers whose latency ends at the same instant start together (one timer, one
  recomputation), and flows with the same path and priority are filled as one class (they
  always share a rate; :meth:`Network._fill`).
* Priority classes (R27; lower number = more important, ``priority >= 0``):
  ``priority_mode="weighted"`` (default) gives a flow weight ``priority_weight ** -priority``,
  so a priority-0 flow gets ``priority_weight`` x the share of a priority-1 flow on a shared
  bottleneck; ``"strict"`` fills class 0 first and gives later classes only what is left.
* Faults: ``Link.set_down("drop")`` fails every transfer that uses the link (waiting for its
  latency or flowing) with :class:`~sim.serving.link.LinkDown`, and so does every later
  transfer over it until ``set_up()``; ``set_down("hold")`` pauses them (rate 0) until
  ``set_up()``.
  A failed event must be yielded or ``defused`` by its owner, as usual in SimPy.

Counters per link (kept on the link, credited here): see :mod:`sim.serving.link`.
Conservation: a completed transfer delivered exactly ``nbytes``; every link on its path was
credited with exactly ``nbytes`` for it (up to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Literal

import numpy as np
import simpy

from sim.serving.link import Link, LinkDown
from sim.serving.maxmin import fill_classes
from sim.simenv import SimTimeout

_RATE_TOL = 1e-9  # relative slack when comparing shares / remaining bytes


class _Flow:
    __slots__ = (
        "cls",
        "event",
        "fid",
        "lix",
        "nbytes",
        "path",
        "priority",
        "rate",
        "remaining",
        "started",
        "weight",
    )

    def __init__(
        self, fid: int, path: tuple[Link, ...], nbytes: int, priority: int, weight: float
    ) -> None:
        self.fid = fid
        self.path = path
        self.lix: tuple[int, ...] = ()  # the path's link indices in its network (set by transfer)
        self.cls = -1  # its (path, weight) class in its network (set by transfer)
        self.nbytes = nbytes
        self.remaining = float(nbytes)
        self.priority = priority
        self.weight = weight
        self.rate = 0.0
        self.started = False  # False while waiting for its latency
        self.event: simpy.Event


class Network:
    """All links of one simulated cluster and the flows crossing them."""

    def __init__(
        self,
        env: simpy.Environment,
        priority_mode: Literal["weighted", "strict"] = "weighted",
        priority_weight: float = 4.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        if priority_mode not in ("weighted", "strict"):
            raise ValueError(f"priority_mode must be 'weighted' or 'strict', got {priority_mode!r}")
        if priority_weight < 1:
            raise ValueError(f"priority_weight must be >= 1, got {priority_weight}")
        self.env = env
        self.priority_mode = priority_mode
        self.priority_weight = float(priority_weight)
        self.rng = rng
        self.links: dict[str, Link] = {}
        self._link_list: list[Link] = []  # every attached link, by its index
        self._index: dict[Link, int] = {}  # attached link -> its index (Link.index)
        # by link index: the flows using the link (pending ones included), in start order
        self._on_link: list[dict[int, _Flow]] = []
        self._flows: dict[int, _Flow] = {}  # started flows, in start order
        self._next_id = 0
        self._last = float(env.now)  # time up to which flow progress is accounted
        self._timer_gen = 0  # only the newest timer acts; older ones are stale
        self._busy: dict[Link, None] = {}  # links with rate > 0, in first-use order
        self._classes: dict[tuple[tuple[int, ...], float], int] = {}  # (path, weight) -> id
        self._starting: dict[float, list[_Flow]] = {}  # start time -> flows waiting for it
        self.transfers_started = 0
        self.transfers_completed = 0
        self.bytes_delivered = 0

    # -- topology -----------------------------------------------------------------------------
    def add_link(self, name: str, bandwidth: float, latency: float, jitter: float = 0.0) -> Link:
        """Create and register a link; ``ValueError`` if the name is taken."""
        if name in self.links:
            raise ValueError(f"link {name!r} already exists")
        link = Link(self.env, name, bandwidth, latency, jitter)
        self._attach(link)
        return link

    def _attach(self, link: Link) -> None:
        owner = link.network
        if owner is None:
            i = len(self._link_list)
            link.bind(self, i)
            self._link_list.append(link)
            self._index[link] = i
            self._on_link.append({})
            self.links.setdefault(link.name, link)
        elif owner is not self:
            raise ValueError(f"link {link.name!r} belongs to another network")

    # -- transfers ----------------------------------------------------------------------------
    def transfer(
        self, path: Sequence[Link], nbytes: int, priority: int = 0, after: float = 0.0
    ) -> simpy.Event:
        """Move ``nbytes`` over ``path``, starting ``after`` seconds from now (plus the links'
        latencies); see the module docstring. Returns the completion event (value
        ``nbytes``), which fails with :class:`~sim.serving.link.LinkDown` if a link drops."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if priority < 0:
            raise ValueError(f"priority must be >= 0 (0 = most important), got {priority}")
        event = self.env.event()
        if not path:
            event.succeed(nbytes)
            return event
        links = tuple(path)
        index = self._index
        for link in links:
            if link not in index:
                self._attach(link)
        self.transfers_started += 1
        dead = next((lk for lk in links if not lk.up and lk.down_mode == "drop"), None)
        if dead is not None:
            event.fail(LinkDown(dead.name, self.env.now))
            return event
        weight = 1.0 if self.priority_mode == "strict" else self.priority_weight ** (-priority)
        flow = _Flow(self._next_id, links, int(nbytes), int(priority), weight)
        flow.lix = tuple(index[lk] for lk in links)
        flow.cls = self._classes.setdefault((flow.lix, weight), len(self._classes))
        self._next_id += 1
        flow.event = event
        on = self._on_link
        for j in flow.lix:
            on[j][flow.fid] = flow
        delay = after + sum(lk.latency for lk in links)
        jitters = [lk.jitter for lk in links if lk.jitter > 0]
        if jitters:
            if self.rng is None:
                raise ValueError("links with jitter need Network(rng=numpy Generator)")
            delay += float(sum(self.rng.exponential(j) for j in jitters))
        if delay > 0:  # flows due at one instant start together: one timer, one reallocation
            at = self.env.now + delay  # the time SimPy schedules the timeout at
            due = self._starting.get(at)
            if due is None:
                self._starting[at] = [flow]
                SimTimeout(self.env, delay).callbacks.append(partial(self._start_cb, at))
            else:
                due.append(flow)
        else:
            self._start([flow])
        return event

    def path_time(self, path: Sequence[Link], nbytes: int) -> float:
        """Time ``nbytes`` would take over ``path`` with no other traffic (latency + bytes over
        the bottleneck bandwidth); no jitter."""
        if not path:
            return 0.0
        return sum(lk.latency for lk in path) + nbytes / min(lk.bandwidth for lk in path)

    def flows_on(self, link: Link) -> int:
        """Transfers using ``link`` now (waiting for their latency or flowing); 0 for a link
        of no or another network."""
        i = self._index.get(link)
        return 0 if i is None else len(self._on_link[i])

    @property
    def accounted_until(self) -> float:
        """The time up to which flow progress and link counters are accounted (the last
        start, end or link change); progress since then is ``rate x elapsed``."""
        return self._last

    def set_link_state(self, link: Link, up: bool, mode: Literal["drop", "hold"] | None) -> None:
        """Bring ``link`` up (``mode`` None) or down in ``mode`` (see
        :meth:`~sim.serving.link.Link.set_down`), accounting progress up to now first; a drop
        fails the link's transfers; rates are re-shared at once."""
        self._advance()
        link.up, link.down_mode = up, mode
        if not up and mode == "drop":
            for flow in list(self._on_link[self._index[link]].values()):
                self._fail(flow, link)
        self._reallocate()

    def set_link_bandwidth(self, link: Link, bandwidth: float) -> None:
        """Give ``link`` ``bandwidth`` (B/s, validated by
        :meth:`~sim.serving.link.Link.set_bandwidth`) from now on: progress up to now at the
        old rates, then rates re-shared at once."""
        self._advance()
        link.bandwidth = bandwidth
        self._reallocate()

    @property
    def active_flows(self) -> int:
        """Number of transfers whose bytes are flowing (or held)."""
        return len(self._flows)

    # -- internals ----------------------------------------------------------------------------
    def _start_cb(self, at: float, _event: simpy.Event) -> None:
        self._start(self._starting.pop(at))

    def _timer_cb(self, gen: int, _event: simpy.Event) -> None:
        self._on_timer(gen)

    def _start(self, flows: list[_Flow]) -> None:
        """Start ``flows`` (in order) now, then reallocate once if any of them flows."""
        started = False
        for flow in flows:
            if flow.event.triggered:  # dropped while waiting for its latency
                continue
            if flow.nbytes == 0:
                self._finish(flow)
                continue
            if not started:
                self._advance()
                started = True
            flow.started = True
            self._flows[flow.fid] = flow
        if started:
            self._reallocate()

    def _advance(self) -> None:
        """Account flow progress and link counters from ``_last`` up to ``env.now``."""
        now = float(self.env.now)
        dt = now - self._last
        if dt <= 0:
            return
        for flow in self._flows.values():
            if flow.rate > 0:
                moved = flow.rate * dt
                flow.remaining -= moved
                for link in flow.path:
                    link.bytes_carried += moved
        for link in self._busy:
            link.busy_time += dt
        self._last = now

    def _finish(self, flow: _Flow) -> None:
        # Credit the rounding residue so each link gets exactly nbytes for this flow.
        on = self._on_link
        for link, j in zip(flow.path, flow.lix, strict=True):
            if flow.started:
                link.bytes_carried += flow.remaining
            else:
                link.bytes_carried += flow.nbytes
            del on[j][flow.fid]
        flow.remaining = 0.0
        flow.rate = 0.0
        self._flows.pop(flow.fid, None)
        self.transfers_completed += 1
        self.bytes_delivered += flow.nbytes
        flow.event.succeed(flow.nbytes)

    def _fail(self, flow: _Flow, link: Link) -> None:
        on = self._on_link
        for j in flow.lix:
            del on[j][flow.fid]
        flow.rate = 0.0
        self._flows.pop(flow.fid, None)
        flow.event.fail(LinkDown(link.name, self.env.now))

    def _on_timer(self, gen: int) -> None:
        if gen != self._timer_gen:
            return  # superseded by a later reallocation
        self._advance()
        now = float(self.env.now)
        # Done: less than a nanosecond's worth of bytes left, or so little that the finish
        # time rounds to `now` (guards against zero-length timer loops).
        done = [
            f
            for f in self._flows.values()
            if f.rate > 0
            and (
                f.remaining <= _RATE_TOL * (f.nbytes + f.rate) or now + f.remaining / f.rate <= now
            )
        ]
        for flow in done:
            self._finish(flow)
        self._reallocate()

    def _reallocate(self) -> None:
        """Recompute all rates (weighted max-min fair) and schedule the next completion.

        Cost O(flows x path length) list and dict operations plus O(links crossed) heap
        operations per call, where "links crossed" are the links some active flow uses:
        nothing here scales with the network's total number of links (a cluster's idle
        links cost nothing). The arithmetic (and so every rate, bit for bit) is the plain
        progressive filling described in :meth:`_fill`. Each link's ``rate`` is the sum of
        its flows' rates added in flow start order.
        """
        flows = list(self._flows.values())
        links = self._link_list
        local: dict[int, int] = {}  # network link index -> position in ``crossed``
        crossed: list[Link] = []  # the links the active flows use, in first-use order
        residual: list[float] = []  # by position in ``crossed``; shared across classes
        if self.priority_mode == "strict":
            classes = sorted({f.priority for f in flows})
            for cls in classes:
                self._fill([f for f in flows if f.priority == cls], residual, local, links, crossed)
        else:
            self._fill(flows, residual, local, links, crossed)
        link_rate = [0.0] * len(crossed)
        soonest: float | None = None
        for flow in flows:
            rate = flow.rate
            if rate > 0:
                for j in flow.lix:
                    link_rate[local[j]] += rate
                t = flow.remaining / rate
                if soonest is None or t < soonest:
                    soonest = t
        for link in self._busy:
            link.rate = 0.0
        busy: dict[Link, None] = {}
        for k, total in enumerate(link_rate):
            if total > 0:
                link = crossed[k]
                link.rate = total
                busy[link] = None
        self._busy = busy
        # Invariant: for every link, link.rate <= link.bandwidth (up to float rounding).
        self._timer_gen += 1
        if soonest is not None:
            gen = self._timer_gen
            SimTimeout(self.env, max(0.0, soonest)).callbacks.append(partial(self._timer_cb, gen))

    @staticmethod
    def _fill(
        flows: list[_Flow],
        residual: list[float],
        local: dict[int, int],
        links: list[Link],
        crossed: list[Link],
    ) -> None:
        """Progressive filling: raise all unfrozen flows' rates in proportion to their
        weights until a link saturates; freeze the flows crossing it; repeat.

        Flows with the same path and weight (one ``_Flow.cls``) always get the same rate, so
        they are filled as ONE class of their total weight (``k`` flows of weight ``w``:
        weight ``w * k``, ordered by its first flow in ``flows``); each flow then gets
        ``w * share``. With no two flows in a class this is the per-flow filling, bit for
        bit; with classes, a link's residual loses ``w * k * share`` at once instead of
        ``w * share`` k times (the same allocation up to float rounding).

        Links are numbered compactly: ``local`` maps a network link index (``_Flow.lix``,
        into ``links``) to its position in ``crossed``, the links met so far in first-use
        order; a link met here for the first time is appended to ``crossed`` and gets
        ``residual`` = its bandwidth, or 0 while down. ``residual[k]`` is the capacity left
        on ``crossed[k]``; it is updated in place, so strict priority classes can fill one
        after another. Every flow in ``flows`` gets its ``rate``. Renumbering never changes
        a rate: the filling below orders links by first use and breaks ties by push order,
        never by link number. Cost O(flows + classes x path length) here, then
        :func:`sim.serving.maxmin.fill_classes` over the classes and the links they cross
        only.

        Links wait in a heap keyed by their fair share per unit weight (residual / unfrozen
        weight), updated lazily as classes freeze: cost O(flows + (classes x path length) +
        pushes x log links). Freezing classes at the current minimum share never lowers
        another link's share below it, so the popped minimum is final.

        Determinism (results are bit-for-bit those of the one-push-per-update textbook
        filling over the classes): per link, residuals and weights are updated class by
        class in order; after a link's classes freeze, each other link touched gets ONE
        new heap entry (its final share after that round), and those entries are pushed in
        the order of each link's last update, so ties between equal shares break as in the
        textbook version.
        """
        pos: dict[int, int] = {}  # class id -> position among this fill's classes
        paths: list[tuple[int, ...]] = []
        unit: list[float] = []  # the weight of one flow of the class
        mult: list[int] = []  # flows in the class
        of: list[int] = []  # class position of each flow
        for flow in flows:
            c = pos.get(flow.cls)
            if c is None:
                c = pos[flow.cls] = len(paths)
                lpath: list[int] = []
                for j in flow.lix:
                    k = local.get(j)
                    if k is None:
                        k = local[j] = len(crossed)
                        link = links[j]
                        crossed.append(link)
                        residual.append(link.bandwidth if link.up else 0.0)
                    lpath.append(k)
                paths.append(tuple(lpath))
                unit.append(flow.weight)
                mult.append(1)
            else:
                mult[c] += 1
            of.append(c)
        weights = [w * k if k > 1 else w for w, k in zip(unit, mult, strict=True)]
        shares = fill_classes(paths, weights, residual)
        for flow, c in zip(flows, of, strict=True):
            flow.rate = unit[c] * shares[c]
