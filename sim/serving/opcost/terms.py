"""The scalar terms of a profile's ``ops`` section: the roofline's efficiencies and floors
(:class:`RooflineTerms`), a serving framework's overheads (:class:`FrameworkTerms`) and the
terms `pdsim calibrate` fits for the engine (:class:`EngineTerms`); and :class:`Strict`, the
base of every model of that section (unknown keys refused, frozen, numbers checked).
Units: seconds, bytes, and dimensionless factors, as each field says."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.limits import CheckedModel


def ascending(values: Sequence[float]) -> bool:
    """Whether ``values`` is non-empty, positive and strictly ascending."""
    return bool(values) and values[0] > 0 and all(b > a for a, b in itertools.pairwise(values))


class Strict(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A model of the ``ops`` section: unknown keys refused, frozen, numbers checked."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class RooflineTerms(Strict):
    """Efficiencies and floors used for any op no table covers. A roofline op costs
    ``max(flops / (peak * compute_eff), bytes / (hbm_bandwidth * memory_efficiency)) +
    op_floor_s``; peak and bandwidth come from the profile's `gpu` section."""

    gemm_efficiency: float = Field(default=0.7, gt=0, le=1)
    """Achieved / peak dense FLOP/s of a large GEMM, in (0, 1]."""
    attention_efficiency: float = Field(default=0.5, gt=0, le=1)
    """Achieved / peak FLOP/s of attention kernels, in (0, 1]."""
    memory_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved / peak HBM bandwidth of streaming kernels, in (0, 1]."""
    op_floor_s: float = Field(default=3e-6, ge=0)
    """Fixed seconds per kernel (launch and tail), added to every roofline op."""
    link_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved / nominal NVLink bandwidth of a ring all-reduce, in (0, 1]."""
    fused: list[Literal["rope", "embedding_allreduce"]] = Field(default_factory=list)
    """Ops the serving engine fuses into a neighbour (charged 0 s): `rope`, `embedding_allreduce`."""
    iteration_overhead_s: float = Field(default=0.0, ge=0)
    """Seconds of scheduling/launch work per iteration outside the ops (engine-specific)."""


class FrameworkTerms(Strict):
    """What the serving framework (vLLM, SGLang, pdsim's engine) spends outside the kernels
    on the engine loop's critical path, beyond ``ops.roofline.iteration_overhead_s`` (its
    scheduling and launch time per iteration): per request admitted and per token sampled.
    Each term is charged as an op of the iteration (:mod:`sim.serving.opcost.iteration`:
    `admission`, `token_output`), so `pdsim cost` and every plan see it. ``origin`` says
    where the figures come from, this section's and the iteration overhead's."""

    origin: str = Field(min_length=1)
    """Provenance of the figures (publication, version, workload, how derived), including
    `ops.roofline.iteration_overhead_s`."""
    admission_s: float = Field(default=0.0, ge=0)
    """Seconds per request admitted (request state, KV-block allocation, prefix hashing),
    charged in the iteration in which its prefill completes; seconds per request."""
    token_output_s: float = Field(default=0.0, ge=0)
    """Seconds per token sampled in the iteration (each completed prompt's first token and
    each decode's): per-sequence scheduling, output bookkeeping, stop checks, and
    detokenisation where it runs in the engine loop; seconds per token."""


