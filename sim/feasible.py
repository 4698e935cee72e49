"""Feasibility of a scenario: every check that can reject it before anything runs or is written.

:func:`check_feasible` raises :class:`engine.errors.InputError` (naming the scenario file and
the field) for a configuration that cannot be built: an unknown model, eviction policy or
workload class; a replica shape that does not tile the servers; an expert parallelism that
does not fit the replica shape or serves a model without experts; a memory plan that does not
fit (:func:`sim.serving.gpumemory.plan_memory`, or the pools' plan when disaggregated); weights larger
than the whole cluster; a pipelined weight cache smaller than two of the largest layer; a
trace workload without a trace; a chunk size out of range. It reads the catalogue and the
profile only; it builds nothing and has no side effects.
"""

from __future__ import annotations

from typing import Any

from engine.chunks import chunk_model
from engine.errors import InputError
from engine.policy.registry import policy_class
from sim.control.autoscale.section import check_autoscale
from sim.scenario import Scenario
from sim.serving.gpumemory import plan_memory


def gpu_host(sc: Scenario, profile: Any) -> tuple[int, int]:
    """(usable HBM per GPU, host memory per server) with profile defaults."""
    c = sc.cluster
    return (c.gpu.hbm or int(profile.gpu.hbm_bytes), c.server.host or int(profile.host.dram_bytes))


def _check_shape(sc: Scenario) -> None:
    c = sc.cluster
    g, gps = c.gpus_per_replica, c.gpus_per_server
    src = sc.source
    if g <= gps:
        if gps % g:
            raise InputError(
                f"a replica of tp x pp = {g} GPUs does not divide a server of {gps} GPUs; "
                f"use tp x pp in {', '.join(str(d) for d in range(1, gps + 1) if gps % d == 0)}",
                source=src,
                where="cluster.tp",
            )
    else:
        if g % gps:
            raise InputError(
                f"a replica of tp x pp = {g} GPUs wider than a server must span whole servers "
                f"of {gps} GPUs (a multiple of {gps})",
                source=src,
                where="cluster.tp",
            )
        if c.servers % c.servers_per_replica:
            raise InputError(
                f"{c.servers} servers do not split into replicas of {c.servers_per_replica} "
                f"servers each; use a multiple of {c.servers_per_replica}",
                source=src,
                where="cluster.servers",
            )


def _check_experts(sc: Scenario, catalogue: dict[str, Any]) -> None:
    """``cluster.ep``: a divisor or a multiple of ``tp``; a multiple only with ``pp = 1``,
    inside one server and tiling its replicas; every deployed model has experts (> 1)."""
    c = sc.cluster
    if c.ep == 1:
        return
    src, tp, ep = sc.source, c.tp, c.ep
    if tp % ep and ep % tp:
        raise InputError(
            f"ep={ep} with tp={tp}: ep must divide tp or be a multiple of it",
            source=src,
            where="cluster.ep",
        )
    if ep > tp and (c.pp > 1 or ep > c.gpus_per_server):
        raise InputError(
            f"ep={ep} > tp={tp} (attention data parallelism) needs pp 1 and ep <= "
            f"gpus_per_server ({c.gpus_per_server}); got pp {c.pp}",
            source=src,
            where="cluster.ep",
        )
    for i, d in enumerate(sc.deployments):
        if not catalogue[d.model].n_experts:
            raise InputError(
                f"ep={ep}: model {d.model!r} has no experts; ep > 1 needs mixture-of-experts "
                "models",
                source=src,
                where=f"deployments[{i}].model",
            )


def _check_names(sc: Scenario, catalogue: dict[str, Any]) -> None:
    """Every name a scenario refers to exists: models, eviction policies, workload classes of
    deployments and of degradation, and a protected class for isolated streams."""
    src = sc.source
    for i, d in enumerate(sc.deployments):
        if d.model not in catalogue:
            raise InputError(
                f"unknown model {d.model!r}; allowed: {', '.join(sorted(catalogue))}",
                source=src,
                where=f"deployments[{i}].model",
            )
    for field in ("hbm_policy", "host_policy", "nvme_policy"):
        try:
            policy_class(getattr(sc.cache, field))
        except InputError as err:
            raise InputError(str(err), source=src, where=f"cache.{field}") from None
    names = [c.name for c in sc.workload.classes]
    for i, d in enumerate(sc.deployments):
        if d.cls is not None and d.cls not in names:
            raise InputError(
                f"{d.cls!r} is not a workload class; classes: {', '.join(names)}",
                source=src,
                where=f"deployments[{i}].cls",
            )
    for p in sc.degradation.protected:
        if sc.degradation.enabled and p not in names:
            raise InputError(
                f"{p!r} is not a workload class; classes: {', '.join(names)}",
                source=src,
                where="degradation.protected",
            )
    if sc.cluster.replica.streams == "isolated":
        prio = [d.cls in sc.degradation.protected for d in sc.deployments]
        if all(prio) or not any(prio):
            raise InputError(
                "streams: isolated needs deployments of a protected class (cls in "
                f"degradation.protected: {sc.degradation.protected}) and of another class",
                source=src,
                where="cluster.replica.streams",
            )


