"""Fitted profile validates and round-trips; `pdsim calibrate` writes one and refuses bad input."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.backend import cupy_status
from hwbench.opprobe import OpGrid
from hwbench.probes import ProbeConfig, run_probes
from hwbench.profile import LINK_MAP, fit_profile
from pdsim.cli import app
from sim.serving.costmodel import CostModel, Profile, load_profile, parse_profile
from sim.serving.itercost import iteration_seconds
from sim.serving.models import load_catalogue
from sim.serving.opcost import EngineTerms

runner = CliRunner()


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    steps: list[str] = []
    ms = run_probes(ProbeConfig.tiny(), np, tmp_path_factory.mktemp("probes"), steps.append)
    assert len(steps) == 10  # 6 links, matmul, attention, quantisation, overheads
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    return fit_profile(ms, np, "cpu-test", mode="tiny", when=when, hostname="testhost")


def test_profile_is_measured_and_validates(profile: Profile) -> None:
    assert profile.source == "measured"
    assert profile.hostname == "testhost"
    assert profile.measured_at == "2026-01-02T03:04:05+00:00"
    assert "numpy backend" in profile.notes and "tiny" in profile.notes
    rows = profile.fitted["matmul_float32"]
    best = max(r["rate"] for r in rows)
    assert profile.gpu.flops_fp32 == pytest.approx(best) == profile.gpu.flops_fp16  # CPU
    batched = sorted(r["rate"] / best for r in rows if r["m"] >= 64)
    assert profile.gpu.compute_efficiency == pytest.approx(float(np.median(batched)))
    assert 0 < profile.gpu.compute_efficiency <= 1.0
    assert profile.gpu.per_layer_overhead_s > profile.gpu.kernel_launch_s > 0
    for name in LINK_MAP:
        link = getattr(profile.links, name)
        assert link.bandwidth > 0 and link.latency >= 0
    assert len(profile.fitted["link_fit"]) == 5
    assert len(profile.fitted["copy_host_to_device"]) == len(ProbeConfig.tiny().copy_sizes)
    assert {"batch", "context", "median_s"} <= set(profile.fitted["attention"][0])


def test_profile_round_trips_through_json(profile: Profile, tmp_path: Path) -> None:
    text = profile.model_dump_json(indent=2)
    assert parse_profile(text, "mem") == profile
    path = tmp_path / "p.json"
    path.write_text(text)
    assert load_profile(path) == profile
    json.loads(text)  # plain JSON, no NaN/inf
    assert "NaN" not in text and "Infinity" not in text


def test_simulator_cost_model_accepts_the_profile(profile: Profile) -> None:
    model = load_catalogue()["llama-2-7b"]
    cm = CostModel(profile, model)
    one = iteration_seconds(cm.iteration, 0, 0.0, 0, 1, 100.0)
    assert 0 < one < iteration_seconds(cm.iteration, 0, 0.0, 0, 8, 8000.0)
    assert cm.transfer_time(2**20, "nvme") > cm.transfer_time(0, "nvme")


def _fake_engine_fit(monkeypatch: pytest.MonkeyPatch, fail: str | None = None) -> list[Profile]:
    """Replace the engine probe (seconds of real serving) by fixed terms, or by a rejection;
    returns the profiles it was handed (the measured op tables are real)."""
    import hwbench.engine_fit as ef

    seen: list[Profile] = []

    def fake(profile: Profile, xp: object, **_: object) -> tuple[Profile, dict[str, float]]:
        seen.append(profile)
        if fail is not None:
            raise ef.ImpossibleFit(fail)
        terms = EngineTerms(fused_iterations=False, layer_overhead_s=2e-4, iter_gap_s=1e-5)
        report = {
            "rms_rel_error": 0.05,
            "max_rel_error": 0.1,
            "raw_iteration_overhead_s": 4e-4,
            "op_ratio.down_gemm": 1.53,
            "op_ratio.norms": 0.98,
        }
        return ef.with_engine(profile, terms, 3e-4), report

    monkeypatch.setattr(ef, "calibrate_engine", fake)
    no_hardware_check(monkeypatch)
    reference_times(monkeypatch, 0.100, 0.104)  # 4% apart: within the 5% limit
    return seen


def reference_times(monkeypatch: pytest.MonkeyPatch, start: float, end: float) -> None:
    """Fix the reference workload's seconds at the calibration's start and end: how fast the
    machine runs is the test's input, not whatever a busy machine does meanwhile."""
    import hwbench.quiet

    times = iter((start, end))
    monkeypatch.setattr(hwbench.quiet, "reference_seconds", lambda *a, **k: next(times))


def no_hardware_check(monkeypatch: pytest.MonkeyPatch, reasons: tuple[str, ...] = ()) -> None:
    """The link checks compare a fit with the probe's own timings, which a busy machine can
    push either way: CLI tests fix their verdict (check_profile has its own tests)."""
    import hwbench.profile

    monkeypatch.setattr(hwbench.profile, "check_profile", lambda *a, **k: list(reasons))


