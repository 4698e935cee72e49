"""Importing aiconfigurator's kernel tables: a synthetic table directory in the package's
layout round-trips through the importer, the profile JSON and the cost model; with the
package installed, the import reproduces the shipped profile."""

from __future__ import annotations

import importlib.util
import json
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from pdsim.cli import app
from sim.serving.costmodel import load_profile, parse_profile
from sim.serving.costmodel import load_profile as load_op_profile
from sim.serving.models import LlamaShape, ModelEntry, build_model
from sim.serving.opcost import OpCostModel
from sim.serving.opcost.aic_import import import_aiconfigurator, installed_systems_dir

DEV = {"framework": "VLLM", "version": "0.9.0", "device": "NVIDIA Test"}
MS = [1, 2, 4, 8]
NK = [64, 128, 256]
MISSING = (4, 256, 256)


def gemm_ms(m: int, n: int, k: int) -> float:
    """Latency in ms with at most 4 significant digits (the importer rounds to 4)."""
    return round(0.001 + m * n * k * 1e-9, 4)


def write_systems(root: Path) -> Path:
    """A systems directory with one system ``synth`` in aiconfigurator's layout."""
    sysdir = root / "systems"
    (sysdir).mkdir(parents=True)
    (sysdir / "synth.yaml").write_text(
        "gpu:\n  mem_bw: 2.0e12\n  mem_bw_empirical_scaling_factor: 0.75\n"
        "  mem_empirical_constant_latency: 0.000004\n  mem_capacity: 68719476736\n"
        "  bfloat16_tc_flops: 5.0e14\nnode:\n  intra_node_bw: 3.0e11\n  inter_node_bw: 2.5e10\n"
        "  pcie_bw: 3.2e10\n  p2p_latency: 0.00001\n"
    )

    def put(family: str, ver: str, name: str, rows: list[dict[str, object]]) -> None:
        d = sysdir / "data" / "synth" / family / "vllm" / ver
        d.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([{**DEV, **r} for r in rows]).to_parquet(d / name)

    gemm = [
        {"op_name": "gemm", "kernel_source": "torch.nn.functional.linear", "gemm_dtype": "bfloat16",
         "m": m, "n": n, "k": k, "latency": gemm_ms(m, n, k)}
        for m in MS for n in NK for k in NK if (m, n, k) != MISSING
    ]  # fmt: skip
    put("gemm", "0.9.0", "gemm_perf.parquet", gemm)
    # an older version with other numbers: the importer takes the newest
    put("gemm", "0.10.0rc1", "gemm_perf.parquet", gemm[:0] or [{**gemm[0], "latency": 9.0}])
    put("gemm", "0.11.0", "gemm_perf.parquet", gemm)
    attn = []
    for phase, col in (("context_attention", "isl"), ("generation_attention", "step")):
        for b in (1, 4):
            for x in (15, 127, 1023):
                for kv in ("bfloat16", "fp8"):
                    attn.append(
                        {"op_name": phase, "kernel_source": "fa", "batch_size": b, "isl": 1,
                         "step": 0, col: x, "num_heads": 8, "num_key_value_heads": 2,
                         "head_dim": 128, "beam_width": 1, "attn_dtype": "bfloat16",
                         "kv_cache_dtype": kv, "window_size": 0,
                         "latency": round(0.01 * b + x * 1e-5, 5) + (1.0 if kv == "fp8" else 0)}
                    )  # fmt: skip
    put("attention", "0.9.0", "context_attention_perf.parquet",
        [r for r in attn if r["op_name"] == "context_attention"])  # fmt: skip
    put("attention", "0.9.0", "generation_attention_perf.parquet",
        [r for r in attn if r["op_name"] == "generation_attention"])  # fmt: skip
    ar = [
        {"op_name": "all_reduce", "kernel_source": ks, "allreduce_dtype": "bfloat16",
         "num_gpus": g, "message_size": s, "latency": round(0.004 + s * g * 1e-9, 6) + extra,
         "backend": be}
        for g in (2, 4) for s in (1024, 65536, 4194304)
        for ks, be, extra in (("custom_graph", "vllm_graph", 0.0), ("custom_eager", "vllm_eager", 1.0))
    ]  # fmt: skip
    put("comm", "0.9.0", "custom_allreduce_perf.parquet", ar)
    return sysdir


