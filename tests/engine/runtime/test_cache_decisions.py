"""Identical cache decisions (ARCHITECTURE contract 2): the engine's HBM-tier cache and the
simulator's, fed the same access sequence with the same ``now`` values, hit, miss, admit and
evict identically.

The engine runs a streaming workload (HBM holds 60% of the weights, so every iteration evicts
and re-fetches). Every call the engine makes on its device-level ``TierCache`` is recorded
with its result and the evictions it caused. The simulator for the same workload is built by
``hwbench.validate`` (one node, same capacities, policy, chunking, HBM warm-up); after its
warm-up the HBM cache must hold the engine's chunks, then the recorded calls are replayed on
it, with the simulator's own chunk keys, and must give the same results and evictions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hwbench.validate import engine_parts, run_engine, scenario_dict, sim_catalogue, sizes
from hwbench.workloads import get_workload


def _record(cache: Any, log: list[tuple[Any, ...]], key_of: Any) -> None:
    """Wrap ``cache``'s decision-making calls to append (op, chunk, now, result) to ``log``."""
    admit, lookup, pin, unpin = cache.admit, cache.lookup, cache.pin, cache.unpin
    on_evict = cache.on_evict

    def rec_admit(key: Any, size: int, now: float, color: Any = None, **kw: Any) -> bool:
        log.append(("admit", key_of(key), size, now))
        ok = admit(key, size, now, color, **kw)
        log.append(("admitted", key_of(key), ok))
        return ok

    def rec_lookup(key: Any, now: float, size: int = 0, color: Any = None) -> bool:
        hit = lookup(key, now, size, color)
        log.append(("lookup", key_of(key), size, now, hit))
        return hit

    def rec_pin(key: Any) -> None:
        log.append(("pin", key_of(key)))
        pin(key)

    def rec_unpin(key: Any) -> None:
        log.append(("unpin", key_of(key)))
        unpin(key)

    def rec_evict(key: Any, size: int, color: Any) -> None:
        log.append(("evict", key_of(key)))
        if on_evict is not None:
            on_evict(key, size, color)

    cache.admit, cache.lookup, cache.pin, cache.unpin = rec_admit, rec_lookup, rec_pin, rec_unpin
    cache.on_evict = rec_evict


@pytest.mark.parametrize("policy", ["lru", "lru-k", "pin"])
def test_engine_and_simulator_hbm_caches_decide_identically(tmp_path: Path, policy: str) -> None:
    from sim.cluster import build
    from sim.scenario import validate
    from sim.serving.costmodel import CostModel, load_profile

    w = replace(
        get_workload("stream-045"), hbm_fraction=0.6, seed=3, requests=6, rate=50.0, policy=policy
    )
    # -- engine: record its device cache's calls after warm-up
    cfg, weights, _ = engine_parts(w, tmp_path / "e")
    dev = weights.device
    warm = sorted(k[1] for k in dev)
    log: list[tuple[Any, ...]] = []
    _record(dev, log, lambda k: k[1])
    res, _ = run_engine(w, tmp_path / "e", (cfg, weights, sizes(w, cfg)))
    assert (res.status == 1).all()
    assert any(op[0] == "evict" for op in log), "the workload must stream (evict) to test"
    # -- simulator: the same setup; its HBM cache after warm-up
    trace = tmp_path / "t.csv"
    trace.write_text("time,input_tokens,output_tokens\n0,8,1\n", encoding="utf-8")
    sc = validate(scenario_dict(w, sizes(w, cfg), cfg.name, trace))
    cl = build(sc, 0, sim_catalogue(cfg), load_profile("a100-80gb"), CostModel)
    hbm = cl.ctx.nodes[0].ws.hbm
    assert sorted(k & 0xFFFFFFFF for k in hbm) == warm
    # -- replay the engine's calls on the simulator's cache, recording the same way
    sim_log: list[tuple[Any, ...]] = []
    _record(hbm, sim_log, lambda k: k & 0xFFFFFFFF)
    base = cl.ctx.models[0].base
    for op in log:
        if op[0] == "admit":
            hbm.admit(base | op[1], op[2], op[3])
        elif op[0] == "lookup":
            hbm.lookup(base | op[1], op[3], op[2])
        elif op[0] == "pin":
            hbm.pin(base | op[1])
        elif op[0] == "unpin":
            hbm.unpin(base | op[1])
    assert sim_log == log
    assert sorted(k & 0xFFFFFFFF for k in hbm) == sorted(k[1] for k in dev)


@pytest.mark.parametrize("policy", ["lru"])
def test_engine_run_and_simulator_run_admit_and_evict_the_same_chunks(
    tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stronger: not a replay -- both sides run the workload themselves (requests far apart,
    so each runs alone and the batches are the same) and their HBM admissions, evictions,
    pins and per-tier hit counts agree exactly. (LRU only: the two clocks differ, and LRU-K
    treats references at the *same* time as correlated, which simulated time produces and
    real time does not; LRU-K's equality for equal ``now`` values is the replay test above.)"""
    import engine.runtime.engine as rt
    import hwbench.validate as hv
    from engine.runtime import Engine
    from engine.runtime.clock import VirtualClock

    w = replace(
        get_workload("stream-045"), hbm_fraction=0.6, seed=3, requests=3, rate=1.0, policy=policy
    )
    cfg, weights, sz = engine_parts(w, tmp_path / "e")
    log: list[tuple[Any, ...]] = []
    _record(weights.device, log, lambda k: k[1])
    # The engine runs on a virtual clock: its work takes no time and it sleeps exactly until
    # each arrival, so each request runs alone however slow or busy the machine is (on wall
    # time a loaded machine let requests overlap and the batches, hence decisions, differed).
    vclock = VirtualClock()
    ref = hv.engine_for(w, (cfg, weights, sz))
    eng = Engine(
        ref.model, ref.weights, ref.sched, window=ref.window, hold_pins=ref.hold_pins,
        sleep=vclock.sleep,
    )  # fmt: skip
    monkeypatch.setattr(rt, "RunClock", lambda exclude_cpu_wait=False: vclock)
    res = eng.run(hv.workload_for(w))
    assert (res.status == 1).all()
    sim_log: list[tuple[Any, ...]] = []
    real_build = hv.build

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        cl = real_build(*args, **kwargs)
        _record(cl.ctx.nodes[0].ws.hbm, sim_log, lambda k: k & 0xFFFFFFFF)
        return cl

    hv.build = recording_build
    try:
        from sim.serving.costmodel import load_profile

        # Layers that compute longer than a chunk's transfer (as on the engine's CPU), so
        # the simulator's prefetches land while the current layer is pinned.
        prof = load_profile("a100-80gb")
        prof = prof.model_copy(
            update={"gpu": prof.gpu.model_copy(update={"per_layer_overhead_s": 2e-3})}
        )
        _, sim_hits, _, _, _ = hv.run_simulator(w, prof, tmp_path)
    finally:
        hv.build = real_build

    def decisions(lg: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        # a lookup that misses changes nothing (the engine's stack makes one per fetch,
        # the simulator none); hits (recency replays) do, so they are compared
        ops = ("admit", "evict", "pin", "unpin")
        return [(o[0], o[1]) for o in lg if o[0] in ops or (o[0] == "lookup" and o[4])]

    assert len(decisions(log)) > 20
    assert decisions(log) == decisions(sim_log)
    assert res.tier_hits.tolist() == sim_hits.tolist()
