"""Pool layout on servers, per-pool GPU types, and bad pool input (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.errors import InputError
from pdsim.cli import app
from sim.disagg.layout import place_pools, servers_used
from sim.serving.metrics import DONE

from .conftest import run, scenario

ROOT = Path(__file__).resolve().parents[3]


def test_packed_alternates_pools_and_fills_servers() -> None:
    slots = place_pools(2, 2, 2, 2, gpus_per_server=8, placement="packed")
    assert [(s.role, s.server, s.gpu) for s in slots] == [
        ("prefill", 0, 0), ("decode", 0, 2), ("prefill", 0, 4), ("decode", 0, 6),
    ]  # fmt: skip
    # widths align: a tp=4 replica after a tp=1 one starts at GPU 4
    slots = place_pools(1, 1, 2, 4, gpus_per_server=8, placement="packed")
    assert [(s.role, s.server, s.gpu) for s in slots] == [
        ("prefill", 0, 0), ("decode", 0, 4), ("decode", 1, 0),
    ]  # fmt: skip
    assert servers_used(slots) == 2


def test_split_starts_the_decode_pool_on_a_fresh_server() -> None:
    slots = place_pools(3, 1, 2, 2, gpus_per_server=8, placement="split")
    assert {s.server for s in slots if s.role == "prefill"} == {0}
    assert {s.server for s in slots if s.role == "decode"} == {1}


def test_a_tp_that_does_not_divide_a_server_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"disaggregation\.decode\.tp.*use tp in 1, 2, 4, 8"):
        place_pools(1, 1, 1, 3, gpus_per_server=8)


def test_each_pool_runs_on_its_own_gpu_type() -> None:
    cl = run(
        scenario(
            workload={"requests": 6},
            disaggregation={
                "prefill": {"replicas": 1, "tp": 1},
                "decode": {"replicas": 1, "tp": 1, "profile": "h100-sxm-vllm"},
            },
        )
    )
    co = cl.ctx.disagg
    pre, dec = co.prefill[0], co.decode[0]
    assert pre.ctx.models[0].cost.profile.name == "h200-sxm-vllm"
    assert dec.ctx.models[0].cost.profile.name == "h100-sxm-vllm"
    assert dec.kv.capacity < pre.kv.capacity  # 79 GiB vs 139 GiB of HBM per GPU
    assert (cl.ctx.metrics.status == DONE).all()


def test_bad_pool_exits_2_naming_the_field(tmp_path: Path) -> None:
    scen = ROOT / "scenarios" / "disagg-llama8b-h200.yaml"
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app, ["run", str(scen), "--set", "disaggregation.decode.tp=3", "--out", str(out)]
    )
    assert r.exit_code == 2
    assert "disaggregation.decode.tp" in r.output and "use tp in 1, 2, 4, 8" in r.output
    assert not out.exists()
    r = CliRunner().invoke(
        app, ["run", str(scen), "--set", "disaggregation.prefill.profile=nope", "--out", str(out)]
    )
    assert r.exit_code == 2 and "disaggregation.prefill.profile" in r.output
    assert not out.exists()
