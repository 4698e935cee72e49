"""THE replica factory: one way to make a replica, for aggregated and disaggregated pools and
for the autoscaler at run time.

A :class:`ReplicaSpec` is one pool's recipe (its run-context view, profile, memory plan and
GPUs per replica); :class:`ReplicaFactory` turns it into :class:`sim.serving.replica.ComputeNode`
objects, each with the same five links and the same bandwidth rules:

* ``pcie``: the profile's PCIe bandwidth x GPUs, divided by ``1 + copy_contention`` (a
  calibrated engine's weight copies run that much slower than its idle link while it
  computes, :class:`sim.serving.opcost.terms.EngineTerms`; 0 for datasheet profiles);
* ``nic``: RDMA bandwidth x GPUs (one NIC per GPU; the scenario's ``cluster.network.rdma``
  where given), latency 0 (the path's far end carries it);
* ``nvme`` and ``object``: the server's figure x the replica's share of the server;
* ``nvlink``: the profile's NVLink bandwidth x GPUs.

Preload (``preload=True``, coupled mode or ``warmup.node_hbm``): every model is read into
the weight store in the deployments' share order (largest share first, ties by index), as
the engine's warm-up reads them; coupled mode raises :class:`engine.errors.InputError` when
the weights do not fit HBM. A replica made with ``preload=False`` starts with empty tiers
(the autoscaler's cold start loads it, :mod:`sim.serving.coldstart`).

Links are created in ``make`` order (link names are part of the run's structure, not of the
trace); ``make`` does no I/O and draws no random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import InputError
from sim.serving.paramstore import WeightStore
from sim.serving.replica import ComputeNode

if TYPE_CHECKING:
    from sim.serving.context import SimContext


@dataclass(frozen=True)
class ReplicaSpec:
    """One pool's recipe for a replica.

    ``ctx``: the run context as the pool's replicas see it (its ``models``); ``gpus``: GPUs
    per replica; ``share``: the replica's share of its server's host memory, NVMe and
    object-store link; ``weight_cache``, ``kv``: HBM bytes per replica for weights and KV
    blocks; ``host``: host memory per server; ``tp``: GPUs per pipeline stage; ``shares``:
    the deployments' traffic shares (preload order)."""

    ctx: Any
    profile: Any
    gpus: int
    share: float
    weight_cache: int
    kv: int
    host: int
    tp: int
    shares: tuple[float, ...]


def pcie_bandwidth(profile: Any, gpus: int, weight_cache: int) -> float:
    """PCIe bytes/s of a replica of ``gpus`` GPUs whose HBM weight cache is ``weight_cache``
    bytes: the profile's per-GPU link x ``gpus`` / (1 + the engine's copy contention at that
    cache size)."""
    eng = profile.ops.engine if profile.ops is not None else None
    contention = eng.copy_contention_at(weight_cache) if eng is not None else 0.0
    return float(profile.links.pcie.bandwidth) * gpus / (1.0 + contention)


class ReplicaFactory:
    """Makes the replicas of one pool (see the module docstring)."""

    def __init__(self, spec: ReplicaSpec, wl: Any, tokens: tuple[list[int], list[int], list[int]]):
        self.spec = spec
        self.wl = wl
        self.tokens = tokens

    def link_terms(self) -> dict[str, tuple[float, float]]:
        """``{link kind: (bandwidth bytes/s, latency s)}`` of one replica of this pool."""
        sp = self.spec
        sc, L, g = sp.ctx.sc, sp.profile.links, sp.gpus
        net = sc.cluster.network
        rdma_bw = (net.rdma or L.rdma.bandwidth) * g
        obj_bw = net.object_store or L.object_store.bandwidth
        obj_lat = (
            net.object_store_latency
            if net.object_store_latency is not None
            else L.object_store.latency
        )
        return {
            "pcie": (pcie_bandwidth(sp.profile, g, sp.weight_cache), L.pcie.latency),
            "nic": (rdma_bw, 0.0),
            "nvme": (L.nvme.bandwidth * sp.share, L.nvme.latency),
            "object": (obj_bw * sp.share, obj_lat),
            "nvlink": (L.nvlink.bandwidth * g, L.nvlink.latency),
        }

    def rdma_latency(self) -> float:
        """First-byte seconds of a transfer over the GPU network (RDMA): the scenario's
        ``cluster.network.rdma_latency`` where given, else the profile's."""
        net = self.spec.ctx.sc.cluster.network
        lat = net.rdma_latency
        return float(lat if lat is not None else self.spec.profile.links.rdma.latency)

    def make(self, idx: int, preload: bool, server: int | None = None) -> ComputeNode:
        """A new replica ``node{idx}`` (not started, not in ``ctx.nodes``): its links, its
        weight store (preloaded when ``preload``) and its node on ``server`` (default
        ``idx``)."""
        sp = self.spec
        ctx: SimContext = sp.ctx
        sc = ctx.sc
        name = f"node{idx}"
        net = ctx.network
        links = {
            kind: net.add_link(f"{name}.{kind}", bw, lat)
            for kind, (bw, lat) in self.link_terms().items()
        }
        host_r = int(sp.host * sp.share)
        nvme_r = int(sc.cluster.server.nvme * sp.share)
        ws = WeightStore(ctx, idx, name, sp.weight_cache, host_r, nvme_r, links)
        if preload:
            order = sorted(range(len(ctx.models)), key=lambda j: (-sp.shares[j], j))
            for m in order:
                if not ws.preload(m, 0.0) and sc.mode == "coupled":
                    raise InputError(
                        "coupled mode: weights do not fit HBM", source=sc.source, where="mode"
                    )
        ws.fetches_after_warmup = 0
        swap = sc.kv.swap_space * sp.gpus
        node = ComputeNode(ctx, idx, name, ws, sp.kv, self.wl, self.tokens, swap)
        node.server = idx if server is None else server
        node.tp = sp.tp
        return node

    def preloads(self) -> bool:
        """Whether a replica built with the cluster starts with its weights read (coupled
        mode or ``warmup.node_hbm``)."""
        sc = self.spec.ctx.sc
        return bool(sc.mode == "coupled" or sc.warmup.node_hbm)
