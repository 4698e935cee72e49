"""Hardware probes: copy bandwidth and latency per link, matmul rate, attention time,
quantisation codec throughput and fixed per-operation / per-layer overheads (R16).

Every probe runs its operation ``warmup`` times untimed, then ``repeats`` times timed with
``time.perf_counter`` (on a GPU each timed call ends with a device synchronisation), and
reports the **median** and the spread (quartiles, min, max) as a :class:`Measurement`.

Copies go through the engine's real tiers (:mod:`engine.tiers`) so the numbers describe the
code the engine runs:

=================  ===========================================================
link               operation timed
=================  ===========================================================
``object->ssd``    ``ObjectStoreTier.get`` + ``SsdTier.put``
``ssd->host``      ``SsdTier.get`` after the file was flushed and dropped from the
                   page cache (``posix_fadvise(DONTNEED)``) where the OS allows it
``host->host``     ``numpy.copyto`` between two host buffers (DRAM bandwidth)
``host->device``   ``DeviceTier.put`` from a host-tier (pinned on a GPU) buffer
``device->host``   device buffer into a preallocated host-tier buffer
``device->device`` copy between two device buffers (HBM bandwidth)
=================  ===========================================================

Probes never assert anything about time; they only measure. Configurations (sizes, shapes,
repeats) come from :class:`ProbeConfig` (``tiny`` for tests, ``quick``, ``full``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from engine import backend
from engine.kv.attention import paged_decode_attention
from engine.kv.quant import decode, encode
from engine.kv.storage import KVLayout, KVStorage
from engine.tiers import DeviceTier, HostTier, ObjectStoreTier, SsdTier

KiB, MiB = 1024, 1024 * 1024
COPY_LINKS: tuple[str, ...] = (
    "object->ssd",
    "ssd->host",
    "host->host",
    "host->device",
    "device->host",
    "device->device",
)

__all__ = [
    "COPY_LINKS",
    "Measurement",
    "ProbeConfig",
    "Step",
    "plan",
    "run_probes",
    "syncer",
    "time_op",
]


@dataclass(frozen=True)
class Measurement:
    """One probe point. ``params`` are numbers (bytes, m/n/k, batch, context ...); ``work`` is
    what one call moves or computes (bytes or FLOPs), so ``rate = work / median_s``."""

    probe: str  # "copy" | "matmul" | "attention" | "quant" | "overhead"
    label: str  # link, dtype, codec name ...
    params: dict[str, float]
    work: float
    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    max_s: float
    repeats: int

    @property
    def rate(self) -> float:
        """``work / median_s`` (bytes/s or FLOP/s)."""
        return self.work / self.median_s if self.median_s > 0 else float("inf")

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q75_s - self.q25_s) / self.median_s if self.median_s > 0 else 0.0

    def row(self) -> dict[str, float]:
        """A flat row of numbers (for the profile's ``fitted`` tables)."""
        out = {k: float(v) for k, v in self.params.items()}
        out.update(
            work=float(self.work),
            median_s=self.median_s,
            q25_s=self.q25_s,
            q75_s=self.q75_s,
            min_s=self.min_s,
            max_s=self.max_s,
            repeats=float(self.repeats),
            rate=self.rate,
        )
        return out


@dataclass(frozen=True)
class ProbeConfig:
    """What to measure. Use :meth:`tiny`, :meth:`quick` or :meth:`full`."""

    copy_sizes: tuple[int, ...]
    matmul_shapes: tuple[tuple[int, int, int], ...]  # (m, n, k)
    attention_grid: tuple[tuple[int, int], ...]  # (batch, context)
    quant_elems: tuple[int, ...]
    warmup: int = 1
    repeats: int = 5
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    block_tokens: int = 16
    layer_hidden: int = 64  # width of the mini layer timed for the per-layer overhead
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def tiny(cls) -> ProbeConfig:
        """Seconds in all: for tests."""
        return cls(
            copy_sizes=(4 * KiB, 64 * KiB, 1 * MiB),
            matmul_shapes=((32, 32, 32), (128, 128, 128)),
            attention_grid=((1, 64), (2, 256)),
            quant_elems=(64 * KiB,),
            warmup=1,
            repeats=3,
        )

    @classmethod
    def quick(cls) -> ProbeConfig:
        """Under a minute on a laptop: coarse but usable."""
        return cls(
            copy_sizes=(4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB),
            matmul_shapes=(
                (1, 1024, 1024),
                (16, 1024, 1024),
                (64, 256, 256),
                (256, 256, 1024),
                (256, 1024, 256),
                (256, 1024, 1024),
                (1024, 1024, 1024),
            ),
            attention_grid=((1, 512), (4, 512), (1, 2048), (8, 2048)),
            quant_elems=(1 * MiB // 4, 4 * MiB // 4),
            warmup=2,
            repeats=7,
        )

    @classmethod
    def full(cls) -> ProbeConfig:
        """A few minutes: more sizes, more repeats."""
        return cls(
            copy_sizes=tuple(4 * KiB * 4**i for i in range(9)),  # 4 KiB .. 256 MiB
            matmul_shapes=(
                (1, 4096, 4096),
                (16, 4096, 4096),
                (64, 256, 256),
                (256, 256, 1024),
                (256, 1024, 256),
                (1024, 1024, 1024),
                (128, 4096, 4096),
                (512, 4096, 4096),
                (2048, 2048, 2048),
            ),
            attention_grid=tuple((b, c) for b in (1, 4, 16) for c in (512, 2048, 8192)),
            quant_elems=(1 * MiB // 4, 16 * MiB // 4),
            warmup=3,
            repeats=15,
        )


def syncer(xp: ModuleType) -> Callable[[], None]:
    """A call that waits for the device to finish its queued work (CuPy), or does nothing
    (NumPy: every op has finished when it returns)."""
    if backend.is_gpu(xp):
        runtime = xp.cuda.runtime
        return lambda: runtime.deviceSynchronize()
    return lambda: None


def time_op(
    fn: Callable[[], object],
    warmup: int,
    repeats: int,
    sync: Callable[[], None] = lambda: None,
    before: Callable[[], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of ``repeats`` timed calls of ``fn`` after ``warmup`` untimed ones, read on
    ``clock`` (default wall time; :func:`hwbench.opprobe.op_clock` picks the calling
    thread's CPU time for NumPy). ``before`` runs untimed ahead of every call (e.g. to
    drop caches)."""
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
        sync()
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        sync()
        t0 = clock()
        fn()
        sync()
        out.append(clock() - t0)
    return out


def _measure(
    probe: str, label: str, params: dict[str, float], work: float, times: list[float]
) -> Measurement:
    t = np.asarray(times, dtype=np.float64)
    q25, med, q75 = np.percentile(t, [25, 50, 75])
    return Measurement(
        probe, label, params, work, float(med), float(q25), float(q75), float(t.min()),
        float(t.max()), len(times),
    )  # fmt: skip


def _drop_page_cache(path: Path) -> None:
    """Flush ``path`` and ask the OS to drop its cached pages (best effort, no root needed)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- probes ----------------------------------------------------------------------------------
def _copy_op(
    link: str, size: int, xp: ModuleType, workdir: Path
) -> tuple[Callable[[], object], Callable[[], object] | None, Callable[[], object]]:
    """``(op, before, cleanup)`` for one copy of ``size`` bytes over ``link``."""
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    obj = ObjectStoreTier(workdir / "objects")
    ssd = SsdTier(workdir / "ssd")
    host, dev = HostTier(xp=xp), DeviceTier(xp=xp)
    name = f"probe-{size}"

    def cleanup() -> None:
        obj.delete(name)
        ssd.delete(name)

    if link == "object->ssd":
        obj.put(name, data)
        return (lambda: ssd.put(name, obj.get(name))), None, cleanup
    if link == "ssd->host":
        ssd.put(name, data)
        path = ssd.path(name)
        return (lambda: ssd.get(name)), (lambda: _drop_page_cache(path)), cleanup
    host.put("a", data)
    dev.put("a", data)
    h_src, d_src = host.get("a"), dev.get("a")
    host.put("b", data)
    dev.put("b", data)
    h_dst, d_dst = host.get("b"), dev.get("b")
    if link == "host->host":
        return (lambda: np.copyto(h_dst, h_src)), None, cleanup
    if link == "host->device":
        return (lambda: dev.put("c", h_src)), None, cleanup
    if link == "device->host":
        if backend.is_gpu(xp):
            return (lambda: d_src.get(out=h_dst)), None, cleanup
        return (lambda: np.copyto(h_dst, d_src)), None, cleanup
    if link == "device->device":
        return (lambda: d_dst.__setitem__(Ellipsis, d_src)), None, cleanup
    raise ValueError(f"unknown link {link!r}; allowed: {', '.join(COPY_LINKS)}")


def copy_probe(cfg: ProbeConfig, xp: ModuleType, workdir: Path, link: str) -> list[Measurement]:
    """Copy time by size over ``link`` (one of :data:`COPY_LINKS`)."""
    sync = syncer(xp)
    out = []
    for size in cfg.copy_sizes:
        op, before, cleanup = _copy_op(link, size, xp, workdir)
        times = time_op(op, cfg.warmup, cfg.repeats, sync, before)
        out.append(_measure("copy", link, {"bytes": float(size)}, float(size), times))
        cleanup()
    return out


def matmul_probe(cfg: ProbeConfig, xp: ModuleType, dtype: str) -> list[Measurement]:
    """FLOP/s of ``(m, k) @ (k, n)`` in ``dtype`` for each configured shape."""
    sync = syncer(xp)
    rng = np.random.default_rng(1)
    out = []
    for m, n, k in cfg.matmul_shapes:
        a = xp.asarray(rng.standard_normal((m, k), dtype=np.float32).astype(dtype))
        b = xp.asarray(rng.standard_normal((k, n), dtype=np.float32).astype(dtype))
        c = xp.empty((m, n), dtype=dtype)

        def fn(a: Any = a, b: Any = b, c: Any = c) -> object:
            return xp.matmul(a, b, out=c)

        times = time_op(fn, cfg.warmup, cfg.repeats, sync)
        params = {"m": float(m), "n": float(n), "k": float(k), "dtype_bytes": float(a.itemsize)}
        out.append(_measure("matmul", dtype, params, 2.0 * m * n * k, times))
    return out


def attention_probe(cfg: ProbeConfig, xp: ModuleType) -> list[Measurement]:
    """Paged decode attention (engine.kv) time by (batch, context), fp32 KV."""
    sync = syncer(xp)
    rng = np.random.default_rng(2)
    bt = cfg.block_tokens
    out = []
    for batch, context in cfg.attention_grid:
        per_seq = -(-context // bt)
        layout = KVLayout(1, bt, cfg.kv_heads, cfg.head_dim, "fp32")
        storage = KVStorage(layout, batch * per_seq, xp)
        tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(batch)]
        ctx = [context] * batch
        q = xp.asarray(rng.standard_normal((batch, cfg.heads, cfg.head_dim), dtype=np.float32))

        def fn(q: Any = q, storage: Any = storage, tables: Any = tables, ctx: Any = ctx) -> object:
            return paged_decode_attention(q, storage, tables, ctx)

        times = time_op(fn, cfg.warmup, cfg.repeats, sync)
        kv_bytes = 2.0 * 4 * batch * context * cfg.kv_heads * cfg.head_dim
        params = {
            "batch": float(batch),
            "context": float(context),
            "heads": float(cfg.heads),
            "kv_heads": float(cfg.kv_heads),
            "head_dim": float(cfg.head_dim),
        }
        out.append(_measure("attention", "paged-decode-fp32", params, kv_bytes, times))
    return out


def quant_probe(cfg: ProbeConfig, xp: ModuleType) -> list[Measurement]:
    """Encode and decode throughput (input fp32 bytes per second) of the KV codecs."""
    sync = syncer(xp)
    rng = np.random.default_rng(3)
    out = []
    for n in cfg.quant_elems:
        x = xp.asarray(rng.standard_normal((n // 64, 64), dtype=np.float32))
        for fmt in ("fp16", "int8", "int4"):
            enc = encode(x, fmt, -1, 64, xp)

            def fe(x: Any = x, fmt: str = fmt) -> object:
                return encode(x, fmt, -1, 64, xp)

            def fd(enc: Any = enc, fmt: str = fmt) -> object:
                return decode(enc, fmt, -1, 64, xp)

            for label, fn in ((f"{fmt}-encode", fe), (f"{fmt}-decode", fd)):
                times = time_op(fn, cfg.warmup, cfg.repeats, sync)
                params = {"elements": float(n), "group": 64.0}
                out.append(_measure("quant", label, params, 4.0 * n, times))
    return out


def overhead_probe(cfg: ProbeConfig, xp: ModuleType) -> list[Measurement]:
    """Fixed costs: one tiny array operation (``op``) and one tiny decoder layer (``layer``:
    norm, 4 projections, activation, 2 residual adds on one token) where compute is negligible."""
    sync = syncer(xp)
    rng = np.random.default_rng(4)
    a = xp.ones(1, dtype=xp.float32)
    b = xp.ones(1, dtype=xp.float32)
    c = xp.empty(1, dtype=xp.float32)

    def op() -> object:
        return xp.add(a, b, out=c)

    h = cfg.layer_hidden
    x = xp.asarray(rng.standard_normal((1, h), dtype=np.float32))
    w = [xp.asarray(rng.standard_normal((h, h), dtype=np.float32) * 0.05) for _ in range(4)]

    def layer() -> object:
        y = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
        y = x + xp.matmul(xp.matmul(y, w[0]), w[1])
        z = xp.matmul(y, w[2])
        z = z / (1.0 + xp.exp(-z))
        return y + xp.matmul(z, w[3])

    reps = max(cfg.repeats, 20)  # tiny operations: more repeats for a stable median
    return [
        _measure("overhead", "op", {}, 1.0, time_op(op, cfg.warmup + 5, reps, sync)),
        _measure("overhead", "layer", {"hidden": float(h)}, 1.0, time_op(layer, 5, reps, sync)),
    ]


# -- plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One unit of work for a progress bar: ``run()`` returns its measurements."""

    name: str
    run: Callable[[], list[Measurement]]


def plan(cfg: ProbeConfig, xp: ModuleType, workdir: Path) -> list[Step]:
    """The probe steps for backend ``xp``, in order; files go under ``workdir``."""
    steps = [
        Step(f"copy {link}", lambda link=link: copy_probe(cfg, xp, workdir, link))  # type: ignore[misc]
        for link in COPY_LINKS
    ]
    dtypes = ["float32", "float16"] if backend.is_gpu(xp) else ["float32"]
    steps += [
        Step(f"matmul {dt}", lambda dt=dt: matmul_probe(cfg, xp, dt))  # type: ignore[misc]
        for dt in dtypes
    ]
    steps.append(Step("attention", lambda: attention_probe(cfg, xp)))
    steps.append(Step("quantisation", lambda: quant_probe(cfg, xp)))
    steps.append(Step("overheads", lambda: overhead_probe(cfg, xp)))
    return steps


def run_probes(
    cfg: ProbeConfig,
    xp: ModuleType,
    workdir: Path,
    on_step: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Run every step of :func:`plan`; ``on_step(name)`` is called after each one."""
    out: list[Measurement] = []
    for step in plan(cfg, xp, workdir):
        out.extend(step.run())
        if on_step is not None:
            on_step(step.name)
    return out