def check_feasible(sc: Scenario, catalogue: dict[str, Any], profile: Any) -> None:
    """Raise :class:`InputError` (naming the scenario file and field) for impossible configs."""
    _check_names(sc, catalogue)
    check_autoscale(sc)
    src = sc.source
    hbm, host = gpu_host(sc, profile)
    c = sc.cluster
    specs = [catalogue[d.model] for d in sc.deployments]
    if sc.disaggregation.enabled:
        from sim.disagg.build import check_pools

        if c.ep > 1:
            raise InputError(
                f"ep={c.ep} with disaggregation: expert parallelism is modelled for "
                "aggregated replicas only; use ep 1 (experts split by each pool's tp)",
                source=src,
                where="cluster.ep",
            )

        mem = check_pools(sc, specs, profile)
    else:
        _check_shape(sc)
        _check_experts(sc, catalogue)
        mem = plan_memory(sc, specs, hbm, profile.name)
    total = sum(s.param_bytes for s in specs)
    cluster_bytes = (
        c.gpus * hbm + c.servers * (host + c.server.nvme) + c.param_servers * (c.ps.dram + c.ps.ssd)
    )
    if total > cluster_bytes:
        raise InputError(
            f"the models need {total / 2**30:.1f} GiB of weights but the whole cluster holds "
            f"{cluster_bytes / 2**30:.1f} GiB in all tiers; add servers or memory",
            source=src,
            where="deployments",
        )
    largest_layer = max(max(s.layer_bytes()) for s in specs)
    if sc.mode == "pd" and mem.weight_cache < 2 * largest_layer:
        raise InputError(
            f"a replica's HBM weight cache ({mem.weight_cache / 2**30:.2f} GiB) must hold "
            f"two of the largest layer ({largest_layer / 2**20:.0f} MiB) to pipeline",
            source=src,
            where="cluster.gpu.weight_cache_fraction",
        )
    if sc.experts.enabled:
        from sim.serving.expertlayout import check_experts

        check_experts(sc, specs, mem.weight_cache)
    if sc.workload.kind == "trace" and not sc.workload.trace:
        raise InputError("a trace workload needs a trace file", source=src, where="workload.trace")
    try:
        chunk_model("probe", [1], sc.chunks.size)
    except ValueError as err:
        raise InputError(str(err), source=src, where="chunks.size") from None


def check_references(sc: Scenario) -> dict[str, Any]:
    """The files and names ``sc`` refers to exist -- its model catalogue, its profile, and its
    models, eviction policies and classes (:func:`_check_names`) -- or :class:`InputError`
    naming the field. Unlike :func:`check_feasible` nothing here depends on the cluster's size,
    so a plan checks it before its first probe. Returns the catalogue."""
    from sim.serving.costmodel import load_profile
    from sim.serving.models import load_catalogue

    catalogue = load_catalogue(sc.catalogue)
    try:
        load_profile(sc.profile)
    except InputError as err:
        raise InputError(str(err), source=sc.source, where="profile") from None
    _check_names(sc, catalogue)
    return catalogue


def check_runnable(sc: Scenario) -> None:
    """:func:`check_references` and :func:`check_feasible` for ``sc`` and each of its variants,
    as :func:`sim.runner.run_scenario` checks them (an A/B test's sides before any run)."""
    from sim.scenario import variant
    from sim.serving.costmodel import load_profile

    catalogue = check_references(sc)
    profile = load_profile(sc.profile)
    for v in [variant(sc, v) for v in sc.variants] or [sc]:
        check_feasible(v, catalogue, profile)
