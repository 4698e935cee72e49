"""Engine vs simulator, tier by tier: the same arrivals at the same ``now`` values give the
same sequence of hits, misses, admissions (promotions and demotions), pins and evictions in
every tier, item by item.

Engine side: :class:`engine.runtime.weights.TieredWeights` over a real
:class:`engine.tiers.TierStack` (device, host and SSD levels with bytes, over an object store).
Simulator side: :class:`sim.serving.paramstore.WeightStore` driven the way ``sim.serving.replica`` drives it (pin
the resident chunks of a layer, fetch the missing ones pinned as they land, prefetch the next
layer, record the iteration's end), with transfers that take no simulated time, so both sides
hand their caches the same ``now`` values. Each side's every cache call is logged with its
result; the logs must be equal.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import simpy

from engine.cache import TierCache
from engine.chunks import MIN_CHUNK_BYTES
from engine.chunkstore import ChunkStore, write_model
from engine.config import CacheCfg
from engine.runtime.weights import TieredWeights
from engine.tiers import ObjectStoreTier, make_stack
from engine.tiers.chain import TouchReplay
from sim.serving.paramstore import OBJECT, WeightStore

Log = list[tuple[Any, ...]]
F32 = 4


def _record(cache: TierCache, level: int, log: Log, key_of: Any) -> None:
    """Log (level, op, (model, chunk), now, result) for every decision call on ``cache``."""
    lookup, admit, pin, unpin, on_evict = (
        cache.lookup,
        cache.admit,
        cache.pin,
        cache.unpin,
        cache.on_evict,
    )

    def rec_lookup(key: Any, now: float, size: int = 0, color: Any = None) -> bool:
        hit = lookup(key, now, size, color)
        log.append((level, "lookup", key_of(key), now, hit))
        return hit

    def rec_admit(key: Any, size: int, now: float, color: Any = None, **kw: Any) -> bool:
        ok = admit(key, size, now, color, **kw)
        log.append((level, "admit", key_of(key), now, ok))
        return ok

    def rec_pin(key: Any) -> None:
        log.append((level, "pin", key_of(key)))
        pin(key)

    def rec_unpin(key: Any) -> None:
        log.append((level, "unpin", key_of(key)))
        unpin(key)

    def rec_evict(key: Any, size: int, color: Any) -> None:
        log.append((level, "evict", key_of(key)))
        assert on_evict is not None
        on_evict(key, size, color)

    cache.lookup, cache.admit, cache.pin, cache.unpin = rec_lookup, rec_admit, rec_pin, rec_unpin
    cache.on_evict = rec_evict


def _config(policy: tuple[str, dict[str, Any]]) -> CacheCfg:
    return CacheCfg(hbm_policy=policy[0], params=dict(policy[1]))


class Engine:
    """The engine's weight path for several models sharing one stack."""

    def __init__(
        self,
        root: Path,
        models: list[tuple[str, list[int]]],
        caps: tuple[int, int, int],
        policy: tuple[str, dict[str, Any]],
    ) -> None:
        store = ObjectStoreTier(root / "objects")
        # the same config object the simulator's weight store reads (its scenario section)
        self.stack = make_stack(
            store,
            device_bytes=caps[0],
            host_bytes=caps[1],
            ssd_dir=root / "ssd",
            ssd_bytes=caps[2],
            cache=_config(policy),
        )
        levels = self.stack.levels
        assert [lvl.verify for lvl in levels] == [False, False, True]
        touches = TouchReplay()
        self.weights = []
        for g, (name, layer_bytes) in enumerate(models):
            man = write_model(
                store, name, layer_bytes, 11 + g, dtype="float32", chunk_bytes=MIN_CHUNK_BYTES
            )
            store_g = ChunkStore(man, self.stack)
            self.weights.append(TieredWeights(store_g, touches=touches, group=g))
        self.log: Log = []
        index = {name: g for g, (name, _) in enumerate(models)}
        for i, lvl in enumerate(levels):
            _record(lvl.cache, i, self.log, lambda k: (index[k[0]], k[1]))

    def warm(self, now: float) -> None:
        for w in self.weights:
            w.warm(now)

    def iterate(self, m: int, now: float, window: bool) -> None:
        w = self.weights[m]
        for layer in range(w.n_layers):
            w.layer(layer, now)
            if window and layer + 1 < w.n_layers:
                w.fetch(w.missing(layer + 1), now)
            w.release(layer)
        w.touch(now)

    def hits(self) -> list[int]:
        return [int(sum(w.hits[t] for w in self.weights)) for t in (0, 1, 2, 4)]


