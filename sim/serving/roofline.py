"""The roofline implementation of the iteration cost, built from a profile and a model.

:func:`roofline_pass` turns a :class:`sim.serving.costmodel.Profile` and a
:class:`sim.serving.models.ModelSpec` into a :class:`sim.serving.iterprice.RooflinePass`: the
model's layers grouped by kind (FLOPs per token and weight bytes per TP rank, attention,
lookup table, LM head) with the profile's achieved FLOP/s, HBM bandwidth, per-layer and
per-pass overheads and the link the replica's collectives use. The pass prices a whole fused,
tensor/pipeline-parallel iteration (:class:`sim.serving.itercost.IterationCost`).

:func:`layer_shares` is each layer's share of one token's pass (what a replica's weight
fetches overlap with, layer by layer). Pure functions: no I/O, no state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.serving.iterprice import RooflinePass

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.models import ModelSpec


def peak_flops(profile: Profile, model: ModelSpec) -> float:
    """Achieved FLOP/s of ``model``'s weights on ``profile``'s GPU: ``flops_fp16`` for weights
    of at most 2 bytes, ``flops_fp32`` otherwise, times ``compute_efficiency``."""
    gpu = profile.gpu
    peak = gpu.flops_fp16 if model.dtype_bytes <= 2 else gpu.flops_fp32
    return float(peak * gpu.compute_efficiency)


def _layer_flops(model: ModelSpec) -> np.ndarray:
    """FLOPs per token of each layer (per sample for a CNN)."""
    is_cnn = model.kind == "cnn"
    return np.array(
        [ly.flops_per_sample if is_cnn else ly.flops_per_token for ly in model.layers],
        dtype=np.float64,
    )


def roofline_pass(
    profile: Profile, model: ModelSpec, tp: int = 1, pp: int = 1, gpus_per_server: int = 1
) -> RooflinePass:
    """The roofline price of one iteration of ``model`` on a ``tp`` x ``pp`` replica.

    A replica wider than ``gpus_per_server`` runs its collectives over the NIC (``rdma``),
    else over NVLink. Layers of one kind (same FLOPs, bytes, attention, lookup, LM head) form
    one group with a multiplicity, so a pass costs one term per kind. A decoder layer without
    FLOPs is a lookup table (an embedding): a token reads one row of it. KV heads are split
    over TP ranks, and replicated when there are more ranks than KV heads; activations travel
    in 16 bits unless the weights are wider. Raises ValueError for ``tp``, ``pp`` or
    ``gpus_per_server`` below 1."""
    if tp < 1 or pp < 1 or gpus_per_server < 1:
        raise ValueError(f"tp, pp, gpus_per_server must be >= 1, got {tp}, {pp}, {gpus_per_server}")
    gpu = profile.gpu
    link = profile.links.nvlink if tp * pp <= gpus_per_server else profile.links.rdma
    flops = _layer_flops(model)
    is_cnn = model.kind == "cnn"
    fsig: dict[tuple[float, float, bool, bool, bool], int] = {}
    for i, ly in enumerate(model.layers):
        key = (
            float(flops[i]) / tp,
            float(ly.param_bytes) / tp,
            bool(ly.attention),
            bool(flops[i] == 0 and not is_cnn),
            ly.name == "lm_head",
        )
        fsig[key] = fsig.get(key, 0) + 1
    n_attn = max(1, model.n_attention_layers)
    return RooflinePass(
        [(*k, c) for k, c in fsig.items()],
        tp=tp,
        pp=pp,
        flop_rate=peak_flops(profile, model),
        hbm_bandwidth=gpu.hbm_bandwidth,
        overhead=gpu.per_layer_overhead_s,
        launch=gpu.kernel_launch_s,
        attn_flops_per_ctx=4.0 * model.heads * model.head_dim,
        kv_bytes_per_token_layer=model.kv_bytes_per_token / n_attn,
        kv_replication=max(1, tp // max(model.kv_heads, 1)) if model.kv_heads else 1,
        hidden=model.hidden,
        dtype_bytes=model.dtype_bytes,
        act_bytes=max(2, model.dtype_bytes),
        n_allreduce=2 * model.n_attention_layers + 1,  # attention + MLP per layer, embedding
        link=(link.latency, link.bandwidth),
    )


def layer_shares(profile: Profile, model: ModelSpec) -> np.ndarray:
    """Each layer's share of one token's roofline pass (sums to 1; equal shares when the
    pass costs nothing): ``max(flops / rate, bytes / hbm_bandwidth) + per_layer_overhead``
    per layer, where a lookup layer reads one row."""
    flops = _layer_flops(model)
    nbytes = np.array([ly.param_bytes for ly in model.layers], dtype=np.float64)
    if model.kind != "cnn":
        row = float(model.hidden * model.dtype_bytes)
        nbytes = np.where(flops == 0, np.minimum(nbytes, row), nbytes)
    rate, bw = peak_flops(profile, model), profile.gpu.hbm_bandwidth
    lt = np.maximum(flops / rate, nbytes / bw) + profile.gpu.per_layer_overhead_s
    total = float(lt.sum())
    if total > 0:
        return np.asarray(lt / total, dtype=np.float64)
    return np.full(len(lt), 1.0 / len(lt))
