"""Building the replicas of a disaggregated cluster (called by :func:`sim.cluster.build`).

Each pool gets its own memory plan and cost model (its ``tp``, its GPU profile): the
scenario with ``cluster.tp`` set to the pool's ``tp`` (``pp = 1``) goes through the same
:func:`sim.serving.gpumemory.plan_memory` and :func:`sim.serving.modelrt.model_rt` as an aggregated replica, and
every replica is the same :class:`sim.serving.replica.ComputeNode`, told its role. A replica's view of
the run context (:class:`PoolContext`) is the run's context with its pool's models.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import InputError
from sim.disagg.coordinator import Disagg
from sim.disagg.layout import Slot, place_pools
from sim.disagg.promptblocks import trace_blocks
from sim.disagg.store import KvStore
from sim.scenario import Scenario
from sim.serving.gpumemory import ReplicaMemory, plan_memory

if TYPE_CHECKING:
    from sim.serving.context import SimContext
    from sim.serving.costmodel import CostModel, Profile
    from sim.serving.models import ModelSpec

POOLS: tuple[str, ...] = ("prefill", "decode")


class PoolContext:
    """The run's :class:`sim.serving.context.SimContext` as one pool's replica sees it: the same
    object for everything but ``models`` (the pool's, costed at its ``tp`` and GPU)."""

    def __init__(self, base: Any, models: list[Any]) -> None:
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "models", models)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._base, name, value)


def pool_scenario(sc: Scenario, role: str) -> Scenario:
    """``sc`` as one replica of pool ``role`` sees it: ``cluster.tp`` = the pool's, ``pp`` = 1."""
    pool = getattr(sc.disaggregation, role)
    cluster = sc.cluster.model_copy(update={"tp": pool.tp, "pp": 1})
    return sc.model_copy(update={"cluster": cluster})


def pool_profile(sc: Scenario, role: str, profile: Any) -> Any:
    """The hardware profile of pool ``role`` (the scenario's unless the pool names one)."""
    name = getattr(sc.disaggregation, role).profile
    if name is None:
        return profile
    from sim.serving.costmodel import load_profile

    try:
        return load_profile(name)
    except InputError as err:
        raise InputError(
            str(err), source=sc.source, where=f"disaggregation.{role}.profile"
        ) from None


def pool_memory(sc: Scenario, role: str, specs: list[Any], profile: Any) -> ReplicaMemory:
    """The memory plan of one replica of pool ``role`` (``InputError`` naming the pool)."""
    psc = pool_scenario(sc, role)
    prof = pool_profile(sc, role, profile)
    hbm = sc.cluster.gpu.hbm or int(prof.gpu.hbm_bytes)
    try:
        return plan_memory(psc, specs, hbm, prof.name)
    except InputError as err:
        text = str(err)
        if err.source and text.startswith(f"{err.source}: "):
            text = text[len(err.source) + 2 :]
        raise InputError(
            f"{role} pool: {text}", source=sc.source, where=f"disaggregation.{role}.tp"
        ) from None


def check_pools(sc: Scenario, specs: list[Any], profile: Any) -> ReplicaMemory:
    """Reject pools that cannot be built (shape, memory); returns the plan of the pool with
    the smallest weight cache (what the cluster-wide checks use)."""
    _place(sc)
    plans = [pool_memory(sc, r, specs, profile) for r in POOLS]
    return min(plans, key=lambda p: p.weight_cache)


def base_models(
    sc: Scenario, specs: list[ModelSpec], profile: Profile, cost_cls: type[CostModel]
) -> tuple[dict[str, list[Any]], dict[str, ReplicaMemory]]:
    """Per pool: its models (as :func:`sim.serving.modelrt.model_rt` prepares them) and memory plan."""
    from sim.serving.modelrt import model_rt

    models: dict[str, list[Any]] = {}
    mems: dict[str, ReplicaMemory] = {}
    for role in POOLS:
        mem = pool_memory(sc, role, specs, profile)
        psc = pool_scenario(sc, role)
        prof = pool_profile(sc, role, profile)
        models[role] = [model_rt(i, s, psc, prof, cost_cls, mem.kv) for i, s in enumerate(specs)]
        mems[role] = mem
    return models, mems


def build_pools(
    ctx: SimContext,
    sc: Scenario,
    profile: Any,
    wl: Any,
    tokens: tuple[list[int], list[int], list[int]],
    models: dict[str, list[Any]],
    mems: dict[str, ReplicaMemory],
    host: int,
    base_dir: Path | None,
) -> Disagg:
    """Make every replica of both pools (appended to ``ctx.nodes``, in slot order) and the
    coordinator that links them."""
    from sim.serving.replicafactory import ReplicaFactory, ReplicaSpec

    d = sc.disaggregation
    c = sc.cluster
    gps = c.gpus_per_server
    slots = _place(sc)
    shares = tuple(dep.share for dep in sc.deployments)
    factories: dict[str, ReplicaFactory] = {}
    for role in POOLS:
        tp = getattr(d, role).tp
        mem = mems[role]
        spec = ReplicaSpec(
            ctx=PoolContext(ctx, models[role]),
            profile=pool_profile(sc, role, profile),
            gpus=tp,
            share=tp / gps,
            weight_cache=mem.weight_cache,
            kv=mem.kv,
            host=host,
            tp=tp,
            shares=shares,
        )
        factories[role] = ReplicaFactory(spec, wl, tokens)
    pools: dict[str, list[Any]] = {r: [] for r in POOLS}
    for i, slot in enumerate(slots):
        f = factories[slot.role]
        node = f.make(i, f.preloads(), server=slot.server)
        ctx.nodes.append(node)
        pools[slot.role].append(node)
    store = None
    if d.store.enabled:
        prof = pool_profile(sc, "prefill", profile)
        L = prof.links
        tp = d.prefill.tp
        bws = (
            d.store.host_bandwidth or L.pcie.bandwidth * tp,
            d.store.ssd_bandwidth or L.nvme.bandwidth,
            d.store.remote_bandwidth or (c.network.rdma or L.rdma.bandwidth) * tp,
        )
        caps = (d.store.host, d.store.ssd, d.store.remote)
        store = KvStore(caps, bws, d.store.block_tokens, d.store.policy)
    blocks = trace_blocks(sc.workload, wl.n, base_dir)
    gpus = d.prefill.replicas * d.prefill.tp + d.decode.replicas * d.decode.tp
    out = Disagg(ctx, d, pools["prefill"], pools["decode"], store, blocks, gpus)
    out.factories = factories
    return out


def _place(sc: Scenario) -> list[Slot]:
    """The pools' replicas on servers, as the scenario's placement puts them."""
    d = sc.disaggregation
    return place_pools(
        d.prefill.replicas,
        d.prefill.tp,
        d.decode.replicas,
        d.decode.tp,
        sc.cluster.gpus_per_server,
        d.placement,
        sc.source,
    )