class Simulator:
    """The simulator's weight store for the same models and capacities, driven as sim.serving.replica
    drives it, with transfers that land at the instant they start."""

    def __init__(
        self,
        tables: list[Any],
        names: list[str],
        caps: tuple[int, int, int],
        policy: tuple[str, dict[str, Any]],
    ) -> None:
        self.env = simpy.Environment()
        models = []
        for idx, (name, t) in enumerate(zip(names, tables, strict=True)):
            counts = [len(t.layer_slice(layer)) for layer in range(t.n_layers)]
            models.append(
                SimpleNamespace(
                    idx=idx,
                    name=name,
                    base=idx << 32,
                    chunk_size=np.asarray(t.size, dtype=np.int64),
                    layer_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    layer_chunks=counts,
                    n_chunks=t.n_chunks,
                    n_layers=t.n_layers,
                    nonempty_layers=sum(1 for c in counts if c),
                    total_bytes=int(np.sum(t.size)),
                )
            )
        env = self.env

        def transfer(path: Any, nbytes: int, priority: int, after: float = 0.0) -> simpy.Event:
            return env.event().succeed(nbytes)

        cache = _config(policy)
        ctx = SimpleNamespace(
            env=env,
            sc=SimpleNamespace(cache=cache, metrics=SimpleNamespace(check_invariants=False)),
            models=models,
            directory=SimpleNamespace(serve=lambda *a: (-1, OBJECT)),
            network=SimpleNamespace(transfer=transfer),
            trace=SimpleNamespace(rec=lambda *a: None),
            metrics=SimpleNamespace(fetch_lat=[]),
        )
        links = {k: None for k in ("pcie", "nvme", "object", "nic")}
        self.ws = WeightStore(ctx, 0, "node0", *caps, links)  # type: ignore[arg-type]
        self.log: Log = []
        self.tier_hits = [0, 0, 0, 0, 0]
        for i, c in enumerate(self.ws.chain.levels):
            _record(c, i, self.log, lambda k: (k >> 32, k & 0xFFFFFFFF))

    def _charge(self, tier: int, count: int, nbytes: int) -> None:
        self.tier_hits[tier] += count

    def warm(self, now: float) -> None:
        self.env.run(until=now) if now > self.env.now else None
        for m in range(len(self.ws.ctx.models)):
            self.ws.preload(m, now)

    def _fetch(self, m: int, layer: int, prio: int, held: list[int] | None) -> None:
        ev = self.ws.fetch(m, layer, self.ws.missing(m, layer), prio, self._charge, held)
        if ev is not None:
            self.env.run(until=ev)

    def iterate(self, m: int, now: float, window: bool) -> None:
        if now > self.env.now:
            self.env.run(until=now)
        ws, mr = self.ws, self.ws.ctx.models[m]
        for layer in range(mr.n_layers):
            nch = mr.layer_chunks[layer]
            self.tier_hits[0] += ws.counts[m][layer]
            held: list[int] = []
            ws.pin_resident(m, layer, held)
            while len(held) < nch:
                self._fetch(m, layer, 0, held)
                ws.pin_resident(m, layer, held)
            if window and layer + 1 < mr.n_layers:
                self._fetch(m, layer + 1, 1, None)
            ws.unpin(held)
        ws.touch(m, now)

    def hits(self) -> list[int]:
        h = self.tier_hits
        return [h[0], h[1], h[2], h[3] + h[4]]


def _run(
    root: Path,
    layer_bytes: list[list[int]],
    fractions: tuple[float, float, float],
    policy: tuple[str, dict[str, Any]],
    schedule: list[int],
    window: bool,
) -> tuple[Engine, Simulator]:
    names = [f"m{i}" for i in range(len(layer_bytes))]
    total = sum(sum(b) for b in layer_bytes)
    caps = (
        int(fractions[0] * total),
        int(fractions[1] * total),
        int(fractions[2] * total),
    )
    eng = Engine(root, list(zip(names, layer_bytes, strict=True)), caps, policy)
    sim = Simulator([w.table for w in eng.weights], names, caps, policy)
    eng.warm(0.0)
    sim.warm(0.0)
    for step, m in enumerate(schedule, start=1):
        eng.iterate(m, float(step), window)
        sim.iterate(m, float(step), window)
    return eng, sim


def _layers(rng: np.random.Generator, n: int) -> list[int]:
    """Layer sizes of 0.5-2.5 chunks (whole float32 elements)."""
    return [
        int(rng.integers(MIN_CHUNK_BYTES // 2, 5 * MIN_CHUNK_BYTES // 2)) // F32 * F32
        for _ in range(n)
    ]


def _assert_same(eng: Engine, sim: Simulator) -> None:
    ops = {op[1] for op in eng.log}
    assert {"admit", "evict", "lookup", "pin"} <= ops, "the case must exercise every decision"
    assert any(op[0] == 1 and op[1] == "admit" for op in eng.log), "no host admission"
    for i, (a, b) in enumerate(zip(eng.log, sim.log, strict=False)):
        assert a == b, f"first difference at call {i}: engine {a} vs simulator {b}"
    assert len(eng.log) == len(sim.log)
    assert eng.hits() == sim.hits()
    for lvl_e, lvl_s in zip(eng.stack.levels, sim.ws.chain.levels, strict=True):
        assert sorted(lvl_e.cache.stats.as_dict().items()) == sorted(lvl_s.stats.as_dict().items())


def test_differential_host_tier_smaller_than_the_model(tmp_path: Path) -> None:
    """HBM 40% and host 60% of the model: reads served by the SSD or the object store are
    promoted into host memory as well as HBM, and host evictions demote to the SSD."""
    rng = np.random.default_rng(1)
    eng, sim = _run(tmp_path, [_layers(rng, 8)], (0.4, 0.6, 2.0), ("lru", {}), [0] * 6, True)
    _assert_same(eng, sim)
    assert eng.hits()[2] > 0, "some reads must be served by the SSD"


def test_differential_two_models_share_a_node(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    schedule = rng.integers(0, 2, 12).tolist()
    eng, sim = _run(
        tmp_path, [_layers(rng, 6), _layers(rng, 5)], (0.45, 0.7, 1.5), ("lru", {}), schedule, True
    )
    _assert_same(eng, sim)


@pytest.mark.parametrize(
    "policy",
    [("lru-k", {"k": 2}), ("color-lru", {"shares": {"m0": 0.5, "m1": 0.2}})],
    ids=["lru-k", "color-lru"],
)
def test_differential_lruk_and_colour_lru(tmp_path: Path, policy: tuple[str, Any]) -> None:
    rng = np.random.default_rng(3)
    schedule = rng.integers(0, 2, 10).tolist()
    eng, sim = _run(
        tmp_path, [_layers(rng, 6), _layers(rng, 6)], (0.5, 0.6, 1.2), policy, schedule, True
    )
    _assert_same(eng, sim)
