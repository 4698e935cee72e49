"""Routing for both hops of a disaggregated request: one registry (``ROUTERS``).

A router is a class with ``choose(nodes, load, affinity) -> node`` over the *live* nodes of
one pool, where ``load(node)`` is its load (see below) and ``affinity(node)`` how much of the
request's prefix the node already holds (0 where unknown). Ties go to the lowest index.

* ``least-loaded`` -- the smallest ``load``;
* ``round-robin`` -- the pool's live nodes in turn;
* ``kv-aware`` -- the largest ``affinity``, then the smallest ``load``.

The coordinator (:mod:`sim.disagg.coordinator`) defines the measures per hop: on the prefill
hop ``load`` is queued + running requests (``kv-aware``: prompt tokens still to compute on the
node, store hits excluded; ``affinity`` 0); on the decode hop ``load`` is queued + running +
KV transfers on their way to the node, and ``affinity`` the prompt's prefix blocks the node
already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Measure = Callable[[Any], float]


class Router:
    """Base router."""

    name = ""

    def choose(self, nodes: Sequence[Any], load: Measure, affinity: Measure) -> Any:
        raise NotImplementedError


ROUTERS: dict[str, type[Router]] = {}


def register(name: str) -> Callable[[type[Router]], type[Router]]:
    def deco(cls: type[Router]) -> type[Router]:
        cls.name = name
        ROUTERS[name] = cls
        return cls

    return deco


@register("least-loaded")
class LeastLoaded(Router):
    def choose(self, nodes: Sequence[Any], load: Measure, affinity: Measure) -> Any:
        return min(nodes, key=lambda n: (load(n), n.idx))


@register("round-robin")
class RoundRobin(Router):
    def __init__(self) -> None:
        self._i = -1

    def choose(self, nodes: Sequence[Any], load: Measure, affinity: Measure) -> Any:
        self._i += 1
        return nodes[self._i % len(nodes)]


@register("kv-aware")
class KvAware(Router):
    def choose(self, nodes: Sequence[Any], load: Measure, affinity: Measure) -> Any:
        return min(nodes, key=lambda n: (-affinity(n), load(n), n.idx))


def make_router(name: str) -> Router:
    """A new router of the registered ``name`` (``KeyError`` naming the allowed ones)."""
    if name not in ROUTERS:
        raise KeyError(f"unknown router {name!r}; allowed: {', '.join(sorted(ROUTERS))}")
    return ROUTERS[name]()
