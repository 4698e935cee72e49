"""Request placement (R2) and tiered degradation (R11).

Placement policies form one registry (``PLACEMENTS``): a policy is a class with
``choose(model, nodes, now) -> node index`` over the *live* nodes, registered by name:

* ``random`` -- uniform from the ``scheduler`` random stream;
* ``round-robin`` -- live nodes in turn;
* ``least-loaded`` -- fewest queued + running requests (ties: lowest index);
* ``score`` -- lowest ``w_load * load/max_batch + w_fragmentation * kv_fragmentation +
  w_pcie * pcie_utilisation - w_affinity * share_of_model_resident_in_hbm`` (ties: index).

Cost per request (the complexity contract; none of it grows with the cluster but ``score``):
``random``, ``round-robin`` O(1); ``least-loaded`` O(log n) amortised (a heap of loads, see
:class:`LeastLoaded`); the live-node list is cached by the :class:`Scheduler` until a node
goes up or down (O(n) once per such change, not per request); the degradation check reads
the chosen node only, O(1). ``score`` is O(n) per request by its definition: its terms (PCIe
utilisation at ``now``, KV fragmentation, affinity) move with time and with every transfer,
so no index keeps the same answer; it is the one placement whose cost grows with the
cluster.

Degradation (R11): the cluster is *overloaded* for a request when its chosen node's queue
holds ``queue_per_node`` requests or its oldest queued request has waited ``max_wait``.
Then a request of a non-protected class is shed (``action: shed``) or parked in a holding
queue released as load drops (``action: queue``); a protected-class request is always
queued. So the protected class is never shed, and never shed before another class.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
from mypy_extensions import mypyc_attr

from sim.serving.context import SimContext
from sim.serving.metrics import EV_ARRIVE, EV_SHED, SHED

if TYPE_CHECKING:
    import simpy

    from sim.serving.replica import ComputeNode


@mypyc_attr(native_class=False)  # compiled methods, an open class: policies subclass it
class Placement:
    """Base placement policy."""

    name = ""

    def __init__(self, ctx: SimContext, rng: np.random.Generator) -> None:
        self.ctx = ctx
        self.rng = rng

    def choose(self, model: int, nodes: list[ComputeNode], now: float) -> ComputeNode:
        raise NotImplementedError


PLACEMENTS: dict[str, type[Placement]] = {}


def register(name: str) -> Callable[[type[Placement]], type[Placement]]:
    def deco(cls: type[Placement]) -> type[Placement]:
        cls.name = name
        PLACEMENTS[name] = cls
        return cls

    return deco


@register("random")
class RandomPlacement(Placement):
    def choose(self, model: int, nodes: list[ComputeNode], now: float) -> ComputeNode:
        return nodes[int(self.rng.integers(len(nodes)))]


@register("round-robin")
class RoundRobin(Placement):
    def __init__(self, ctx: SimContext, rng: np.random.Generator) -> None:
        super().__init__(ctx, rng)
        self._i = -1

    def choose(self, model: int, nodes: list[ComputeNode], now: float) -> ComputeNode:
        self._i += 1
        return nodes[self._i % len(nodes)]


@register("least-loaded")
class LeastLoaded(Placement):
    """Fewest queued + running requests; ties: the earliest node of ``nodes``.

    O(log n) per choice: a min-heap of ``(load, position in nodes)`` entries, built for one
    ``nodes`` list (rebuilt when the scheduler hands a different list, i.e. when a node goes
    up or down). A node's load rises only by a submit and falls only by a completion or an
    abort, which the node reports through its ``on_unload`` hook (a push). Invariant: every
    node has an entry whose load is <= its current load; so the top entry, once it matches
    its node's current load (a lower, stale one is re-pushed with the current load), is the
    least-loaded node -- the same choice as scanning ``nodes`` in order.
    """

    def __init__(self, ctx: SimContext, rng: np.random.Generator) -> None:
        super().__init__(ctx, rng)
        self._for: list[ComputeNode] | None = None
        self._heap: list[tuple[int, int]] = []

    def _rebuild(self, nodes: list[ComputeNode]) -> None:
        if self._for is not nodes:
            if self._for is not None:
                for n in self._for:
                    n.on_unload = None
            for pos, n in enumerate(nodes):
                n.on_unload = self._hook(pos)
        self._for = nodes
        self._heap = [(n.qlen + n.running, pos) for pos, n in enumerate(nodes)]
        heapq.heapify(self._heap)

    def _hook(self, pos: int) -> Callable[[ComputeNode], None]:
        return partial(self._unloaded, pos)

    def _unloaded(self, pos: int, node: ComputeNode) -> None:
        """``node`` (at ``pos``) lost load: push its current load (the heap list is replaced
        on rebuild, so it is looked up at call time)."""
        heapq.heappush(self._heap, (node.qlen + node.running, pos))

    def choose(self, model: int, nodes: list[ComputeNode], now: float) -> ComputeNode:
        heap = self._heap
        if nodes is not self._for or len(heap) > 4 * len(nodes) + 64:
            self._rebuild(nodes)
            heap = self._heap
        while True:
            load, pos = heap[0]
            n = nodes[pos]
            cur = n.qlen + n.running
            if load == cur:
                return n
            heapq.heapreplace(heap, (cur, pos))


@register("score")
class ScorePlacement(Placement):
    """The lowest score over ``nodes`` (ties: the earliest); O(len(nodes)) per choice (see
    the module docstring: its terms change continuously, so every node is scored)."""

    def choose(self, model: int, nodes: list[ComputeNode], now: float) -> ComputeNode:
        c = self.ctx.sc.scheduler
        best, best_s = nodes[0], float("inf")
        for n in nodes:
            s = (
                c.w_load * (n.qlen + n.running) / n.max_batch
                + c.w_fragmentation * n.kv.fragmentation()
                + c.w_pcie * n.ws.links["pcie"].utilisation(now)
                - c.w_affinity * n.ws.affinity(model)
            )
            if s < best_s:
                best, best_s = n, s
        return best


@mypyc_attr(allow_interpreted_subclasses=True)  # sim.disagg subclasses it
class Scheduler:
    """Front door of the cluster: place each arriving request or degrade it."""

    def __init__(self, ctx: SimContext, rng: np.random.Generator) -> None:
        self.ctx = ctx
        cfg = ctx.sc.scheduler
        self.policy = PLACEMENTS[cfg.policy](ctx, rng)
        self.deg = ctx.sc.degradation
        self.held: deque[int] = deque()
        self._release_running = False
        self._live: list[ComputeNode] | None = None
        for n in ctx.nodes:  # a node going down or up drops the cached live list
            n.watch_up(self._forget_live)

    def add_node(self, node: ComputeNode) -> None:
        """Follow a replica added while the run goes (the autoscaler appends it to
        ``ctx.nodes`` first): its ``up`` changes now reset the live list too."""
        node.watch_up(self._forget_live)
        self._live = None

    def _forget_live(self) -> None:
        self._live = None

    def live_nodes(self) -> list[ComputeNode]:
        """The nodes that are up, in index order. Cached until a node's ``up`` changes; callers
        must not modify the returned list (a change makes a new one)."""
        live = self._live
        if live is None:
            live = self._live = [n for n in self.ctx.nodes if n.up]
        return live

    def _overloaded(self, node: ComputeNode, now: float) -> bool:
        d = self.deg
        return bool(node.qlen >= d.queue_per_node or node.oldest_wait(now) >= d.max_wait)

    def dispatch(self, rid: int, m: int = -1) -> None:
        """Place request ``rid`` (it has arrived now; ``m``: its model index, -1: look it up)."""
        ctx = self.ctx
        now = ctx.env.now
        met = ctx.metrics
        met.n_arrived += 1
        met.arrival[rid] = now
        if m < 0:
            m = ctx_model(ctx, rid)
        nodes = self._live
        if nodes is None:
            nodes = self.live_nodes()
        if not nodes:
            self._shed(rid, now)
            return
        node = self.policy.choose(m, nodes, now)
        if self.deg.enabled and self._overloaded(node, now):
            cls = int(ctx_cls(ctx, rid))
            if not ctx.protected[cls]:
                if self.deg.action == "shed":
                    self._shed(rid, now)
                    return
                self.held.append(rid)
                if not self._release_running:
                    self._release_running = True
                    ctx.env.process(self._release())
                return
        self._place(rid, node, now, m)

    def redispatch(self, rid: int, live: list[ComputeNode], now: float) -> bool:
        """Place displaced request ``rid`` (its node went down) on one of the ``live`` nodes
        (non-empty) that the placement policy chooses, or shed it when degradation is on, its
        class is not protected and that node is overloaded; True if placed."""
        node = self.policy.choose(ctx_model(self.ctx, rid), live, now)
        cls = ctx_cls(self.ctx, rid)
        if self.deg.enabled and not self.ctx.protected[cls] and self._overloaded(node, now):
            self._shed(rid, now)
            return False
        self._place(rid, node, now)
        return True

    def _place(self, rid: int, node: ComputeNode, now: float, m: int = -1) -> None:
        """Send ``rid`` to ``node`` (``m``: its model index if known, else read there)."""
        ctx = self.ctx
        ctx.metrics.node[rid] = node.idx
        ctx.trace.rec(now, EV_ARRIVE, rid, node.idx)
        node.submit(rid, m)

    def _shed(self, rid: int, now: float) -> None:
        met = self.ctx.metrics
        met.finish(rid, SHED)
        met.shed_order.append(int(ctx_cls(self.ctx, rid)))
        self.ctx.trace.rec(now, EV_SHED, rid, 0)
        if self.ctx.on_complete is not None:
            self.ctx.on_complete(rid)

    def _release(self) -> Generator[simpy.Event, object, None]:
        """Release held (degraded) requests while some node is below the overload mark."""
        env = self.ctx.env
        while self.held:
            yield env.timeout(self.deg.max_wait / 4)
            while self.held:
                nodes = self.live_nodes()
                if not nodes:
                    break
                rid = self.held[0]
                node = self.policy.choose(int(ctx_model(self.ctx, rid)), nodes, env.now)
                if self._overloaded(node, env.now):
                    break
                self.held.popleft()
                self._place(rid, node, env.now)
        self._release_running = False


def ctx_model(ctx: SimContext, rid: int) -> int:
    return int(ctx.nodes[0].wl.model[rid])


def ctx_cls(ctx: SimContext, rid: int) -> int:
    return int(ctx.nodes[0].wl.cls[rid])
