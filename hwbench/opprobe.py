"""Op tables measured on the engine's array backend, in the schema of :mod:`sim.serving.opcost`.

``pdsim calibrate`` times the kernels the engine runs, one op at a time, on the backend it
serves with (NumPy on a CPU, CuPy on a GPU: :mod:`engine.backend`), and writes them as the
profile's ``ops`` section -- the same tables an imported aiconfigurator profile carries:

* **GEMM** (:class:`sim.serving.opcost.GemmTable`, dtype ``fp32``: the engine computes in float32)
  -- ``x @ w`` with ``x`` ``[m, k]`` and ``w`` ``[k, n]``, over the knots of
  :class:`OpGrid` (every knot combination; interpolation fills the rest), twice: with the
  weights cold (read from memory, as for a model larger than the last-level cache) and
  resident in that cache (as for a model that fits in it; ``resident_bytes``);
* **attention** (decode and prefill) and the **elementwise ops** (norm, activation,
  embedding) -- timed in place, inside the engine's own layer loop
  (:mod:`hwbench.insitu_probe`), because alone they do not cost what they cost there;
* **op floor** -- the median of one tiny elementwise op (``ops.roofline.op_floor_s``): what
  every op no table covers pays at least.

Every table is timed with the process's allocator in the engine's regime
(:func:`engine.runtime.heap.keep_freed_memory`).

Each point is the median of ``repeats`` timed calls after ``warmup`` untimed ones (on a GPU
every timed call ends with a device synchronisation). A table's :class:`sim.serving.opcost.TableOrigin`
says which device, backend and library were timed and when. Nothing here is fitted: the
engine's own terms (per-layer and per-iteration overheads) are fitted on whole iterations
with these tables held fixed (:mod:`hwbench.engine_fit`).
"""

from __future__ import annotations

import datetime as _dt
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from engine import backend
from engine.runtime.heap import keep_freed_memory
from hwbench.insitu_probe import insitu_tables
from hwbench.probes import syncer, time_op
from sim.serving.costmodel import Profile
from sim.serving.opcost import (
    AttentionTable,
    ElementwiseTable,
    GemmTable,
    Grid3,
    OpsProfile,
    RooflineTerms,
    TableOrigin,
)

__all__ = [
    "OpGrid",
    "cache_bytes",
    "gemm_table",
    "measure_ops",
    "op_clock",
    "op_floor",
    "origin",
    "weight_pool",
    "with_op_tables",
]


@dataclass(frozen=True)
class OpGrid:
    """Knots of the measured tables (all ascending, > 0) and how to time each point."""

    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    #: (query heads, KV heads) layouts of the attention tables, head size ``head_dim``
    layouts: tuple[tuple[int, int], ...]
    head_dim: int
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    prefill_batch: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    warmup: int = 2
    repeats: int = 7

    @classmethod
    def quick(cls) -> OpGrid:
        """``pdsim calibrate --quick``: GEMM dimensions 256-4096, 4 and 8 heads of 64."""
        return cls(
            m=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            n=(256, 1024, 2048, 4096),
            k=(256, 512, 1024, 2048),
            layouts=((4, 4), (8, 8)),
            head_dim=64,
            decode_batch=(1, 2, 4, 8, 16),
            decode_context=(16, 64, 128, 256, 512, 768),
            prefill_batch=(1, 2, 4),
            # attention grows as the square of the prompt: knots 1.5x apart keep the
            # linear interpolation between them within ~4% (2x apart: up to 12% over)
            prefill_tokens=(16, 64, 128, 192, 256, 384, 512, 768),
            repeats=5,
        )

    @classmethod
    def full(cls) -> OpGrid:
        """More knots and repeats than :meth:`quick`."""
        q = cls.quick()
        return cls(
            m=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024),
            n=(256, 512, 1024, 2048, 3072, 4096),
            k=(256, 512, 1024, 1536, 2048, 4096),
            layouts=q.layouts,
            head_dim=q.head_dim,
            decode_batch=(1, 2, 4, 8, 12, 16, 24),
            decode_context=(16, 32, 64, 128, 256, 384, 512, 768, 1024),
            prefill_batch=(1, 2, 4, 8),
            prefill_tokens=(16, 32, 64, 128, 192, 256, 384, 512),
            repeats=11,
        )

    @classmethod
    def tiny(cls) -> OpGrid:
        """A few seconds (tests): two knots per axis, one layout."""
        return cls(
            m=(1, 64),
            n=(256, 1024),
            k=(256, 1024),
            layouts=((4, 4),),
            head_dim=64,
            decode_batch=(1, 4),
            decode_context=(16, 128),
            prefill_batch=(1, 2),
            prefill_tokens=(16, 64),
            warmup=1,
            repeats=3,
        )


