"""Fit probe measurements into the simulator's :class:`sim.serving.costmodel.Profile` (R16).

Fits (all from medians; quartiles stay in the ``fitted`` tables):

* **links** -- ``time = latency + bytes / bandwidth``: the bandwidth by least squares
  (each point weighted by ``1 / time``) over the sizes of at least one chunk (256 KiB; smaller
  copies run from CPU caches and would inflate it), the latency as the median residual of
  the smaller sizes. A negative latency is clamped to 0. Mapping onto the schema's links:
  ``pcie`` = host->device, ``nvme`` = ssd->host, ``object_store`` = object->ssd,
  ``nvlink`` = device->device (one device: an on-device copy), ``rdma`` = host->host
  (no network on one machine: DRAM loopback stands in; the notes say so).
* **hbm_bandwidth / dram_bandwidth** -- STREAM "copy" convention: a copy of ``n`` bytes moves
  ``2n`` (read + write), so bandwidth = twice the fitted device->device / host->host copy
  bandwidth.
* **flops** -- the best median matmul rate of the dtype (the "peak"); ``compute_efficiency``
  is the median over the fp32 shapes with ``m >= 64`` (prefill / batched decode) of
  rate / peak, so ``peak * efficiency`` is the typical achieved rate. On the NumPy backend
  fp16 is not measured (the engine computes in fp32 there): ``flops_fp16`` = the fp32 rate.
* **kernel_launch_s** -- median of one tiny array operation; **per_layer_overhead_s** --
  median of the tiny decoder layer (see :func:`hwbench.probes.overhead_probe`).
* **memory sizes** -- host DRAM from the OS; device memory from CuPy on a GPU, else half the
  DRAM (the NumPy arena that stands in for HBM shares it with the host tier).

``fitted`` keeps every measurement as rows of numbers: ``copy_<link>`` (``->`` spelled ``_to_``),
``matmul_<dtype>``, ``attention``, ``quant_<codec>``, ``overhead_<what>``, and the link fits as
``link_fit`` rows.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from engine import backend
from engine.chunks import MIN_CHUNK_BYTES
from hwbench.probes import Measurement
from sim.serving.costmodel import (
    GpuProfile,
    HostProfile,
    LinkProfile,
    LinksProfile,
    Profile,
)

LINK_MAP: dict[str, str] = {
    "pcie": "host->device",
    "nvme": "ssd->host",
    "object_store": "object->ssd",
    "nvlink": "device->device",
    "rdma": "host->host",
}
LINK_CODES: dict[str, float] = {k: float(i) for i, k in enumerate(LINK_MAP)}

__all__ = [
    "CEILINGS",
    "LINK_MAP",
    "check_profile",
    "fit_link",
    "fit_profile",
    "table_name",
]


def table_name(m: Measurement) -> str:
    """Name of the ``fitted`` table a measurement goes into."""
    label = m.label.replace("->", "_to_").replace("-", "_")
    return f"{m.probe}_{label}" if m.probe != "attention" else "attention"


def fit_link(
    sizes: Sequence[float], times: Sequence[float], min_bandwidth_bytes: float = 0.0
) -> tuple[float, float]:
    """``(latency_s, bandwidth_Bps)`` of ``time = latency + size / bandwidth``; see module doc.

    The bandwidth is fitted on the points with ``size >= min_bandwidth_bytes`` (all points if
    fewer than two qualify); the latency is then the median over the smaller points of
    ``time - size / bandwidth`` (clamped at 0), or the fit's intercept when there are none.
    Needs at least one point with ``size > 0``; the bandwidth returned is always > 0.
    """
    n_all = np.asarray(sizes, dtype=np.float64)
    t_all = np.asarray(times, dtype=np.float64)
    if n_all.size == 0 or not (n_all > 0).any():
        raise ValueError("fit_link needs at least one positive size")
    big = n_all >= min_bandwidth_bytes
    if big.sum() < 2:
        big = np.ones_like(n_all, dtype=bool)
    n, t = n_all[big], t_all[big]
    w = 1.0 / np.maximum(t, 1e-12)
    if n.size >= 2 and np.ptp(n) > 0:
        design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
        (a, inv_b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    else:
        a, inv_b = 0.0, 0.0
    if a < 0 or inv_b <= 0:
        a = max(0.0, float(a)) if inv_b > 0 else 0.0
        inv_b = float(np.sum(w * w * n * (t - a)) / np.sum(w * w * n * n))
    if inv_b <= 0:  # times do not grow with size at all: take the best observed rate
        pos = n > 0
        inv_b = float(np.min(t[pos] / n[pos])) if pos.any() else float(np.min(t_all / n_all))
    if (~big).any():
        a = float(np.median(t_all[~big] - n_all[~big] * inv_b))
    return max(0.0, float(a)), float(1.0 / inv_b)


def _device_bytes(xp: ModuleType, dram: int) -> int:
    if backend.is_gpu(xp):
        _free, total = xp.cuda.runtime.memGetInfo()
        return int(total)
    return dram // 2


def _load() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except (OSError, AttributeError):
        return "unknown"


def _dram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 1024**3


def fit_profile(
    measurements: Sequence[Measurement],
    xp: ModuleType,
    name: str,
    *,
    mode: str = "quick",
    when: _dt.datetime | None = None,
    hostname: str | None = None,
) -> Profile:
    """A ``source="measured"`` Profile from the probes' measurements (see module doc)."""
    by_link: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.probe == "copy":
            by_link.setdefault(m.label, []).append(m)
    links: dict[str, LinkProfile] = {}
    fit_rows = []
    for schema_name, link in LINK_MAP.items():
        ms = sorted(by_link.get(link, []), key=lambda m: m.params["bytes"])
        if not ms:
            raise ValueError(f"no copy measurements for link {link!r}")
        lat, bw = fit_link(
            [m.params["bytes"] for m in ms], [m.median_s for m in ms], MIN_CHUNK_BYTES
        )
        links[schema_name] = LinkProfile(bandwidth=bw, latency=lat)
        fit_rows.append({"link": LINK_CODES[schema_name], "latency_s": lat, "bandwidth": bw})

    def stream_bw(schema_link: str) -> float:
        return 2.0 * links[schema_link].bandwidth

    def best_rate(probe: str, label: str) -> float | None:
        rates = [m.rate for m in measurements if m.probe == probe and m.label == label]
        return max(rates) if rates else None

    fp32 = best_rate("matmul", "float32")
    if fp32 is None:
        raise ValueError("no float32 matmul measurements")
    fp16 = best_rate("matmul", "float16") or fp32
    # Achieved / peak over the batched shapes (m >= 64, as in prefill and batched decode):
    # CostModel charges flops / (peak * efficiency), i.e. at this typical achieved rate.
    batched = [
        m.rate / fp32
        for m in measurements
        if m.probe == "matmul" and m.label == "float32" and m.params["m"] >= 64
    ]
    efficiency = float(np.clip(np.median(batched), 1e-3, 1.0)) if batched else 1.0
    overhead = {m.label: m.median_s for m in measurements if m.probe == "overhead"}
    dram = _dram_bytes()
    tables: dict[str, list[dict[str, float]]] = {"link_fit": fit_rows}
    for m in measurements:
        tables.setdefault(table_name(m), []).append(m.row())
    when = when or _dt.datetime.now(_dt.UTC)
    host = hostname or platform.node() or "unknown"
    threads = {
        k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ
    }
    notes = (
        f"Measured by `pdsim calibrate` ({mode}) on {host} with the {backend.name(xp)} backend; "
        f"{platform.platform()}, {os.cpu_count()} CPUs, numpy {np.__version__}, "
        f"BLAS threads {threads or 'default'}, load average {_load()}. "
        "Links: pcie=host->device, nvme=ssd->host (page cache dropped where the OS allows), "
        "object_store=object->ssd (fsspec local directory), nvlink=device->device copy, "
        "rdma=host->host copy (no network on one machine: loopback stand-in). "
        "hbm/dram bandwidth: 2x the fitted copy bandwidth (read+write). flops: best achieved "
        "matmul rate; compute_efficiency: median achieved/best over shapes with m >= 64"
        + (
            "; fp16 not measured on NumPy, flops_fp16 = fp32 rate."
            if not backend.is_gpu(xp)
            else "."
        )
        + " Device memory on a CPU: half the DRAM (NumPy arena standing in for HBM)."
    )
    return Profile(
        name=name,
        source="measured",
        measured_at=when.isoformat(timespec="seconds"),
        hostname=host,
        notes=notes,
        gpu=GpuProfile(
            hbm_bytes=_device_bytes(xp, dram),
            hbm_bandwidth=stream_bw("nvlink"),
            flops_fp16=fp16,
            flops_fp32=fp32,
            compute_efficiency=efficiency,
            kernel_launch_s=overhead.get("op", 0.0),
            per_layer_overhead_s=overhead.get("layer", 0.0),
        ),
        host=HostProfile(dram_bytes=dram, dram_bandwidth=stream_bw("rdma")),
        links=LinksProfile(**links),
        fitted=tables,
    )


