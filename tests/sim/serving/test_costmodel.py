"""Tests for sim.serving.costmodel: profiles load and validate; the roofline behaves monotonically."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from sim.serving.costmodel import SHIPPED_PROFILES, CostModel, load_profile
from sim.serving.models import load_catalogue

CAT = load_catalogue()


@pytest.mark.parametrize("name", SHIPPED_PROFILES)
def test_shipped_profiles_load(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    if name.endswith("-vllm"):  # imported kernel measurements
        assert p.source == "measured" and p.ops is not None
    else:
        assert p.source == "datasheet" and p.ops is None
        assert "datasheet" in p.notes.lower() and "assum" in p.notes.lower()
    assert 0 < p.gpu.compute_efficiency <= 1


def test_datasheet_numbers() -> None:
    a100, h100, h200 = (load_profile(n) for n in ("a100-80gb", "h100-sxm", "h200-sxm"))
    # usable memory per GPU, not the marketing figure (80 GB, 80 GB, 141 GB)
    assert a100.gpu.hbm_bytes == 79 * 2**30 and a100.gpu.flops_fp16 == 312e12
    assert h100.gpu.hbm_bandwidth == 3.35e12 and h100.gpu.flops_fp16 == 989e12
    assert h200.gpu.hbm_bytes == 139 * 2**30 and h200.gpu.hbm_bandwidth == 4.8e12
    assert a100.links.pcie.bandwidth == 25e9 and h100.links.pcie.bandwidth == 50e9


def _profile_dict() -> dict:
    return json.loads((Path(__file__).parents[3] / "sim/data/profiles/a100-80gb.json").read_text())


def test_unknown_key_rejected_naming_field(tmp_path: Path) -> None:
    d = _profile_dict()
    d["gpu"]["hbm_bandwith"] = 1e12
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InputError) as info:
        load_profile(p)
    assert str(p) in str(info.value) and "gpu.hbm_bandwith" in str(info.value)


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda d: d["links"]["rdma"].update(bandwidth="fast"), "links.rdma.bandwidth"),
        (lambda d: d["gpu"].update(compute_efficiency=1.5), "gpu.compute_efficiency"),
        (lambda d: d.update(source="guess"), "source"),
        (lambda d: d["links"].pop("nvme"), "links.nvme"),
    ],
)
def test_bad_profile_values(tmp_path: Path, edit, where: str) -> None:
    d = _profile_dict()
    edit(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InputError, match=where.replace(".", r"\.")):
        load_profile(p)


def test_human_units_and_bad_json(tmp_path: Path) -> None:
    d = _profile_dict()
    d["links"]["rdma"] = {"bandwidth": "200Gbit/s", "latency": "5us"}
    d["gpu"]["hbm_bytes"] = "80GB"
    p = tmp_path / "ok.json"
    p.write_text(json.dumps(d))
    prof = load_profile(p)
    assert prof.links.rdma.bandwidth == 25e9 and prof.links.rdma.latency == pytest.approx(5e-6)
    assert prof.gpu.hbm_bytes == 80e9
    p.write_text("{\n  oops")
    with pytest.raises(InputError, match="line 2"):
        load_profile(p)
    with pytest.raises(InputError, match="a100-80gb"):
        load_profile(tmp_path / "missing.json")


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(load_profile("a100-80gb"), CAT["llama-2-7b"])


@given(
    batch=st.integers(1, 256),
    ctx=st.integers(0, 500_000),
    db=st.integers(1, 64),
    dc=st.integers(1, 100_000),
)
def test_decode_step_monotone(cm: CostModel, batch: int, ctx: int, db: int, dc: int) -> None:
    t = cm.decode_step_time(batch, ctx)
    assert cm.decode_step_time(batch + db, ctx) >= t
    assert cm.decode_step_time(batch, ctx + dc) > t


def test_decode_grows_strictly_with_batch_when_compute_bound(cm: CostModel) -> None:
    assert cm.decode_step_time(2048, 0) > cm.decode_step_time(1024, 0) > cm.decode_step_time(1, 0)
    assert cm.decode_step_time(8, 64_000) > cm.decode_step_time(8, 8_000)


def test_decode_small_batch_is_weight_bandwidth_bound(cm: CostModel) -> None:
    m = CAT["llama-2-7b"]
    weights_s = m.param_bytes / cm.hbm_bandwidth
    t = cm.decode_step_time(1, 0)
    assert weights_s * 0.95 < t < weights_s * 1.2  # reading the weights dominates


def test_vectorised_decode_matches_scalar(cm: CostModel) -> None:
    b = np.array([1, 4, 64, 300])
    c = np.array([0, 4096, 100_000, 1_000_000])
    vec = cm.decode_step_times(b, c)
    assert vec == pytest.approx(
        [cm.decode_step_time(int(x), int(y)) for x, y in zip(b, c, strict=True)]
    )


def test_layer_and_prefill_times(cm: CostModel) -> None:
    m = CAT["llama-2-7b"]
    # block layer: roofline with overhead
    block = 1
    t1 = cm.layer_time(block, 1)
    assert t1 == pytest.approx(m.layers[block].param_bytes / cm.hbm_bandwidth + cm.overhead)
    big = cm.layer_time(block, 100_000)
    assert big == pytest.approx(m.layers[block].flops_per_token * 1e5 / cm.flop_rate + cm.overhead)
    assert cm.layer_times(7) == pytest.approx([cm.layer_time(i, 7) for i in range(m.n_layers)])
    # embedding reads only looked-up rows
    assert cm.layer_time(0, 1) - cm.overhead < (cm.layer_time(block, 1) - cm.overhead) / 100
    assert cm.prefill_time(4096) > cm.prefill_time(512) > 0
    assert cm.prefill_time(2048, sq_tokens=2 * 1024**2) < cm.prefill_time(2048)


def test_cnn_batch_time_and_transfers() -> None:
    prof = load_profile("h100-sxm")
    cnn = CostModel(prof, CAT["resnet-50"])
    assert cnn.cnn_batch_time(64) > cnn.cnn_batch_time(8) > 0
    assert cnn.flop_rate == pytest.approx(prof.gpu.flops_fp32 * prof.gpu.compute_efficiency)
    with pytest.raises(ValueError):
        CostModel(prof, CAT["llama-2-7b"]).cnn_batch_time(1)
    t = cnn.transfer_time(4 << 20, "rdma")
    assert t == pytest.approx(prof.links.rdma.latency + (4 << 20) / prof.links.rdma.bandwidth)
    assert cnn.transfer_time(10**9, "object_store") > cnn.transfer_time(10**9, "nvme")
    with pytest.raises(ValueError, match="pcie"):
        cnn.transfer_time(1, "carrier-pigeon")


def test_h200_faster_than_a100_for_decode() -> None:
    m = CAT["llama-2-13b"]
    a = CostModel(load_profile("a100-80gb"), m)
    h = CostModel(load_profile("h200-sxm"), m)
    assert h.decode_step_time(16, 16_000) < a.decode_step_time(16, 16_000)
    assert not CostModel(load_profile("a100-80gb"), CAT["llama-2-70b"]).weights_fit()
    assert CostModel(load_profile("h200-sxm"), CAT["llama-2-70b"]).weights_fit()  # 138 < 141 GB
    assert h.weights_fit()
