"""A new replica's cold start equals a hand computation on each load path: latencies plus
bytes over the path's bottleneck, sequential where the mechanism is."""

from __future__ import annotations

import pytest

from sim.control.autoscale.loop import Autoscaler
from tests.sim.control.autoscale.conftest import built, scenario

PROVISION, WARMUP = 2.5, 0.75


def _start(*sets: str) -> tuple[Autoscaler, dict[str, float], object]:
    sc = scenario(
        *sets,
        f"autoscale.cold_start.provision={PROVISION}",
        f"autoscale.cold_start.warmup={WARMUP}",
        "workload.steps=[]",
        "workload.rate=0.001",
    )
    cl, prof = built(sc)
    scaler = Autoscaler(cl, prof.coldstart)  # no loop: one scale-out by hand
    cs = scaler.scale_out(1)
    cl.env.run(until=120.0)
    return scaler, cs.times[1], prof


def test_coupled_object_store_reads_the_checkpoint_then_warms_up() -> None:
    scaler, t, prof = _start("mode=coupled", "autoscale.cold_start.load_from=object")
    mr = scaler.ctx.models[0]
    L = prof.links  # type: ignore[attr-defined]
    # one server per replica (share 1): object store 1.5 GB/s, PCIe 25 GB/s, no contention
    bottleneck = min(L.object_store.bandwidth * 1.0, L.pcie.bandwidth * 1)
    load = L.object_store.latency + L.pcie.latency + mr.total_bytes / bottleneck
    assert t["decision"] == 0.0
    assert t["provisioned"] == pytest.approx(PROVISION, rel=1e-12)
    assert t["loaded"] == pytest.approx(PROVISION + load, rel=1e-9)
    assert t["serving"] == pytest.approx(PROVISION + load + WARMUP, rel=1e-9)
    node = scaler.ctx.nodes[1]
    assert node.ws.all_resident(0) and node.up
    assert scaler.state[1] == "serving"


def test_coupled_nvme_is_bounded_by_the_nvme_link() -> None:
    scaler, t, prof = _start("mode=coupled", "autoscale.cold_start.load_from=nvme")
    L = prof.links  # type: ignore[attr-defined]
    total = scaler.ctx.models[0].total_bytes
    load = L.nvme.latency + L.pcie.latency + total / min(L.nvme.bandwidth, L.pcie.bandwidth)
    assert t["serving"] == pytest.approx(PROVISION + load + WARMUP, rel=1e-9)


def _layer_sum(scaler: Autoscaler, per_layer_latency: float, bw: float) -> float:
    mr = scaler.ctx.models[0]
    return sum(per_layer_latency + lb / bw for lb in mr.layer_bytes if lb > 0)


def test_pd_peers_multicast_streams_layer_by_layer_while_serving() -> None:
    scaler, t, prof = _start(
        "mode=pd",
        "warmup.node_hbm=true",  # the running replica holds every layer: the source
        "cluster.gpu.weight_cache_fraction=0.9",
        "autoscale.cold_start.load_from=peers",
    )
    L = prof.links  # type: ignore[attr-defined]
    # it serves once provisioned and warmed up: weights are not waited for
    assert t["serving"] == pytest.approx(PROVISION + WARMUP, rel=1e-12)
    # each layer: one RDMA first byte, then bytes over min(source NIC, new NIC)
    stream = _layer_sum(scaler, L.rdma.latency, L.rdma.bandwidth)
    assert t["loaded"] == pytest.approx(PROVISION + stream, rel=1e-9)
    assert scaler.ctx.nodes[1].ws.all_resident(0)
    assert scaler.cold_starts[0].bytes["peers"] == scaler.ctx.models[0].total_bytes


def test_pd_multicast_sends_once_to_several_new_replicas() -> None:
    sc = scenario(
        "mode=pd",
        "warmup.node_hbm=true",
        "cluster.gpu.weight_cache_fraction=0.9",
        "autoscale.cold_start.load_from=peers",
        f"autoscale.cold_start.provision={PROVISION}",
        f"autoscale.cold_start.warmup={WARMUP}",
        "workload.steps=[]",
        "workload.rate=0.001",
    )
    cl, prof = built(sc)
    scaler = Autoscaler(cl, prof.coldstart)
    cs = scaler.scale_out(3)
    cl.env.run(until=120.0)
    L = prof.links
    stream = _layer_sum(scaler, L.rdma.latency, L.rdma.bandwidth)
    for idx in (1, 2, 3):  # the same time as one: the source NIC carries each layer once
        assert cs.times[idx]["loaded"] == pytest.approx(PROVISION + stream, rel=1e-9)
    src_nic = cl.ctx.nodes[0].ws.links["nic"]
    assert src_nic.carried() == pytest.approx(scaler.ctx.models[0].total_bytes, rel=1e-9)


def test_pd_param_servers_stream_over_the_fetch_path() -> None:
    scaler, t, prof = _start(
        "mode=pd",
        "cluster.gpu.weight_cache_fraction=0.9",
        "autoscale.cold_start.load_from=param-servers",
    )
    L = prof.links  # type: ignore[attr-defined]
    ps_nic = scaler.ctx.sc.cluster.ps.nic
    # path: PS DRAM -> PS NIC (RDMA latency) -> replica NIC -> PCIe (its latency)
    bw = min(ps_nic, L.rdma.bandwidth, L.pcie.bandwidth)
    stream = _layer_sum(scaler, L.rdma.latency + L.pcie.latency, bw)
    assert t["serving"] == pytest.approx(PROVISION + WARMUP, rel=1e-12)
    assert t["loaded"] == pytest.approx(PROVISION + stream, rel=1e-9)
