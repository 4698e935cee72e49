"""The chunk layout of a model whose routed experts are parameter chunks, and the HBM weight
cache an expert budget asks for.

:func:`expert_layout` makes a layer's dense weights (attention, norms, router, shared experts;
the embedding and the head) ONE chunk and appends ONE chunk per routed expert, in expert order,
so a layer's chunks stay one contiguous id range (what the weight store's per-layer counters
assume) and expert ``e`` of expert layer ``j`` is chunk ``ExpertTable.first[j] + e``. The
cache unit is the expert, as in expert-offloading servers, whatever ``chunks.size`` says; the
dense chunks stay pinned once loaded (:mod:`sim.serving.expertpath`), so how they are cut
changes no decision, and one per layer keeps the pinned set small (an admission sums the pinned
bytes and LRU skips pinned keys).

:func:`expert_cache_bytes` sizes a replica's HBM weight cache from ``experts.hbm_budget``:
the dense weights of every deployed model plus ``floor(budget x experts)`` whole experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.errors import InputError
from sim.scenario import Scenario
from sim.serving.models import ModelSpec


@dataclass(frozen=True)
class ExpertTable:
    """Where the experts of one deployed model sit in its chunk ids (module docstring).

    Expert layers are numbered ``0 .. len(layers) - 1`` in execution order."""

    layers: tuple[int, ...]
    """Execution-layer index of each expert layer."""
    blocks: tuple[int, ...]
    """Block number (index among the attention layers) of each expert layer."""
    first: tuple[int, ...]
    """Chunk id of expert 0 of each expert layer."""
    n_experts: tuple[int, ...]
    """Routed experts of each expert layer."""
    expert_bytes: tuple[int, ...]
    """Bytes of one routed expert of each expert layer."""
    top_k: int
    """Routed experts each token runs per expert layer."""
    of_layer: tuple[int, ...]
    """Per execution layer: its expert-layer number, -1 for a layer without experts."""

    @property
    def total_experts(self) -> int:
        """Routed experts of all expert layers."""
        return sum(self.n_experts)

    @property
    def total_expert_bytes(self) -> int:
        """Bytes of all routed experts."""
        return sum(n * b for n, b in zip(self.n_experts, self.expert_bytes, strict=True))


def dense_bytes(spec: ModelSpec) -> int:
    """Weight bytes of ``spec`` outside its routed experts."""
    return sum(ly.param_bytes - ly.experts * ly.expert_bytes for ly in spec.layers)


def expert_layout(spec: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, ExpertTable]:
    """``(layer_start, chunk_size, chunk_head, table)`` of ``spec`` with one chunk per layer's
    dense weights and one per routed expert (module docstring); ``chunk_head`` is all -1."""
    starts = [0]
    sizes: list[int] = []
    layers: list[int] = []
    blocks: list[int] = []
    first: list[int] = []
    n_exp: list[int] = []
    e_bytes: list[int] = []
    of_layer: list[int] = []
    block = -1
    for li, ly in enumerate(spec.layers):
        block += int(ly.attention)
        dense = ly.param_bytes - ly.experts * ly.expert_bytes
        if dense > 0:
            sizes.append(dense)
        if ly.experts:
            of_layer.append(len(layers))
            layers.append(li)
            blocks.append(block)
            first.append(len(sizes))
            n_exp.append(ly.experts)
            e_bytes.append(ly.expert_bytes)
            sizes.extend([ly.expert_bytes] * ly.experts)
        else:
            of_layer.append(-1)
        starts.append(len(sizes))
    et = ExpertTable(
        layers=tuple(layers),
        blocks=tuple(blocks),
        first=tuple(first),
        n_experts=tuple(n_exp),
        expert_bytes=tuple(e_bytes),
        top_k=spec.top_k,
        of_layer=tuple(of_layer),
    )
    return (
        np.asarray(starts, dtype=np.int64),
        np.asarray(sizes, dtype=np.int64),
        np.full(len(sizes), -1, dtype=np.int64),
        et,
    )


def budget_experts(spec: ModelSpec, budget: float) -> int:
    """Whole routed experts a budget of ``budget`` (a share of all of them) holds."""
    total = sum(ly.experts for ly in spec.layers)
    return math.floor(budget * total + 1e-9)


def expert_cache_bytes(sc: Scenario, specs: list[ModelSpec], weight_cache: int) -> int:
    """A replica's HBM weight cache under ``experts``: ``weight_cache`` (the memory plan's)
    without ``hbm_budget``; else the dense bytes of every model plus its budgeted whole
    experts. Raises :class:`InputError` (field ``experts.hbm_budget``) when that exceeds
    ``weight_cache`` or holds fewer experts than one layer has (a prefill that routes to all
    of them pins them all while the layer computes)."""
    budget = sc.experts.hbm_budget
    if budget is None:
        return weight_cache
    need = 0
    for s in specs:
        per_expert = s.expert_bytes
        n = budget_experts(s, budget)
        widest = max((ly.experts for ly in s.layers), default=0)
        if s.n_experts and n < widest:
            raise InputError(
                f"{budget} of {s.name}'s experts is {n} experts; the cache needs at least one "
                f"layer's worth ({widest}); allowed: hbm_budget >= "
                f"{widest / max(sum(ly.experts for ly in s.layers), 1):.4f}",
                source=sc.source,
                where="experts.hbm_budget",
            )
        need += dense_bytes(s) + n * per_expert
    if need > weight_cache:
        raise InputError(
            f"the budget needs a {need / 2**30:.1f} GiB HBM weight cache but a replica has "
            f"{weight_cache / 2**30:.1f} GiB (cluster.gpu.weight_cache_fraction); lower "
            "hbm_budget or raise the fraction",
            source=sc.source,
            where="experts.hbm_budget",
        )
    return need


def check_experts(sc: Scenario, specs: list[ModelSpec], weight_cache: int) -> None:
    """``experts.enabled`` is possible: ``mode: pd``, no disaggregation, no autoscaler, ``cluster.ep`` 1, a deployed model with
    routed experts, and a budget that fits (:func:`expert_cache_bytes`); else
    :class:`InputError` naming the field."""
    if sc.mode != "pd":
        raise InputError(
            "experts as chunks need mode: pd (coupled mode keeps every weight resident)",
            source=sc.source,
            where="experts.enabled",
        )
    if sc.disaggregation.enabled:
        raise InputError(
            "experts as chunks are not modelled with disaggregation.enabled; allowed: false",
            source=sc.source,
            where="experts.enabled",
        )
    if sc.cluster.ep > 1:
        raise InputError(
            "experts as chunks are not modelled with expert parallelism (every replica caches "
            "every expert); allowed: cluster.ep = 1",
            source=sc.source,
            where="experts.enabled",
        )
    if sc.autoscale.enabled:
        raise InputError(
            "experts as chunks are not modelled with autoscale.enabled (a replica added at run "
            "time has no expert router); allowed: false",
            source=sc.source,
            where="experts.enabled",
        )
    if not any(s.n_experts for s in specs):
        raise InputError(
            f"no deployed model has routed experts ({', '.join(s.name for s in specs)}); "
            "deploy a mixture-of-experts model or set experts.enabled: false",
            source=sc.source,
            where="experts.enabled",
        )
    expert_cache_bytes(sc, specs, weight_cache)