def test_cli_calibrate_tiny_writes_a_valid_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _fake_engine_fit(monkeypatch)
    out = tmp_path / "profiles" / "mine.json"
    res = runner.invoke(app, ["calibrate", "--tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    p = load_profile(out)
    assert p.name == "mine" and p.source == "measured" and p.hostname
    assert "wrote" in res.output and not list(out.parent.glob("*.tmp"))
    # op tables measured on the backend (sim.serving.opcost schema), handed to the engine fit
    (handed,) = seen
    assert handed.ops is not None and handed.ops.engine is None
    assert p.ops is not None and p.ops.engine is not None
    grid = OpGrid.tiny()
    gemms = {t.resident_bytes: t for t in p.ops.gemm}
    assert 0 in gemms and all(t.dtype == "fp32" for t in p.ops.gemm)
    assert gemms[0].grid.m == list(grid.m) and gemms[0].grid.k == list(grid.k)
    layouts = {(t.phase, t.heads, t.kv_heads) for t in p.ops.attention}
    assert layouts == {(ph, h, kv) for ph in ("decode", "prefill") for h, kv in grid.layouts}
    assert all(
        t.kv_dtype == "fp32" and t.origin.framework.startswith("numpy") for t in p.ops.attention
    )
    assert p.ops.roofline.op_floor_s > 0 and p.ops.roofline.iteration_overhead_s == 3e-4
    # measured hardware terms are the probes' (the engine fit does not touch them)
    assert p.gpu == handed.gpu and p.links == handed.links
    assert "per-layer overhead" in res.output and "engine fit error" in res.output
    assert "down_gemm 1.53x, norms 0.98x" in res.output  # furthest from in place first
    # the engine's elementwise ops are tables (one per op, timed in place), rope fused
    assert {t.op for t in p.ops.elementwise} == {"norm", "activation", "embedding"}
    assert all("in place" in t.kernel for t in [*p.ops.elementwise, *p.ops.attention])
    assert p.ops.roofline.fused == ["rope"]
    # how much of the machine other processes and steal took meanwhile, and how fast a
    # reference workload ran at the start and the end (hwbench.quiet)
    from hwbench.quiet import sample

    (load,) = p.fitted["calibration_load"]
    assert load["reference_s"] == pytest.approx(
        (load["reference_start_s"] + load["reference_end_s"]) / 2
    )
    assert load["reference_start_s"] > 0 and "reference workload" in res.output
    if sample() is not None:
        assert 0 <= load["others"] <= 1 and 0 <= load["steal"] <= 1
        assert "CPU to others / steal" in res.output


def test_cli_calibrate_rejects_an_impossible_fit_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_engine_fit(monkeypatch, fail="fitted layer_overhead_s = -3e-05 s per layer call")
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["calibrate", "--tiny", "--out", str(out)])
    assert res.exit_code == 1
    assert "rejected, nothing written" in res.output and "layer_overhead_s" in res.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_cli_calibrate_rejects_an_impossible_link_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _fake_engine_fit(monkeypatch)
    no_hardware_check(monkeypatch, ("links.pcie bandwidth 1.3e+22 B/s is above the ceiling",))
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["calibrate", "--tiny", "--out", str(out)])
    assert res.exit_code == 1 and "1.3e+22" in res.output
    assert not seen  # rejected before the op tables and the engine probe
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("end", "way"), [(0.12, "20% slower"), (0.088, "12% faster")])
def test_cli_calibrate_rejects_a_machine_whose_speed_moved_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, end: float, way: str
) -> None:
    _fake_engine_fit(monkeypatch)
    reference_times(monkeypatch, 0.1, end)
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["calibrate", "--tiny", "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "rejected, nothing written" in res.output and way in res.output
    assert "limit 5%" in res.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_cli_calibrate_no_engine_skips_the_engine_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_hardware_check(monkeypatch)
    reference_times(monkeypatch, 0.1, 0.1)
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["calibrate", "--tiny", "--no-engine", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert load_profile(out).ops is None


def test_cli_bad_backend_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    res = runner.invoke(app, ["calibrate", "--backend", "tpu", "--tiny", "--out", str(out)])
    assert res.exit_code == 2
    assert "allowed: cpu, gpu" in res.output
    assert not out.exists()


@pytest.mark.skipif(cupy_status()[0] is not None, reason="a GPU is present here")
def test_cli_gpu_without_gpu_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["calibrate", "--backend", "gpu", "--tiny", "--out", str(tmp_path / "g.json")]
    )
    assert res.exit_code == 2
    assert "cupy" in res.output


def test_cli_out_is_a_directory_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["calibrate", "--tiny", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "directory" in res.output


@pytest.mark.gpu
def test_cli_calibrate_gpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    res = runner.invoke(app, ["calibrate", "--backend", "gpu", "--tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    p = load_profile(out)
    assert "cupy backend" in p.notes and p.gpu.flops_fp16 > 0
    assert len(p.fitted["matmul_float16"]) == len(ProbeConfig.tiny().matmul_shapes)
