"""The engine end to end: streamed weights give the resident run's logits; records and
counters follow the simulator's schema and rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.cache import TierCache
from engine.chunks import MIN_CHUNK_BYTES
from engine.chunkstore import ChunkStore, write_model
from engine.runtime.engine import Engine, EngineWorkload
from engine.runtime.model import DecoderConfig, DecoderModel, DenseConfig, DenseModel
from engine.runtime.weights import ResidentWeights, TieredWeights
from engine.sched.scheduler import Scheduler
from engine.tiers import DeviceTier, HostTier, Level, ObjectStoreTier, SsdTier, TierStack

CFG = DecoderConfig("tiny", n_blocks=3, hidden=128, heads=4, kv_heads=4, ffn=256, vocab=300)
CB = MIN_CHUNK_BYTES


def tiered(tmp: Path, cfg: DecoderConfig | DenseConfig, device_bytes: int) -> TieredWeights:
    store = ObjectStoreTier(tmp / "obj")
    man = write_model(store, cfg.name, cfg.layer_bytes(), 5, dtype="float32", chunk_bytes=CB)
    total = sum(cfg.layer_bytes())
    levels = [
        Level(DeviceTier(), TierCache(device_bytes, "lru", high_watermark=1.0, low_watermark=1.0)),
        Level(HostTier(), TierCache(2 * total, "lru", high_watermark=1.0, low_watermark=1.0)),
        Level(
            SsdTier(tmp / "ssd"),
            TierCache(2 * total, "lru", high_watermark=1.0, low_watermark=1.0),
            verify=True,
        ),
    ]
    return TieredWeights(ChunkStore(man, TierStack(levels, store)))


def workload(n: int = 6, gap: float = 0.0) -> EngineWorkload:
    rng = np.random.default_rng(3)
    return EngineWorkload(np.arange(n) * gap, rng.integers(5, 40, n), rng.integers(1, 6, n), seed=9)


def sched(kvb: int, max_batch: int = 4) -> Scheduler:
    return Scheduler.single(max_batch, 4096, 1 << 30, kvb, 16)


def test_streaming_through_the_tiers_gives_the_resident_logits(tmp_path: Path) -> None:
    total = sum(CFG.layer_bytes())
    tw = tiered(tmp_path, CFG, device_bytes=total // 2)  # half the weights: layers stream
    tw.warm()
    wl = workload()
    streamed = Engine(
        DecoderModel(CFG, 2048), tw, sched(CFG.kv_bytes_per_token), window=2, keep_logits=True
    ).run(wl)
    assert streamed.tier_hits[1] > 0  # really streamed from host memory
    rw = ResidentWeights(5, CFG.layer_bytes())
    resident = Engine(
        DecoderModel(CFG, 2048), rw, sched(CFG.kv_bytes_per_token), keep_logits=True
    ).run(wl)
    assert streamed.tokens == resident.tokens
    for a, b in zip(streamed.logits, resident.logits, strict=True):
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert (streamed.status == 1).all()


def test_records_have_the_simulator_schema_and_consistent_times(tmp_path: Path) -> None:
    from sim.serving.metrics import TIERS

    tw = tiered(tmp_path, CFG, device_bytes=sum(CFG.layer_bytes()) // 2)
    tw.warm()
    wl = workload(8, gap=0.01)
    res = Engine(DecoderModel(CFG, 4096), tw, sched(CFG.kv_bytes_per_token), window=1).run(wl)
    df = res.frame("tiny")
    cols = [
        "request_id",
        "model",
        "cls",
        "arrival",
        "start",
        "first_token",
        "end",
        "input_tokens",
        "output_tokens",
        "status",
        "node",
        "param_wait_s",
    ]
    cols += [f"hits_{t}" for t in TIERS] + [f"bytes_{t}" for t in TIERS]
    assert list(df.columns) == cols
    assert (df["arrival"] <= df["start"]).all()
    assert (df["start"] <= df["first_token"]).all() and (df["first_token"] <= df["end"]).all()
    assert [len(t) for t in res.tokens] == wl.out.tolist()
    # every iteration counts every chunk once as hbm-resident or fetched (no counts lost)
    n_chunks = tw.table.n_chunks
    assert res.tier_hits.sum() >= res.iterations * n_chunks
    assert df[[f"hits_{t}" for t in TIERS]].to_numpy().sum(axis=1).min() >= n_chunks
    # bytes are split over each iteration's batch; prefetches charged while no request runs
    # belong to nobody (as in the simulator), so the per-request sum is at most the total
    assert 0 < df["bytes_host"].sum() <= res.tier_bytes[1] * (1 + 1e-9)


def test_all_resident_counts_only_hbm_hits(tmp_path: Path) -> None:
    tw = tiered(tmp_path, CFG, device_bytes=2 * sum(CFG.layer_bytes()))
    tw.warm()
    res = Engine(DecoderModel(CFG, 2048), tw, sched(CFG.kv_bytes_per_token), window=2).run(
        workload()
    )
    assert res.tier_hits[0] == res.iterations * tw.table.n_chunks
    assert res.tier_hits[1:].sum() == 0 and res.tier_bytes.sum() == 0


def test_too_long_request_is_rejected_not_stuck(tmp_path: Path) -> None:
    rw = ResidentWeights(5, CFG.layer_bytes())
    s = Scheduler.single(4, 4096, 40 * 16 * CFG.kv_bytes_per_token // 16, CFG.kv_bytes_per_token, 16)
    wl = EngineWorkload(np.zeros(2), np.array([10, 500]), np.array([2, 2]))
    res = Engine(DecoderModel(CFG, 2048), rw, s).run(wl)
    assert res.status.tolist() == [1, 3]


def test_dense_model_serves_one_output_per_request(tmp_path: Path) -> None:
    cfg = DenseConfig("dense", (64, 128, 32))
    tw = tiered(tmp_path, cfg, device_bytes=2 * sum(cfg.layer_bytes()))
    tw.warm()
    wl = EngineWorkload(np.zeros(5), np.ones(5, dtype=np.int64), np.ones(5, dtype=np.int64))
    res = Engine(DenseModel(cfg), tw, Scheduler.single(8, 64, 1, 0, 16)).run(wl)
    assert res.iterations == 1 and (res.status == 1).all()
    assert all(len(t) == 1 for t in res.tokens)


def test_prefetch_knobs_come_from_the_scenarios_config_object(tmp_path: Path) -> None:
    """The engine reads the simulator's `prefetch` section: window, pin holding and the heat
    map's half-life, which reaches the prefetcher's planner."""
    import pytest

    from engine.config import PrefetchCfg

    tw = tiered(tmp_path, CFG, device_bytes=sum(CFG.layer_bytes()) // 2)
    tw.warm()
    cfg = PrefetchCfg(window_batches=2, heat_half_life="250ms", order="after-pin")
    eng = Engine(DecoderModel(CFG, 2048), tw, sched(CFG.kv_bytes_per_token), prefetch=cfg)
    assert (eng.window, eng.hold_pins, eng.heat_half_life) == (2, True, 0.25)
    res = eng.run(workload(3, gap=0.01))
    assert (res.status == 1).all()
    assert eng.prefetcher is not None
    assert eng.prefetcher.planner.heat.half_life == 0.25
    off = Engine(
        DecoderModel(CFG, 2048),
        tw,
        sched(CFG.kv_bytes_per_token),
        prefetch=PrefetchCfg(enabled=False),
    )
    assert off.window == 0
    with pytest.raises(ValueError, match="either prefetch"):
        Engine(DecoderModel(CFG, 2048), tw, sched(CFG.kv_bytes_per_token), window=1, prefetch=cfg)


def test_warm_assembles_the_resident_multi_chunk_layers(tmp_path: Path) -> None:
    """After ``warm`` a layer of several chunks, all in the device level, is already one
    buffer: ``layer()`` hands out that very buffer (no copy on the first iteration), with
    the chunks' values in order; a layer missing from the device level is not assembled."""
    total = sum(CFG.layer_bytes())
    full = tiered(tmp_path / "full", CFG, device_bytes=2 * total)
    full.warm()
    multi = [i for i in range(full.n_layers) if len(full.keys(i)) > 1]
    assert multi  # the tiny decoder's blocks span several minimum-size chunks
    for i in multi:
        buf = full._bufs[i]
        parts = [p.copy() for p in full._parts[i]]
        assert full.layer(i, 0.0).base is buf
        full.release(i)
        np.testing.assert_array_equal(buf, np.concatenate(parts))
    half = tiered(tmp_path / "half", CFG, device_bytes=total // 2)
    half.warm()
    assert all(i in half._bufs or not all(k in half.device for k in half.keys(i)) for i in multi)
    assert any(i not in half._bufs for i in multi)


def test_a_fetch_returns_the_bytes_it_moved_and_jobs_log_theirs(tmp_path: Path) -> None:
    """``TieredWeights.fetch`` returns the bytes it moved (0 for chunks already resident);
    the prefetcher's job log records each job's moved bytes, which sum to the bytes the
    copy thread read: at most every read's bytes (the engine thread's demand reads are the
    rest)."""
    total = sum(CFG.layer_bytes())
    tw = tiered(tmp_path, CFG, device_bytes=total // 2)
    tw.warm()
    missing = tw.missing(0) or tw.missing(1)
    assert missing
    size = sum(int(tw.table.size[c]) for c in missing)
    before = tw.fetch_bytes
    assert tw.fetch(missing, 0.0) == size
    assert tw.fetch_bytes - before == size
    assert tw.fetch(missing, 0.0) == 0  # resident now: nothing moves
    eng = Engine(DecoderModel(CFG, 2048), tw, sched(CFG.kv_bytes_per_token), window=2)
    start = tw.fetch_bytes
    eng.run(workload())
    assert eng.prefetcher is not None and eng.prefetcher.job_log
    moved = sum(b for _, b in eng.prefetcher.job_log)
    assert 0 < moved <= tw.fetch_bytes - start
    chunk_sizes = {int(s) for s in tw.table.size}
    assert all(b == 0 or b >= min(chunk_sizes) for _, b in eng.prefetcher.job_log)
