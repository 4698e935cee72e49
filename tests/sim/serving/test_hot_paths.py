"""The simulator's speed shortcuts keep their contracts: the scheduler's cached live-node list
follows every change of a node's ``up`` flag (``stop``/``start`` and faults' direct writes),
the cluster's vectorised rejection mask equals the per-request rule it replaced, and the
memoised decode-cost table charges what the cost model says."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster import Cluster, build
from sim.scenario import validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.itercost import iteration_seconds
from sim.serving.models import load_catalogue

SMALL: dict[str, Any] = {
    "name": "hot-paths",
    "deployments": [{"model": "llama-2-7b", "share": 0.5}, {"model": "resnet-50", "share": 0.5}],
    "cluster": {
        "servers": 4,
        "param_servers": 2,
        "server": {"host": "16GiB"},
        "replica": {"max_num_seqs": 8},
    },
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
    cl = _build(
        {"cluster": {**SMALL["cluster"], "gpu": {"hbm": "24GiB"}, "server": {"host": "16GiB"}}}
    )
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


class _LinearWork:
    """A decode cost linear in the batch's context (what the interpolation must be exact for)."""

    tp = pp = 1

    def work(
        self, prefill_tokens: int, prefill_sq: float, n_prompts: int, n_dec: int, ctx: float
    ) -> tuple[float, float, float, float]:
        return 1e-5 * prefill_tokens + 1e-3 + 2e-4 * n_dec + 3e-7 * ctx, 0.0, 0.0, 0.0

    def breakdown(self, *args: Any) -> list[tuple[str, float, str]]:
        return [("all", self.work(*args)[0], "stub")]


class _LinearCost:
    """A cost model whose iteration is :class:`_LinearWork`, with no serving-loop terms."""

    iteration = _LinearWork()
    wake_s = iter_gap_s = prefetch_compute_s_per_byte = prefetch_handoff_s = 0.0


def _decode_s(cost: Any, batch: int, ctx: float) -> float:
    return iteration_seconds(cost.iteration, 0, 0.0, 0, batch, ctx)


@settings(max_examples=60)
@given(
    batch=st.integers(1, 64),
    ctx=st.one_of(st.integers(0, 200_000), st.floats(0.0, 200_000.0)),
)
def test_decode_table_charges_the_cost_model(batch: int, ctx: float) -> None:
    m = _build().ctx.models[0]  # llama-2-7b with the roofline CostModel
    lin = dataclasses.replace(m, cost=_LinearCost())
    # exact where the cost is linear in context, at any context (a segment's mean is a float)
    want_lin = _decode_s(_LinearCost(), batch, ctx)
    assert lin.iter_time(0, 0.0, 0, batch, ctx) == pytest.approx(want_lin, rel=1e-12)
    # the roofline is linear between its kinks: within a fraction of a percent everywhere
    want = _decode_s(m.cost, batch, int(ctx))
    assert m.iter_time(0, 0.0, 0, batch, int(ctx)) == pytest.approx(want, rel=2e-3)


def test_decode_table_never_undercharges_the_roofline() -> None:
    # rounding the context down to a knot undercharged every step, by half an interval's
    # attention on average; interpolating a convex cost (a max of affine terms) never does
    m = _build().ctx.models[0]
    for batch in (1, 8, 64):
        got = np.array([m.iter_time(0, 0.0, 0, batch, c) for c in range(0, 8192, 7)])
        want = np.array([_decode_s(m.cost, batch, c) for c in range(0, 8192, 7)])
        assert np.all(got >= want * (1 - 1e-12))
        assert np.max(got / want - 1) < 2e-3
