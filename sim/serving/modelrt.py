"""The runtime tables of one deployed model (:class:`sim.serving.context.ModelRt`).

:func:`model_rt` turns a model spec and a validated, feasible scenario into what a replica
reads on its hot path: the chunk layout of the weights (the engine's chunker, or one chunk
per layer in coupled mode), each layer's share of one token's roofline pass,
and the longest context the KV budget allows. Pure: no simulation state, no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.chunks import chunk_model
from sim.scenario import Scenario, deployment_labels
from sim.serving.context import ModelRt
from sim.serving.expertlayout import ExpertTable, expert_layout
from sim.serving.gpumemory import context_limit
from sim.serving.roofline import layer_shares


def model_rt(
    i: int, spec: Any, sc: Scenario, profile: Any, cost_cls: Any, kv_budget: int
) -> ModelRt:
    """The runtime tables of deployment ``i`` (model ``spec``): its cost model, where each
    layer's chunks start in the chunk arrays, the chunk sizes and tensor-parallel heads, each
    layer's share of the iteration time, KV bytes per token and the longest context
    ``kv_budget`` bytes of KV allow. Coupled mode: one chunk per layer (weights are resident).
    ``experts.enabled`` (pd mode, a model with experts): one chunk per routed expert
    (:func:`sim.serving.expertlayout.expert_layout`)."""
    c = sc.cluster
    ep = {"ep": c.ep} if c.ep > 1 else {}  # only expert models take ep > 1 (feasible.py)
    cost = cost_cls(profile, spec, tp=c.tp, pp=c.pp, gpus_per_server=c.gpus_per_server, **ep)
    experts: ExpertTable | None = None
    if sc.mode == "pd" and sc.experts.enabled and spec.n_experts:
        starts, chunk_size, chunk_head, experts = expert_layout(spec)
        total = int(chunk_size.sum())
    elif sc.mode == "coupled":
        # weights stay resident and are never streamed: one chunk per layer (a 70B model in
        # 4 MiB chunks would be 34k cache entries per replica for nothing)
        sizes = np.array(spec.layer_bytes(), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes > 0)]).astype(np.int64)
        chunk_size = sizes[sizes > 0]
        chunk_head = np.full(chunk_size.shape, -1, dtype=np.int64)
        total = int(sizes.sum())
    else:
        table = chunk_model(
            spec.name,
            spec.layer_bytes(),
            sc.chunks.size,
            sc.deployments[i].version,
            sc.chunks.sharding,
            heads=max(spec.heads, 1),
        )
        starts = np.zeros(table.n_layers + 1, dtype=np.int64)
        for layer in range(table.n_layers):
            starts[layer + 1] = table.layer_slice(layer).stop
        chunk_size, chunk_head = table.size.astype(np.int64), table.head.astype(np.int64)
        total = table.total_bytes
    frac = layer_shares(profile, spec)
    max_ctx = context_limit(sc, spec, kv_budget)  # storage + attention memory, R12
    label = deployment_labels(sc.deployments)[i]
    return ModelRt(
        idx=i,
        name=label,
        is_cnn=spec.kind == "cnn",
        cost=cost,
        layer_start=starts,
        chunk_size=chunk_size,
        chunk_head=chunk_head,
        layer_frac=frac,
        kv_bytes_per_token=int(spec.kv_bytes_per_token),
        total_bytes=total,
        max_context=max_ctx,
        experts=experts,
    )
