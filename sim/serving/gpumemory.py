"""How one replica's GPUs split their memory: weights, activation workspace, KV.

Per GPU (every GPU alike): the budget is ``usable HBM x memory_utilization`` (vLLM's
``gpu_memory_utilization``). The **activation workspace** comes off first; it is sized by the
token budget, as a server sizes it by profiling a forward pass of ``max_num_batched_tokens``:

    workspace = tokens x (4 + 8 / tp) x hidden x act_bytes  +  max_num_seqs x vocab / tp x 4

(the residual stream and norms are not split by TP; attention and MLP intermediates, about
8 hidden-widths for a LLaMA-style MLP, are; the logits are fp32 over the vocabulary shard).
Then **weights**: ``coupled`` mode keeps the model resident, ``param_bytes / (tp * pp)`` per
GPU, the routed experts of a mixture-of-experts model over ``max(tp, ep) * pp`` GPUs
(:func:`weights_per_gpu`); ``pd`` mode gives ``weight_cache_fraction`` of what is left to the streamed-weight cache.
The rest holds **KV blocks**. With more TP ranks than KV heads each rank keeps a copy of its
KV head (MLA caches one latent for every head: each rank keeps all of it), so a replica's KV capacity in the model's own bytes-per-token is
``gpus * kv_per_gpu / kv_replication``.

A replica's weight cache and KV capacity are the sums over its GPUs, in the model's own
bytes (a chunk of a TP replica is split over the ranks; the sum is what the replica holds).

The **longest context** a replica can hold (:func:`context_limit`, R12) is the largest ``L``
whose KV storage (``kv.storage``: paged blocks, 512-token chunks, or one contiguous buffer
regrown by ``kv.regrowth``, :class:`engine.kv.footprint.KvStorageModel`) plus the attention
working memory (``kv.attention``, :class:`engine.kv.longctx.AttentionMemoryModel`) fits the
replica's KV capacity, capped by the model's context window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.errors import InputError
from engine.kv.footprint import KvStorageModel
from engine.kv.longctx import AttentionMemoryModel
from sim.scenario import Scenario
from sim.serving.models import ModelSpec

#: activation widths per token held at once that TP does not split / does split
SHARED_WIDTHS = 4
SPLIT_WIDTHS = 8
LOGIT_BYTES = 4


def vocab_of(spec: ModelSpec) -> int:
    """The vocabulary size, from the LM head's FLOPs (``2 * vocab * hidden`` per token)."""
    for layer in spec.layers:
        if layer.name == "lm_head" and spec.hidden:
            return round(layer.flops_per_token / (2 * spec.hidden))
    return 0


def workspace_bytes(spec: ModelSpec, tokens: int, seqs: int, tp: int) -> int:
    """Activation workspace of one GPU (see the module docstring); 0 for CNNs."""
    if spec.kind != "decoder":
        return 0
    act = max(2, spec.dtype_bytes)
    per_tok = (SHARED_WIDTHS + SPLIT_WIDTHS / tp) * spec.hidden * act
    return int(tokens * per_tok + seqs * vocab_of(spec) / tp * LOGIT_BYTES)


def expert_bytes_total(spec: ModelSpec) -> int:
    """Bytes of every routed expert of every layer (0 for a dense model)."""
    return sum(ly.experts * ly.expert_bytes for ly in spec.layers)


