"""The simulator's speed shortcuts keep their contracts: the scheduler's cached live-node list
follows every change of a node's ``up`` flag (``stop``/``start`` and faults' direct writes), and
the cluster's vectorised rejection mask equals the per-request rule it replaced."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster import Cluster, build
from sim.costmodel import CostModel, load_profile
from sim.models import load_catalogue
from sim.scenario import validate

SMALL: dict[str, Any] = {
    "name": "hot-paths",
    "deployments": [{"model": "llama-2-7b", "share": 0.5}, {"model": "resnet-50", "share": 0.5}],
    "cluster": {"nodes": 4, "param_servers": 2, "node": {"host": "16GiB", "max_batch": 8}},
    "chunks": {"size": "16MiB"},
    "workload": {
        "requests": 300,
        "rate": 50.0,
        "input_tokens": {"dist": "uniform", "low": 1, "high": 40000},
        "output_tokens": {"dist": "uniform", "low": 1, "high": 3000},
    },
}


def _build(patch: dict[str, Any] | None = None, seed: int = 0) -> Cluster:
    data = copy.deepcopy(SMALL)
    for k, v in (patch or {}).items():
        data[k] = v
    sc = validate(data)
    return build(sc, seed, load_catalogue(), load_profile(sc.profile), CostModel)


def _scalar_rejected(cl: Cluster, rid: int) -> bool:
    """The per-request rule (as it was written before the vectorised mask)."""
    ctx, wl = cl.ctx, cl.wl
    m = ctx.models[int(wl.model[rid])]
    tokens = int(wl.inp[rid]) + int(wl.out[rid])
    kv_need = ctx.nodes[0].kv.size(tokens, m.kv_bytes_per_token)[0]
    return tokens > m.max_context or kv_need > ctx.nodes[0].kv.capacity


def test_rejected_mask_equals_the_per_request_rule() -> None:
    # a tight HBM makes long requests exceed the KV capacity, so both outcomes occur
    cl = _build({"cluster": {**SMALL["cluster"], "node": {"host": "16GiB", "hbm": "24GiB"}}})
    mask = cl.rejected_mask()
    expect = np.array([_scalar_rejected(cl, r) for r in range(cl.wl.n)])
    assert mask.dtype == bool and mask.shape == (cl.wl.n,)
    assert mask.any() and not mask.all()
    assert np.array_equal(mask, expect)


@settings(max_examples=30)
@given(flips=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["stop", "start", "set"]))))
def test_live_nodes_cache_follows_every_up_change(flips: list[tuple[int, str]]) -> None:
    cl = _build()
    nodes, sch = cl.ctx.nodes, cl.scheduler
    assert sch.live_nodes() == nodes
    for i, how in flips:
        before = sch.live_nodes()
        if how == "stop":
            nodes[i].stop()
        elif how == "start":
            nodes[i].up = True  # what start() does first, without starting a process
        else:
            nodes[i].up = not nodes[i].up  # faults write the flag directly
        live = sch.live_nodes()
        assert live == [n for n in nodes if n.up]
        assert live is sch.live_nodes()  # cached until the next change
        if live != before:
            assert live is not before  # a returned list is never changed in place