def op_clock(xp: ModuleType) -> Callable[[], float]:
    """The clock op tables are timed on: on a GPU, wall time (each call ends with a device
    synchronisation, so it covers the kernel); on NumPy, the calling thread's CPU time
    (``time.thread_time``). With ``OPENBLAS_NUM_THREADS=1`` a NumPy op runs on the calling
    thread only, so its CPU time is its cost on an idle core; a preempted thread accrues
    none, so preemption by other processes does not enter the tables (their use of the
    shared caches and memory bus still does). The engine probe times its iterations on
    the matching clock (:func:`hwbench.validation_engine.excludes_cpu_wait`)."""
    return time.perf_counter if backend.is_gpu(xp) else time.thread_time


def _median(
    fn: Callable[[], object], grid: OpGrid, sync: Callable[[], None], xp: ModuleType = np
) -> float:
    return float(np.median(time_op(fn, grid.warmup, grid.repeats, sync, clock=op_clock(xp))))


def origin(xp: ModuleType, when: _dt.datetime, what: str) -> TableOrigin:
    """Where and when a table is measured: the device (CPU model or GPU name), the array
    library and version, and the ``pdsim calibrate`` run."""
    if backend.is_gpu(xp):
        props = xp.cuda.runtime.getDeviceProperties(0)
        raw = props.get("name", b"gpu")
        device = raw.decode() if isinstance(raw, bytes) else str(raw)
        framework = f"cupy {xp.__version__}"
    else:
        device = platform.processor() or platform.machine() or "cpu"
        framework = f"numpy {np.__version__}"
    return TableOrigin(
        device=device,
        framework=framework,
        measured_at=when.date().isoformat(),
        source=f"pdsim calibrate on {platform.node() or 'unknown'} ({what})",
    )


def op_floor(xp: ModuleType, grid: OpGrid) -> float:
    """Seconds of one tiny elementwise op (64 floats): the floor every untabled op pays."""
    a = xp.ones((1, 64), dtype=xp.float32)
    b = xp.ones((1, 64), dtype=xp.float32)
    return _median(lambda: a + b, grid, syncer(xp), xp)


def cache_bytes(xp: ModuleType) -> int:
    """The last-level cache the weights compete for, bytes: a GPU's L2 (CuPy), else the
    CPU's largest cache level (Linux sysfs); 0 when unknown."""
    if backend.is_gpu(xp):
        return int(xp.cuda.runtime.getDeviceProperties(0).get("l2CacheSize", 0))
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].isalpha() else text
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best


def weight_pool(xp: ModuleType, w_all: Any, k: int, n: int, copies: int) -> list[Any]:
    """``copies`` C-contiguous ``k x n`` weight arrays cut from ``w_all``, each its own
    buffer: a timed call that cycles through them reads weights no other call has just left
    in the caches. (``ascontiguousarray`` of a slice that is already contiguous -- ``n`` the
    full width -- returns that very slice, so every "copy" would be one buffer, hot in the
    caches: the cold table's widest column read about 130 GB/s on a machine whose memory
    gives 37-81.)"""
    return [xp.array(w_all[:k, :n], order="C", copy=True) for _ in range(copies)]