def weights_per_gpu(specs: Sequence[ModelSpec], tp: int, pp: int = 1, ep: int = 1) -> int:
    """Resident weight bytes of one GPU of a ``tp`` x ``pp`` replica serving ``specs`` whose
    routed experts are sharded over ``ep`` GPUs: the non-expert weights over ``tp * pp``, the
    experts over ``max(tp, ep) * pp`` (``ep <= tp``: every GPU of the replica holds ``1 / tp``
    of them whatever the split; ``ep > tp``: ``1 / ep``, the rest on the data-parallel
    peers). Dense models: ``ceil(param_bytes / (tp * pp))`` of all of them together."""
    experts = sum(expert_bytes_total(s) for s in specs)
    dense = sum(s.param_bytes for s in specs) - experts
    return -(-dense // (tp * pp)) + -(-experts // (max(tp, ep) * pp))


@dataclass(frozen=True)
class ReplicaMemory:
    """One replica's memory plan (bytes). ``*_gpu`` are per GPU; ``weight_cache`` and ``kv``
    are the replica's, in the model's own bytes."""

    budget_gpu: int
    workspace_gpu: int
    weights_gpu: int
    kv_gpu: int
    weight_cache: int
    kv: int


@dataclass(frozen=True)
class ReplicaShape:
    """What a replica's memory plan depends on besides its models and GPUs: parallelism,
    the budget's share of HBM, the activation workspace (given, or ``None``: sized by the
    token budget ``tokens`` and ``seqs`` sequences), and the weights' mode (``coupled``:
    resident; else ``pd`` with ``weight_cache_fraction`` of the rest as weight cache)."""

    tp: int
    pp: int
    memory_utilization: float
    workspace: int | None
    tokens: int
    seqs: int
    coupled: bool
    weight_cache_fraction: float
    chunk_size: int
    ep: int = 1
    """expert parallelism: experts spread over ``max(tp, ep)`` GPUs per stage"""

    @classmethod
    def of(cls, sc: Scenario) -> ReplicaShape:
        """The shape of a replica of scenario ``sc``."""
        c = sc.cluster
        return cls(
            tp=c.tp,
            pp=c.pp,
            memory_utilization=c.gpu.memory_utilization,
            workspace=c.gpu.workspace,
            tokens=c.replica.max_num_batched_tokens,
            seqs=c.replica.max_num_seqs,
            coupled=sc.mode == "coupled",
            weight_cache_fraction=c.gpu.weight_cache_fraction,
            chunk_size=sc.chunks.size,
            ep=c.ep,
        )


#: where a plan that does not fit points: the scenario's fields (``pdsim cost`` names its
#: own options instead); keys ``tokens`` (the workspace) and ``tp`` (the weights)
SCENARIO_FIELDS: Mapping[str, str] = {
    "tokens": "cluster.replica.max_num_batched_tokens",
    "tp": "cluster.tp",
}


def plan_memory(sc: Scenario, specs: list[ModelSpec], hbm: int, profile_name: str) -> ReplicaMemory:
    """The memory plan of a replica of ``sc`` serving ``specs`` on GPUs of ``hbm`` usable
    bytes; :class:`InputError` (naming the field, with the numbers) when it cannot fit."""
    return plan_replica(ReplicaShape.of(sc), specs, hbm, profile_name, sc.source, SCENARIO_FIELDS)


def plan_replica(
    shape: ReplicaShape,
    specs: list[ModelSpec],
    hbm: int,
    profile_name: str,
    source: str | None = None,
    where: Mapping[str, str] = SCENARIO_FIELDS,
) -> ReplicaMemory:
    """The memory plan (module docstring) of a replica of ``shape`` serving ``specs`` on GPUs
    of ``hbm`` usable bytes; :class:`InputError` with the numbers when the workspace or the
    weights do not fit, pointing at ``source`` and ``where[\"tokens\"]`` or ``where[\"tp\"]``."""
    tp, pp = shape.tp, shape.pp
    g = tp * pp
    util = shape.memory_utilization
    budget = int(hbm * util)
    if shape.workspace is not None:
        ws = shape.workspace
    else:
        ws = max(workspace_bytes(s, shape.tokens, shape.seqs, tp) for s in specs)
    free = budget - ws
    if free <= 0:
        raise InputError(
            f"the activation workspace for {shape.tokens:,} batched tokens needs "
            f"{ws / 1e9:.1f} GB per GPU but a {profile_name} GPU has {budget / 1e9:.1f} GB "
            f"(hbm {hbm / 1e9:.1f} GB x memory_utilization {util}); "
            "lower the token budget or raise tp",
            source=source,
            where=where["tokens"],
        )
    total = sum(s.param_bytes for s in specs)
    if shape.coupled:
        weights = weights_per_gpu(specs, tp, pp, shape.ep)
        if weights >= free:
            names = " + ".join(f"{s.name} ({_dtype(s)})" for s in specs)
            need_g = max(1, math.ceil(total / free))
            k = 1 << max(0, (need_g - 1).bit_length())
            hint = f"use tp >= {max(1, k // pp)}" if pp == 1 else f"use tp x pp >= {k}"
            raise InputError(
                f"{names} at tp={tp} pp={pp} needs {weights / 1e9:.1f} GB of weights per GPU "
                f"(+ {ws / 1e9:.1f} GB activation workspace); a {profile_name} GPU has "
                f"{hbm / 1e9:.1f} GB usable x memory_utilization {util} = "
                f"{budget / 1e9:.1f} GB: {hint}",
                source=source,
                where=where["tp"],
            )
        cache_gpu = weights
        weight_cache = total + max(shape.chunk_size, 1) * len(specs)
    else:
        cache_gpu = int(free * shape.weight_cache_fraction)
        weight_cache = cache_gpu * g
    kv_gpu = free - cache_gpu
    rep = max((kv_replication(s, tp) for s in specs), default=1)
    kv = max(kv_gpu * g // rep, 1)
    return ReplicaMemory(budget, ws, cache_gpu, kv_gpu, weight_cache, kv)


def kv_replication(spec: ModelSpec, tp: int) -> int:
    """How many TP ranks hold a copy of each KV head (more ranks than KV heads: each keeps a
    copy of its head); 1 otherwise."""
    return max(1, tp // spec.kv_heads) if spec.kv_heads else 1


def _dtype(spec: ModelSpec) -> str:
    return {1: "fp8", 2: "bf16", 4: "fp32"}.get(spec.dtype_bytes, f"{spec.dtype_bytes}-byte")


def context_limit(sc: Scenario, spec: ModelSpec, kv_budget: int) -> int:
    """The longest context (tokens) one sequence of ``spec`` can reach in ``kv_budget`` bytes
    of KV memory under the scenario's ``kv.storage`` and ``kv.attention`` (module docstring);
    ``1 << 30`` (no limit) for models without KV."""
    if spec.kind != "decoder":
        return 1 << 30
    kv = sc.kv
    att = AttentionMemoryModel(
        kv_bytes_per_token=int(spec.kv_bytes_per_token),
        gather_bytes_per_token=2 * max(spec.kv_heads, 1) * max(spec.head_dim, 1) * 4,
        score_bytes_per_pair=max(spec.heads, 1) * 4,
        block_tokens=kv.block_tokens,
        chunk_tokens=kv.chunk_tokens,
        storage=KvStorageModel(kv.storage, kv.block_tokens, kv.chunk_tokens, kv.regrowth),
    )
    limit = att.max_context(kv_budget, chunked=kv.attention == "chunked")
    return min(limit, spec.max_context) if spec.max_context else limit
