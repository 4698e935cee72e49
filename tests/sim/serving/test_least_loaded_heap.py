"""The least-loaded placement's heap (O(log n) per choice) picks what a scan of the live nodes
in order picks -- the fewest queued + running requests, ties to the earliest node -- under
random submits, completions, aborts and nodes going down and up; and in a whole run."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.scenario import validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.models import load_catalogue
from sim.serving.placement import LeastLoaded


class _Node:
    """The node surface the policy reads: loads, ``up`` and the ``on_unload`` hook."""

    def __init__(self, idx: int) -> None:
        self.idx, self.qlen, self.running, self.up = idx, 0, 0, True
        self.on_unload: Any = None

    def unload(self) -> None:
        if self.on_unload is not None:
            self.on_unload(self)


def _scan(nodes: list[_Node]) -> _Node:
    return min(nodes, key=lambda n: (n.qlen + n.running, nodes.index(n)))


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["choose", "submit", "admit", "finish", "abort", "flip"]),
        st.integers(0, 7),
    ),
    max_size=300,
)


@settings(max_examples=200)
@given(ops=_OPS)
def test_heap_choice_equals_the_scan(ops: list[tuple[str, int]]) -> None:
    nodes = [_Node(i) for i in range(8)]
    pol = LeastLoaded.__new__(LeastLoaded)
    LeastLoaded.__init__(pol, None, np.random.default_rng(0))  # type: ignore[arg-type]
    live = list(nodes)
    for op, i in ops:
        n = nodes[i]
        if op == "choose" and live:
            got = pol.choose(0, live, 0.0)
            assert got is _scan(live)
            got.qlen += 1  # the scheduler submits to the chosen node
        elif op == "submit":
            n.qlen += 1
        elif op == "admit" and n.qlen:
            n.qlen -= 1
            n.running += 1
        elif op == "finish" and n.running:
            n.running -= 1
            n.unload()
        elif op == "abort":
            n.qlen = n.running = 0
            n.unload()
        elif op == "flip":
            n.up = not n.up
            live = [x for x in nodes if x.up]  # a new list, as the scheduler's cache makes


def test_a_whole_run_places_as_the_scan_would() -> None:
    sc = validate(
        {
            "name": "ll",
            "profile": "a100-80gb",
            "mode": "coupled",
            "deployments": [{"model": "llama-2-7b"}],
            "cluster": {"servers": 6, "param_servers": 1, "server": {"host": "16GiB", "nvme": 0}},
            "chunks": {"size": "16MiB"},
            "workload": {"kind": "poisson", "requests": 600, "rate": 40.0},
        }
    )
    from sim.cluster import build

    cl = build(sc, 3, load_catalogue(), load_profile(sc.profile), CostModel)
    pol = cl.scheduler.policy
    assert isinstance(pol, LeastLoaded)
    seen: list[int] = []
    choose = pol.choose

    def checked(model: int, nodes: list[Any], now: float) -> Any:
        got = choose(model, nodes, now)
        want = min(nodes, key=lambda n: (n.qlen + n.running, nodes.index(n)))
        assert got is want
        seen.append(got.qlen + got.running)
        return got

    pol.choose = checked  # type: ignore[method-assign]
    cl.run()
    assert len(seen) == 600 and max(seen) > 0  # loads were uneven at some choices