def gemm_table(
    xp: ModuleType, grid: OpGrid, org: TableOrigin, resident_bytes: int = 0
) -> GemmTable:
    """``x @ w`` (float32) at every ``(m, n, k)`` knot of ``grid``, each timed call reading
    the next copy of ``w`` from a pool: ``resident_bytes`` 0 -- a pool twice the last-level
    cache (:func:`cache_bytes`), so the weights come from memory, as they do for a model
    larger than that cache; > 0 -- a pool of half ``resident_bytes`` (at least one copy), so
    the weights sit in that cache but not in the smaller ones, as a model's weights do when
    they fit in it and the engine cycles through its layers."""
    sync = syncer(xp)
    rng = np.random.default_rng(11)
    big_m, big_n, big_k = max(grid.m), max(grid.n), max(grid.k)
    x_all = xp.asarray(rng.standard_normal((big_m, big_k), dtype=np.float32))
    w_all = xp.asarray(rng.standard_normal((big_k, big_n), dtype=np.float32))
    pool_bytes = resident_bytes // 2 if resident_bytes else 2 * cache_bytes(xp)
    secs = np.zeros((len(grid.m), len(grid.n), len(grid.k)))
    for j, n in enumerate(grid.n):
        for li, k in enumerate(grid.k):
            copies = min(max(1, -(-pool_bytes // (4 * k * n))), 1024)
            pool = weight_pool(xp, w_all, k, n, copies)
            turn = [0]
            for i, m in enumerate(grid.m):
                # contiguous operands, as the engine's activations and weight views are
                x = xp.ascontiguousarray(x_all[:m, :k])

                def call(x: Any = x, pool: list[Any] = pool, turn: list[int] = turn) -> object:
                    turn[0] = (turn[0] + 1) % len(pool)
                    return x @ pool[turn[0]]

                secs[i, j, li] = _median(call, grid, sync, xp)
            del pool
    g = Grid3(m=list(grid.m), n=list(grid.n), k=list(grid.k), latency_s=secs.tolist())
    kernel = f"{backend.name(xp)} matmul, weights " + (
        f"resident in {resident_bytes} B of cache" if resident_bytes else "cold (from memory)"
    )
    return GemmTable(origin=org, dtype="fp32", kernel=kernel, resident_bytes=resident_bytes, grid=g)


def measure_ops(
    xp: ModuleType, grid: OpGrid, when: _dt.datetime | None = None
) -> tuple[list[GemmTable], list[AttentionTable], list[ElementwiseTable], float]:
    """The GEMM tables (cold weights; and, where the last-level cache size is known,
    weights resident in it), the attention and elementwise tables (timed in place, inside
    the engine's layer loop: :mod:`hwbench.insitu_probe`) and the op floor (seconds) on
    ``xp``. Fixes the process's allocator regime first, as the engine does
    (:func:`engine.runtime.heap.keep_freed_memory`)."""
    keep_freed_memory()
    when = when or _dt.datetime.now(_dt.UTC)
    org = origin(xp, when, f"{len(grid.m)}x{len(grid.n)}x{len(grid.k)} GEMM knots")
    gemms = [gemm_table(xp, grid, org)]
    llc = cache_bytes(xp)
    if llc > 0:
        gemms.append(gemm_table(xp, grid, org, resident_bytes=llc))
    situ_org = origin(xp, when, "in place, in the engine's layer loop")
    situ = insitu_tables(xp, grid, situ_org, clock=op_clock(xp))
    return gemms, situ.attention, situ.elementwise, op_floor(xp, grid)


def with_op_tables(profile: Profile, xp: ModuleType, grid: OpGrid) -> Profile:
    """``profile`` with an ``ops`` section measured on ``xp`` (:func:`measure_ops`): the
    tables, and a roofline for the ops no table covers at the profile's measured memory
    bandwidth (``memory_efficiency`` 1) plus the measured op floor. ``rope`` is marked
    fused: the engine applies no positional rotation, so it runs no such op."""
    gemms, attention, ew, floor = measure_ops(xp, grid)
    roof = RooflineTerms(memory_efficiency=1.0, op_floor_s=floor, fused=["rope"])
    ops = OpsProfile(roofline=roof, gemm=gemms, attention=attention, elementwise=ew)
    return profile.model_copy(update={"ops": ops})
