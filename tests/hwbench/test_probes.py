"""Hardware probes: positive results, sensible ordering, statistics, and the link fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwbench.probes import (
    COPY_LINKS,
    Measurement,
    ProbeConfig,
    attention_probe,
    copy_probe,
    matmul_probe,
    overhead_probe,
    plan,
    quant_probe,
    time_op,
)
from hwbench.profile import fit_link

KiB, MiB = 1024, 1024 * 1024
CFG = ProbeConfig(
    copy_sizes=(4 * KiB, 4 * MiB),
    matmul_shapes=((16, 16, 16), (256, 256, 256)),
    attention_grid=((1, 64), (4, 2048)),
    quant_elems=(16 * KiB,),
    warmup=1,
    repeats=5,
)


def test_time_op_counts_calls() -> None:
    calls: list[str] = []
    times = time_op(lambda: calls.append("x"), 2, 4, before=lambda: calls.append("b"))
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert calls == ["b", "x"] * 6


def check_stats(m: Measurement) -> None:
    assert m.median_s > 0 and m.rate > 0 and m.repeats == CFG.repeats
    assert m.min_s <= m.q25_s <= m.median_s <= m.q75_s <= m.max_s
    row = m.row()
    assert row["median_s"] == m.median_s and all(isinstance(v, float) for v in row.values())


@pytest.mark.parametrize("link", COPY_LINKS)
def test_copy_probe_bigger_copies_take_longer(link: str, tmp_path: Path) -> None:
    small, big = copy_probe(CFG, np, tmp_path, link)
    for m in (small, big):
        check_stats(m)
        assert m.probe == "copy" and m.label == link
    assert (small.params["bytes"], big.params["bytes"]) == (4 * KiB, 4 * MiB)
    assert big.min_s > small.min_s  # 1024x the bytes
    assert not list((tmp_path / "objects").rglob("probe-*"))  # scratch objects cleaned up


def test_copy_probe_unknown_link(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed"):
        copy_probe(CFG, np, tmp_path, "cpu->moon")


def test_matmul_attention_quant_overheads() -> None:
    small, big = matmul_probe(CFG, np, "float32")
    assert big.work == 2 * 256**3 and big.min_s > small.min_s
    check_stats(big)
    short, long_ = attention_probe(CFG, np)
    assert long_.params == {
        "batch": 4.0, "context": 2048.0, "heads": 8.0, "kv_heads": 8.0, "head_dim": 64.0
    }  # fmt: skip
    assert long_.min_s > short.min_s
    q = quant_probe(CFG, np)
    assert sorted(m.label for m in q) == sorted(
        f"{f}-{d}" for f in ("fp16", "int8", "int4") for d in ("encode", "decode")
    )
    for m in q:
        check_stats(m)
    op, layer = overhead_probe(CFG, np)
    assert (op.label, layer.label) == ("op", "layer")
    assert layer.median_s > op.median_s > 0


def test_plan_on_cpu_has_every_probe(tmp_path: Path) -> None:
    names = [s.name for s in plan(CFG, np, tmp_path)]
    assert names == [f"copy {lk}" for lk in COPY_LINKS] + [
        "matmul float32",
        "attention",
        "quantisation",
        "overheads",
    ]


@given(
    latency=st.floats(0.0, 1e-2),
    bandwidth=st.floats(1e6, 1e12),
    sizes=st.lists(st.integers(1, 2**30), min_size=2, max_size=8, unique=True),
)
def test_fit_link_recovers_exact_lines(latency: float, bandwidth: float, sizes: list[int]) -> None:
    times = [latency + s / bandwidth for s in sizes]
    lat, bw = fit_link(sizes, times)
    assert bw > 0 and lat >= 0
    pred = [lat + s / bw for s in sizes]
    assert np.allclose(pred, times, rtol=1e-6, atol=1e-12)


def test_fit_link_degenerate_inputs() -> None:
    lat, bw = fit_link([1000, 2000], [1e-3, 1e-3])  # no growth with size
    assert lat >= 0 and bw > 0
    assert fit_link([4096], [1e-3]) == (0.0, pytest.approx(4096 / 1e-3))
    with pytest.raises(ValueError, match="positive size"):
        fit_link([0], [1.0])


def test_fit_link_ignores_cache_resident_sizes_for_bandwidth() -> None:
    """Small copies served from CPU caches run faster than DRAM; with a 256 KiB threshold
    the bandwidth comes from the big copies and the latency from the small ones."""
    sizes = [4096, 65536, 2**20, 2**22, 2**24]
    dram_bw, cache_bw, lat = 5e9, 50e9, 1e-6
    times = [lat + s / (cache_bw if s < 2**18 else dram_bw) for s in sizes]
    lat_fit, bw = fit_link(sizes, times, 2**18)
    assert bw == pytest.approx(dram_bw, rel=1e-6)
    assert lat_fit == 0.0  # small copies beat the DRAM line: clamped, never negative
    lat_fit, bw = fit_link(sizes, [2e-6 + s / dram_bw for s in sizes], 2**18)
    assert (lat_fit, bw) == (pytest.approx(2e-6), pytest.approx(dram_bw))