#: physical ceilings no measurement can exceed, B/s per link and FLOP/s (fp32), by backend:
#: a CPU's memory system (the fastest DRAM or cache copy of any server CPU is below 2 TB/s);
#: a GPU server (PCIe 6 x16 or a C2C link below 500 GB/s, HBM below 10 TB/s, NVMe and the
#: object store below 100 GB/s)
CEILINGS: dict[str, dict[str, float]] = {
    "cpu": {
        "object->ssd": 1e11,
        "ssd->host": 1e11,
        "host->host": 2e12,
        "host->device": 2e12,
        "device->device": 2e12,
        "flops": 5e13,
    },
    "gpu": {
        "object->ssd": 1e11,
        "ssd->host": 1e11,
        "host->host": 2e12,
        "host->device": 5e11,
        "device->device": 1e13,
        "flops": 5e15,
    },
}
#: how far a fitted bandwidth may exceed the fastest rate any copy of a chunk or more (256
#: KiB) reached in the probe: the fit subtracts the latency, so it sits above the raw rates
MAX_ABOVE_PROBE_PEAK = 0.5


def check_profile(profile: Profile, measurements: Sequence[Measurement], gpu: bool) -> list[str]:
    """Reasons the fitted hardware terms of ``profile`` cannot describe the machine: a link
    bandwidth above its physical ceiling (:data:`CEILINGS`) or above the fastest rate any
    copy of a chunk or more reached in its probe (by more than
    :data:`MAX_ABOVE_PROBE_PEAK`), a FLOP rate above the ceiling.
    Empty when the profile is possible."""
    ceil = CEILINGS["gpu" if gpu else "cpu"]
    out: list[str] = []
    for schema_name, link in LINK_MAP.items():
        lp = getattr(profile.links, schema_name)
        bw = float(lp.bandwidth)
        pts = [m for m in measurements if m.probe == "copy" and m.label == link]
        chunks = [m for m in pts if m.params["bytes"] >= MIN_CHUNK_BYTES and m.min_s > 0]
        peak = max((m.params["bytes"] / m.min_s for m in chunks), default=0.0)
        if bw > ceil[link]:
            out.append(
                f"links.{schema_name} bandwidth {bw:.3g} B/s is above the physical ceiling "
                f"{ceil[link]:.3g} B/s of a {link} copy"
            )
        elif peak > 0 and bw > peak * (1.0 + MAX_ABOVE_PROBE_PEAK):
            out.append(
                f"links.{schema_name} bandwidth {bw:.3g} B/s is above the fastest {link} copy "
                f"of a chunk or more the probe timed ({peak:.3g} B/s) by more than "
                f"{MAX_ABOVE_PROBE_PEAK:.0%}"
            )
    flops = float(profile.gpu.flops_fp32)
    if flops > ceil["flops"]:
        out.append(f"gpu.flops_fp32 {flops:.3g} FLOP/s is above the ceiling {ceil['flops']:.3g}")
    return out
