"""One replica factory: aggregated and disaggregated replicas get the same links under the
same bandwidth rules (PCIe over 1 + copy contention in both pools)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from sim.cluster import build
from sim.scenario import validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.models import load_catalogue
from sim.serving.replicafactory import pcie_bandwidth
from tests.sim.disagg.conftest import BASE


def _stub(contention: float) -> SimpleNamespace:
    eng = SimpleNamespace(copy_contention_at=lambda cache: contention if cache > 10 else 0.0)
    links = SimpleNamespace(pcie=SimpleNamespace(bandwidth=25e9))
    return SimpleNamespace(ops=SimpleNamespace(engine=eng), links=links)


def test_pcie_is_divided_by_one_plus_the_copy_contention_at_the_cache_size() -> None:
    assert pcie_bandwidth(_stub(0.25), 2, 100) == pytest.approx(25e9 * 2 / 1.25)
    assert pcie_bandwidth(_stub(0.25), 2, 5) == pytest.approx(25e9 * 2)  # below the knot
    no_ops = SimpleNamespace(ops=None, links=SimpleNamespace(pcie=SimpleNamespace(bandwidth=1e9)))
    assert pcie_bandwidth(no_ops, 4, 100) == 4e9


@pytest.mark.parametrize("disagg", [False, True])
def test_both_pools_wire_replicas_alike(disagg: bool) -> None:
    data = copy.deepcopy(BASE)
    data["disaggregation"]["enabled"] = disagg
    sc = validate(data)
    prof = load_profile(sc.profile)
    cl = build(sc, 0, load_catalogue(sc.catalogue), prof, CostModel)
    assert set(cl.factories) == ({"prefill", "decode"} if disagg else {"both"})
    for node in cl.ctx.nodes:
        links = node.ws.links
        assert set(links) == {"pcie", "nic", "nvme", "object", "nvlink"}
        g = node.tp  # pp = 1 here: GPUs per replica
        want = pcie_bandwidth(prof, g, node.ws.hbm.capacity)
        assert links["pcie"].bandwidth == pytest.approx(want)
        assert links["nvlink"].bandwidth == pytest.approx(prof.links.nvlink.bandwidth * g)
        assert links["nic"].bandwidth == pytest.approx(prof.links.rdma.bandwidth * g)
        # coupled mode: every replica starts with its weights read
        assert node.ws.all_resident(0)
