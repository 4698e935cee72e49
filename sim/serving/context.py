"""Shared run state handed to every simulator component, and each deployed model's pricing.

:class:`ModelRt` is one deployed model prepared for the hot loop: its chunk table as plain
arrays, per-layer chunk ranges, the share of an iteration's compute each layer takes, and the
cost of an iteration (:meth:`ModelRt.iter_cost`: the cost model's price plus the serving
loop's gap). Chunk keys inside the simulator are ints ``model_index << 32 | chunk_id``
(compact and cheap to hash; equivalent to the tuple ``(model, chunk_id)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.scenario import Scenario
from sim.serving.iterprice import IterPricer
from sim.serving.metrics import Metrics, TraceRecorder
from sim.serving.recordedcost import RecordedCost

if TYPE_CHECKING:
    from engine.prefetch import HeatMap
    from sim.disagg.coordinator import Disagg
    from sim.rng import RngStreams
    from sim.serving.costmodel import CostModel
    from sim.serving.expertlayout import ExpertTable
    from sim.serving.network import Network
    from sim.serving.paramserver import MetadataDirectory, ParamServer
    from sim.serving.replica import ComputeNode


@dataclass
class ModelRt:
    """One deployed model, prepared for the hot loop (see the module docstring)."""

    idx: int
    name: str
    is_cnn: bool
    cost: CostModel
    layer_start: np.ndarray  # chunk ids of layer l: [layer_start[l], layer_start[l + 1])
    chunk_size: np.ndarray  # int64 bytes per chunk id
    chunk_head: np.ndarray  # int64 head group per chunk id (-1 with "layer" sharding)
    layer_frac: np.ndarray  # share of an iteration's compute spent in layer l (sums to 1)
    kv_bytes_per_token: int
    total_bytes: int
    max_context: int = 1 << 30  # longest sequence one node can hold (KV + attention scratch)
    #: with ``experts.enabled``: where the routed experts sit in the chunk ids (one chunk
    #: each; sim.serving.expertlayout), else None
    experts: ExpertTable | None = None
    n_layers: int = field(init=False)
    n_chunks: int = field(init=False)
    nonempty_layers: int = field(init=False)
    base: int = field(init=False)
    layer_chunks: list[int] = field(init=False)
    layer_bytes: list[int] = field(init=False)
    #: seconds of the first iteration after the replica sat idle (``CostModel.wake_s``; see
    #: sim.serving.turn) and whether it is charged (the hot loop's one check)
    wake_s: float = field(init=False)
    warm_on: bool = field(init=False)
    #: the cost model's ``iter_gap_s``: serving-loop seconds charged once per iteration
    iter_gap_s: float = field(init=False)
    #: the cost model's ``prefetch_compute_s_per_byte`` and ``prefetch_handoff_s``
    #: (sim.serving.fetchpath: a layer's compute grows by the bytes prefetched during it; a
    #: prefetch starts that long after it is planned)
    prefetch_s_per_byte: float = field(init=False)
    prefetch_handoff_s: float = field(init=False)
    #: the price of an iteration, built from ``cost.iteration`` (sim.serving.iterprice;
    #: rebuilt by ``dataclasses.replace``)
    pricer: IterPricer = field(init=False, repr=False)
    #: priced by a recording (sim.serving.recordedcost.RecordedCost): one iteration per
    #: scheduler step (no decode segments) and no memoised prices
    step_by_step: bool = field(init=False)

    def __post_init__(self) -> None:
        self.n_layers = int(self.layer_start.shape[0] - 1)
        self.n_chunks = int(self.chunk_size.shape[0])
        counts = np.diff(self.layer_start)
        self.layer_chunks = [int(c) for c in counts]
        self.nonempty_layers = int((counts > 0).sum())
        self.base = self.idx << 32
        cost = self.cost
        if cost.wake_s < 0 or cost.iter_gap_s < 0:
            raise ValueError(
                f"wake_s and iter_gap_s must be >= 0, got {cost.wake_s}, {cost.iter_gap_s}"
            )
        if cost.prefetch_compute_s_per_byte < 0 or cost.prefetch_handoff_s < 0:
            raise ValueError(
                "prefetch_compute_s_per_byte and prefetch_handoff_s must be >= 0, got "
                f"{cost.prefetch_compute_s_per_byte}, {cost.prefetch_handoff_s}"
            )
        self.wake_s = float(cost.wake_s)
        self.warm_on = self.wake_s > 0
        self.iter_gap_s = float(cost.iter_gap_s)
        self.prefetch_s_per_byte = float(cost.prefetch_compute_s_per_byte)
        self.prefetch_handoff_s = float(cost.prefetch_handoff_s)
        self.step_by_step = isinstance(cost.iteration, RecordedCost)
        self.pricer = IterPricer(
            cost.iteration, self.is_cnn, self.iter_gap_s, memo=not self.step_by_step
        )
        cs = np.concatenate([[0], np.cumsum(self.chunk_size)])
        self.layer_bytes = [
            int(cs[self.layer_start[i + 1]] - cs[self.layer_start[i]]) for i in range(self.n_layers)
        ]

    def key(self, chunk_id: int) -> int:
        return self.base | chunk_id

    def prefetch_s_per_byte_at(self, cache_bytes: int) -> float:
        """Compute seconds lost per prefetched byte on a replica whose HBM weight cache holds
        ``cache_bytes`` (:meth:`sim.serving.costmodel.CostModel.prefetch_s_per_byte_at`)."""
        return self.cost.prefetch_s_per_byte_at(cache_bytes)

    def iter_cost(
        self, prefill_tokens: int, prefill_sq: float, n_prompts: int, n_dec: int, ctx: float
    ) -> tuple[float, float, float]:
        """``(seconds, flops, bytes)`` of one iteration: the serving loop's ``iter_gap_s`` plus
        its compute -- ``prefill_tokens`` prompt tokens (chunks whose squared lengths plus twice
        length x prior context sum to ``prefill_sq``; ``n_prompts`` of them end their prompt and
        sample a token) and one decode step of ``n_dec`` sequences holding ``ctx`` context
        tokens in total; CNN models: one forward pass over ``n_prompts`` samples. ``flops`` and
        ``bytes`` are the replica's (model FLOPs and HBM bytes read, for MFU and MBU).

        Both run in ONE pass over the weights, priced by the cost model's ``iteration``
        (:class:`sim.serving.itercost.IterationCost`; an engine that runs a prefill part and a
        decode part says so in its op tables). Decode-only lookups are memoised by batch and
        total context, interpolated linearly between knots every
        :data:`sim.serving.iterprice.CTX_BUCKET` tokens -- exact
        wherever the cost is linear in context (the roofline is, between kinks)."""
        return self.pricer.iter_cost(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)

    def iter_time(
        self, prefill_tokens: int, prefill_sq: float, n_prompts: int, n_dec: int, ctx: float
    ) -> float:
        """Seconds of one iteration (:meth:`iter_cost`)."""
        return self.iter_cost(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)[0]


@dataclass
class SimContext:
    """Everything a component needs: environment, config, models, network, recorders."""

    env: simpy.Environment
    sc: Scenario
    models: list[ModelRt]
    network: Network
    metrics: Metrics
    trace: TraceRecorder
    rngs: RngStreams
    class_order: list[int]  # class indices, protected classes first
    protected: list[bool]  # per class index
    nodes: list[ComputeNode] = field(default_factory=list)
    servers: list[ParamServer] = field(default_factory=list)
    #: the chunk directory (a Raft-replicated one when faults are on); the cluster sets it
    #: right after building the context, before anything runs
    directory: MetadataDirectory = field(init=False)
    heat: HeatMap | None = None
    #: callback(rid) set by the cluster (closed loop)
    on_complete: Callable[[int], None] | None = None
    #: the coordinator of a disaggregated cluster
    disagg: Disagg | None = None
