"""The engine side of the validation: a validation workload served on the real engine.

:func:`engine_parts` writes the model's weights (:mod:`hwbench.validation_models`) as
verified chunks to a local object store (an fsspec directory under ``workdir``), builds a
tier stack device -> host -> SSD over it (capacities and the device policy from the
workload; host and SSD LRU) and warms it by reading every chunk once. :func:`run_engine`
then serves the workload's requests in real time (:class:`engine.runtime.engine.Engine`,
holding a layer's pins until the prefetches planned at its start have landed, so cache
decisions do not depend on thread timing). The engine's clock: :func:`excludes_cpu_wait`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeAlias

import numpy as np

from engine import backend
from engine.cache import TierCache
from engine.chunkstore import ChunkStore, write_model
from engine.runtime.engine import Engine, EngineResult, EngineWorkload
from engine.runtime.model import DecoderConfig, DecoderModel, DenseConfig, DenseModel
from engine.runtime.weights import TieredWeights
from engine.sched.scheduler import Scheduler
from engine.tiers import DeviceTier, HostTier, Level, ObjectStoreTier, SsdTier, TierStack
from hwbench.validation_models import (
    CHUNK_BYTES,
    HOLD_PINS,
    SEED,
    Sizes,
    model_config,
    sizes,
)
from hwbench.workloads import ValidationWorkload, arrivals

__all__ = [
    "EXCLUDE_CPU_WAIT",
    "EngineParts",
    "engine_for",
    "engine_parts",
    "excludes_cpu_wait",
    "run_engine",
    "workload_for",
]

EXCLUDE_CPU_WAIT = {"cpu": True, "gpu": False}  #: by backend; see excludes_cpu_wait

#: what :func:`engine_parts` returns: the model, its warm weights, the capacities
EngineParts: TypeAlias = tuple[DecoderConfig | DenseConfig, TieredWeights, Sizes]


def excludes_cpu_wait(xp: ModuleType) -> bool:
    """The engine's clock on ``xp`` (:class:`engine.runtime.clock.RunClock`). NumPy: wall time
    less the engine thread's run-queue waits -- its CPU time while it computes (one BLAS
    thread), as the op tables are timed (:func:`hwbench.opprobe.op_clock`), yet advancing
    while it sleeps or waits for its copy thread: preemption leaves both sides. GPU: wall."""
    return EXCLUDE_CPU_WAIT["gpu" if backend.is_gpu(xp) else "cpu"]


def _stack(
    backing: ObjectStoreTier, w: ValidationWorkload, sz: Sizes, workdir: Path, xp: ModuleType
) -> TierStack:
    params = dict(w.policy_params)

    def cache(cap: int, policy: str, name: str, p: dict[str, Any]) -> TierCache:
        return TierCache(cap, policy, p, high_watermark=1.0, low_watermark=1.0, name=name)

    levels = [
        Level(DeviceTier(xp=xp), cache(sz.hbm_weights, w.policy, "device", params)),
        Level(HostTier(xp=xp), cache(sz.host, "lru", "host", {})),
        Level(SsdTier(workdir / "ssd"), cache(sz.ssd, "lru", "ssd", {}), verify=True),
    ]
    return TierStack(levels, backing)


def engine_parts(w: ValidationWorkload, workdir: Path, xp: ModuleType = np) -> EngineParts:
    """Write the model, build and warm the tier stack (device cache = the HBM weight cache)
    on backend ``xp`` (NumPy; CuPy: device memory on the GPU, pinned host memory)."""
    cfg = model_config(w)
    sz = sizes(w, cfg)
    backing = ObjectStoreTier(workdir / "objects")
    manifest = write_model(
        backing, cfg.name, cfg.layer_bytes(), SEED, dtype="float32", chunk_bytes=CHUNK_BYTES
    )
    weights = TieredWeights(ChunkStore(manifest, _stack(backing, w, sz, workdir, xp)), xp)
    weights.warm(0.0)
    return cfg, weights, sz


def run_engine(
    w: ValidationWorkload, workdir: Path, parts: EngineParts | None = None
) -> tuple[EngineResult, TieredWeights]:
    """Serve ``w`` on the engine (see the module docstring). ``parts``: what
    :func:`engine_parts` returned, to reuse a warm stack (else it is built here on NumPy);
    the model runs on the backend of ``parts``' weights."""
    parts = parts if parts is not None else engine_parts(w, workdir)
    eng = engine_for(w, parts)
    return eng.run(workload_for(w)), parts[1]


def engine_for(
    w: ValidationWorkload, parts: EngineParts, sleep: Callable[[float], None] = time.sleep
) -> Engine:
    """The engine that serves ``w`` over the warm stack ``parts`` (see :func:`run_engine`),
    idling with ``sleep`` (a virtual clock's, in tests)."""
    cfg, weights, sz = parts
    xp = weights.xp
    if isinstance(cfg, DecoderConfig):
        model: DecoderModel | DenseModel = DecoderModel(cfg, sz.kv // cfg.kv_bytes_per_token, xp)
        kvb = cfg.kv_bytes_per_token
    else:
        model, kvb = DenseModel(cfg, xp), 0
    sched = Scheduler.single(w.max_batch, w.max_batch_tokens, sz.kv, kvb, 16)
    sched.batch_log = []  # the scheduling-model check compares it (hwbench.schedcheck)
    return Engine(
        model,
        weights,
        sched,
        window=w.window,
        sleep=sleep,
        hold_pins=HOLD_PINS,
        exclude_cpu_wait=excludes_cpu_wait(xp),
    )


def workload_for(w: ValidationWorkload) -> EngineWorkload:
    """``w``'s requests as the engine takes them."""
    t, inp, out = arrivals(w)
    return EngineWorkload(t, inp, out, seed=w.seed)
