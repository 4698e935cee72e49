"""Tests for sim.serving.costmodel: profiles load and validate; copies, engine terms, fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import InputError
from sim.serving.costmodel import SHIPPED_PROFILES, CostModel, load_profile
from sim.serving.itercost import iteration_seconds
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


def test_cnn_pass_and_transfers() -> None:
    prof = load_profile("h100-sxm")
    cnn = CostModel(prof, CAT["resnet-50"])
    # a CNN batch of b samples is one pass over b "tokens", no attention, no sampling head
    t64 = iteration_seconds(cnn.iteration, 64, 0.0, 64, 0, 0.0)
    assert t64 > iteration_seconds(cnn.iteration, 8, 0.0, 8, 0, 0.0) > 0
    assert cnn.summary()["flop_rate"] == pytest.approx(
        prof.gpu.flops_fp32 * prof.gpu.compute_efficiency
    )
    t = cnn.transfer_time(4 << 20, "rdma")
    assert t == pytest.approx(prof.links.rdma.latency + (4 << 20) / prof.links.rdma.bandwidth)
    assert cnn.transfer_time(10**9, "object_store") > cnn.transfer_time(10**9, "nvme")
    with pytest.raises(ValueError, match="pcie"):
        cnn.transfer_time(1, "carrier-pigeon")


def test_engine_terms_only_from_a_calibrated_engine() -> None:
    sheet = CostModel(load_profile("h200-sxm-vllm"), CAT["llama-3.1-8b"])
    assert sheet.engine_terms is None
    assert (sheet.wake_s, sheet.iter_gap_s, sheet.prefetch_s_per_byte_at(1 << 30)) == (0, 0, 0)


def test_weights_fit_one_gpu() -> None:
    assert not CostModel(load_profile("a100-80gb"), CAT["llama-2-70b"]).weights_fit()
    assert CostModel(load_profile("h200-sxm"), CAT["llama-2-70b"]).weights_fit()  # 138 < 141 GB