class EngineTerms(Strict):
    """How one serving engine runs an iteration, beyond its kernels: fitted by `pdsim
    calibrate` on whole engine iterations (measured op tables held fixed), each with its unit.
    Absent: a fused vLLM-style iteration with no extra terms."""

    fused_iterations: bool = True
    """`true`: prefill chunks and decodes of an iteration run as one pass of GEMMs (vLLM,
    SGLang); `false`: each layer runs a prefill part and a decode part (pdsim's own engine),
    so the ops are priced twice, once per part."""
    split_projections: bool = False
    """`false`: one qkv GEMM and one gate_up GEMM per layer (vLLM's merged weights);
    `true`: q, k and v, and gate and up, are separate GEMMs (pdsim's own engine), each
    priced at its own shape."""
    layer_overhead_s: float = Field(default=0.0, ge=0)
    """Seconds per layer and per part of an iteration outside the timed ops (interpreter
    dispatch, temporaries); seconds. `pdsim calibrate` leaves it 0 and fits the engine's
    overhead per iteration (`ops.roofline.iteration_overhead_s`): its probe iterations all
    run the same layers, so a per-layer share cannot be told apart."""
    iter_gap_s: float = Field(default=0.0, ge=0)
    """Seconds the serving loop spends between two back-to-back iterations (scheduling,
    bookkeeping), measured from the engine's iteration log; seconds."""
    wake_s: float = Field(default=0.0, ge=0)
    """Extra seconds of the first iteration after the engine sat idle (cold caches), fitted
    on the calibration's open-loop runs; seconds."""
    copy_contention: float = Field(default=0.0, ge=0, le=4)
    """How much slower the engine's weight copies run while it computes than the idle
    host->device link (copy thread and compute sharing cores and memory): the simulator
    moves weights at `links.pcie.bandwidth / (1 + copy_contention)`; measured as the link's
    rate over the copy thread's achieved rate, less 1; dimensionless, 0: no contention."""
    prefetch_compute_s_per_byte: float = Field(default=0.0, ge=0)
    """Seconds of compute the engine loses per byte its copy thread prefetches while it
    computes (the copy's interpreter work and memory traffic take turns with the ops): the
    simulator adds it, times the bytes prefetched at a layer, to that layer's compute;
    measured on the calibration's streaming runs as their iterations' seconds less
    parameter wait, less their resident twins' seconds per priced second times the same
    price, over the bytes prefetched; s/B, 0: copies cost the compute nothing."""
    copy_contention_knots: list[tuple[float, float]] = Field(default_factory=list)
    """`copy_contention` per size of the device weight cache: `[cache bytes, contention]`
    pairs, cache bytes strictly ascending and > 0, contention in [0, 4]; the simulator
    interpolates linearly in a replica's weight cache (clamped to the end knots) and uses it
    in place of the single figure. Measured like it, per cache size of the calibration's
    streaming runs (the copy thread's rate depends on whether the engine's memory fits the
    last-level cache); empty: the single figure everywhere."""
    prefetch_compute_knots: list[tuple[float, float]] = Field(default_factory=list)
    """`prefetch_compute_s_per_byte` per size of the device weight cache: `[cache bytes,
    s/B]` pairs, cache bytes strictly ascending and > 0, s/B >= 0; the simulator
    interpolates linearly in a replica's weight cache (clamped to the end knots) and uses it
    in place of the single figure. Measured like it, on the calibration's streaming runs at
    each cache size (on the 2-core VM a prefetched byte cost the compute 2-3x more with 80%
    of the weights resident than with 45%: the engine's memory filling the last-level
    cache); empty: the single figure everywhere."""
    prompt_overhead_s_per_token: float = Field(default=0.0, ge=0)
    """Seconds a prompt token in the iteration costs the engine beyond the op tables' price
    and `ops.roofline.iteration_overhead_s`: large prefill ops leave the caches cold for the
    engine's own interpreter work after them (weight pins, prefetch planning, bookkeeping; on
    the 2-core VM 2-3x slower after a 496-token prefill than after a decode), and the
    prompt's ops run slower inside the serving loop than in the probes that time the tables;
    the simulator adds it, times the iteration's prompt tokens, to the iteration (op
    `prompt_overhead`); measured as the least-squares slope, through the origin and on
    relative error, of the calibration's prompt-carrying iterations' seconds less their
    op-table price and the iteration overhead, over their prompt tokens; s/token, 0: none."""
    prefetch_handoff_s: float = Field(default=0.0, ge=0)
    """Seconds from a prefetch being planned to its copy starting (the copy thread waking
    and taking its turn): the simulator starts each prefetch this much later; measured as
    the mean, over the calibration's prefetch jobs, of (time from planned, or from the
    previous job's end, to landed) less the job's bytes at the copy thread's own rate;
    seconds."""

    @model_validator(mode="after")
    def _knots(self) -> EngineTerms:
        for name, top in (("prefetch_compute_knots", None), ("copy_contention_knots", 4.0)):
            knots: list[tuple[float, float]] = getattr(self, name)
            xs = [x for x, _ in knots]
            if xs and not ascending(xs):
                raise ValueError(f"{name}: cache bytes must be > 0 and strictly ascending")
            if any(y < 0 or (top is not None and y > top) for _, y in knots):
                limit = f"in [0, {top:g}]" if top is not None else ">= 0"
                raise ValueError(f"{name}: values must be {limit}")
        return self

    def prefetch_per_byte(self, cache_bytes: float) -> float:
        """Seconds of compute lost per prefetched byte on a replica whose device weight cache
        holds ``cache_bytes``: the knots interpolated (clamped), else the single figure."""
        return _at(self.prefetch_compute_knots, cache_bytes, self.prefetch_compute_s_per_byte)

    def copy_contention_at(self, cache_bytes: float) -> float:
        """The copy contention of a replica whose device weight cache holds ``cache_bytes``:
        the knots interpolated (clamped), else the single figure."""
        return _at(self.copy_contention_knots, cache_bytes, self.copy_contention)


def _at(knots: Sequence[tuple[float, float]], x: float, default: float) -> float:
    """``knots`` (ascending x) interpolated linearly at ``x``, clamped to the end knots;
    ``default`` when there are none."""
    if not knots:
        return default
    return float(np.interp(x, [k[0] for k in knots], [k[1] for k in knots]))
