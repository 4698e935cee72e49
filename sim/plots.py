"""PNG plots of a run (matplotlib, Agg backend): latency CDF per model/class; QPS, queue
length and HBM hit rate over time; bytes fetched per tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sim.metrics import TIERS


def write_plots(folder: Path, result: Any) -> list[Path]:
    """Write the plots into ``folder``; returns their paths."""
    out = [_latency_cdf(folder, result), _timeseries(folder, result), _bytes(folder, result)]
    plt.close("all")
    return out


def _latency_cdf(folder: Path, result: Any) -> Path:
    df = result.requests
    done = df[df["status"] == "done"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (var, model, cls), g in done.groupby(["variant", "model", "cls"], observed=True, sort=True):
        lat = np.sort((g["end"] - g["arrival"]).to_numpy())
        if lat.size:
            label = "/".join(str(x) for x in (var, model, cls) if x != "")
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("CDF")
    ax.set_title("Request latency")
    if ax.lines:
        ax.legend(fontsize=7)
    p = folder / "latency_cdf.png"
    fig.savefig(p, dpi=100, bbox_inches="tight")
    return p


def _timeseries(folder: Path, result: Any) -> Path:
    ts = result.timeseries
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for var, g in ts.groupby("variant", sort=True):
        lab = str(var) or "run"
        axes[0].plot(g["t"], g["qps"], label=lab)
        axes[1].plot(g["t"], g["queued"], label=lab)
        axes[2].plot(g["t"], g["hbm_hit_rate"], label=lab)
    axes[0].set_ylabel("arrivals/s")
    axes[1].set_ylabel("queued")
    axes[2].set_ylabel("HBM hit rate")
    axes[2].set_xlabel("simulated time (s)")
    axes[0].legend(fontsize=7)
    p = folder / "timeseries.png"
    fig.savefig(p, dpi=100, bbox_inches="tight")
    return p


def _bytes(folder: Path, result: Any) -> Path:
    df = result.requests
    fig, ax = plt.subplots(figsize=(7, 4))
    tiers = [t for t in TIERS if t != "hbm"]
    variants = sorted(df["variant"].unique())
    width = 0.8 / max(len(variants), 1)
    for i, var in enumerate(variants):
        g = df[df["variant"] == var]
        vals = [float(g[f"bytes_{t}"].sum()) / 2**30 for t in tiers]
        ax.bar(np.arange(len(tiers)) + i * width, vals, width, label=str(var) or "run")
    ax.set_xticks(np.arange(len(tiers)) + width * (len(variants) - 1) / 2, tiers)
    ax.set_ylabel("GiB fetched")
    ax.set_title("Parameter bytes by source tier")
    ax.legend(fontsize=7)
    p = folder / "bytes_by_tier.png"
    fig.savefig(p, dpi=100, bbox_inches="tight")
    return p