def test_synthetic_tables_round_trip(tmp_path: Path) -> None:
    sysdir = write_systems(tmp_path)
    base = load_profile("h200-sxm")
    prof = import_aiconfigurator("synth", "vllm", base, "synth-vllm", sysdir)
    assert parse_profile(prof.model_dump_json(), "x.json") == prof
    assert prof.gpu.hbm_bandwidth == 2.0e12 and prof.gpu.flops_fp16 == 5.0e14
    assert prof.links.nvlink.bandwidth == 3.0e11 and prof.host == base.host
    ops = prof.ops
    assert ops is not None
    assert ops.roofline.memory_efficiency == 0.75 and ops.roofline.op_floor_s == 4e-6
    (g,) = ops.gemm
    assert g.origin.device == "NVIDIA Test" and g.origin.framework == "vllm 0.9.0"
    assert "0.11.0" in g.origin.source  # the newest version directory
    assert (g.grid.m, g.grid.n, g.grid.k) == (MS, NK, NK)
    assert "1 of 36 cells estimated" in g.kernel
    for i, m in enumerate(MS):
        for j, n in enumerate(NK):
            for li, k in enumerate(NK):
                if (m, n, k) != MISSING:
                    assert g.grid.latency_s[i][j][li] == pytest.approx(gemm_ms(m, n, k) * 1e-3)
    # the missing cell: nearest measured (n, k) at the same m, scaled by n * k
    assert g.grid.latency_s[2][2][2] == pytest.approx(gemm_ms(4, 128, 256) * 1e-3 * 2, rel=1e-3)
    pre = next(t for t in ops.attention if t.phase == "prefill")
    dec = next(t for t in ops.attention if t.phase == "decode")
    assert len(ops.attention) == 2 and (pre.heads, pre.kv_heads, pre.head_dim) == (8, 2, 128)
    assert pre.curves.x[0] == [15, 127, 1023] and dec.curves.x[0] == [16, 128, 1024]
    assert dec.curves.latency_s[1][2] == pytest.approx((0.04 + 1023e-5) * 1e-3)  # bf16 KV row
    assert [t.group for t in ops.all_reduce] == [2, 4]
    assert ops.all_reduce[0].bytes == [2048, 131072, 8388608]
    # the CUDA-graph rows (eager ones are 1 ms slower), 4 significant digits
    assert ops.all_reduce[1].latency_s[0] == pytest.approx((0.004 + 1024 * 4e-9) * 1e-3, rel=1e-3)

    # the cost model reads the imported tables: exact at knots, sources say so
    shape = LlamaShape(family="llama", n_layers=1, hidden=1024, heads=8, kv_heads=2,
                       ffn=512, vocab=256)  # fmt: skip
    cm = OpCostModel(prof, build_model(ModelEntry(name="t", kind="decoder", shape=shape)), tp=1)
    assert cm.gemm_time(2, 128, 64) == (pytest.approx(gemm_ms(2, 128, 64) * 1e-3), "table")
    assert cm.decode_attention_time(4, 4 * 128.0) == (
        pytest.approx((0.04 + 127e-5) * 1e-3),
        "table",
    )


def test_cli_import_writes_a_profile_and_bad_input_writes_nothing(tmp_path: Path) -> None:
    sysdir = write_systems(tmp_path)
    out = tmp_path / "out" / "p.json"
    runner = CliRunner()
    args = ["profile", "import", "aiconfigurator", "--systems-dir", str(sysdir), "--out", str(out)]
    res = runner.invoke(app, [*args, "--system", "synth", "--backend", "vllm"])
    assert res.exit_code == 0, res.output
    prof = load_op_profile(out)
    assert prof.name == "synth-vllm" and prof.ops is not None and len(prof.ops.gemm) == 1
    bad = tmp_path / "bad.json"
    for extra, needle in (
        (["--system", "nope"], "allowed: synth"),
        (["--system", "synth", "--backend", "trtllm"], "no gemm"),
    ):
        res = runner.invoke(app, [*args[:-1], str(bad), *extra])
        assert res.exit_code == 2 and needle in res.output, res.output
        assert not bad.exists()
    res = runner.invoke(app, ["profile", "import", "elsewhere", "--out", str(bad)])
    assert res.exit_code == 2 and "allowed: aiconfigurator" in res.output
    assert not bad.exists()


#: the aiconfigurator release the shipped ``a100-sxm-vllm`` profile was imported from
SHIPPED_FROM = "0.12.0"


@pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None,
    reason="aiconfigurator not installed (pip install -e '.[aic]')",
)
def test_installed_package_reproduces_the_shipped_profile() -> None:
    """The shipped profile is the import of aiconfigurator SHIPPED_FROM with one edit: its
    ``gpu.hbm_bytes`` is the usable HBM of the datasheet profile (commit 6402e81, as for the
    H100/H200 imports), where the import takes the package's ``mem_capacity``."""
    shipped = load_op_profile("a100-sxm-vllm")
    assert shipped.ops is not None
    assert f"aiconfigurator {SHIPPED_FROM}:" in (shipped.ops.gemm[0].origin.source or "")
    installed = version("aiconfigurator")
    if installed != SHIPPED_FROM:
        pytest.skip(
            f"installed aiconfigurator {installed}, the shipped a100-sxm-vllm profile was "
            f"imported from {SHIPPED_FROM}: its tables differ by release"
        )
    base = load_profile("a100-80gb")
    got = import_aiconfigurator("a100_sxm", "vllm", base, "a100-sxm-vllm")
    systems, _ = installed_systems_dir()
    spec = yaml.safe_load((systems / "a100_sxm.yaml").read_text())
    assert got.gpu.hbm_bytes == spec["gpu"]["mem_capacity"]
    assert shipped.gpu.hbm_bytes == base.gpu.hbm_bytes < got.gpu.hbm_bytes
    want = json.loads(shipped.model_dump_json())
    want["gpu"]["hbm_bytes"] = got.gpu.hbm_bytes
    assert json.loads(got.model_dump_json()) == want
