"""``autoscale.png``: an autoscaling run over time (one figure per variant,
``autoscale-<variant>.png`` when the scenario has variants).

Panels, sharing the time axis: replicas by state (provisioning, loading, serving, draining;
stacked) with the arrival rate; GPUs held and the cumulative GPU-hours (cost in the title);
SLO attainment of the requests arriving in each window; requests queued, with the time from
each scale-out decision to the new replica's first token drawn at the decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from sim.study.plots import _name, _save, figure_with_axes

STATE_COLOURS = {
    "provisioning": "#c7c7c7",
    "loading": "#ffbb78",
    "serving": "#2ca02c",
    "draining": "#9467bd",
}


def autoscale_plots(folder: Path, result: Any, frame: pd.DataFrame) -> list[Path]:
    """Write one figure per variant of ``frame`` (the runner's autoscale timeline)."""
    summary = result.summary
    out = []
    for var in sorted(frame["variant"].unique()):
        g = frame[frame["variant"] == var]
        s = summary["variants"][var] if var and "variants" in summary else summary
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in var)
        name = f"autoscale-{safe}.png" if var else "autoscale.png"
        title = f"{_name(result)}{f' ({var})' if var else ''}"
        out.append(_one(folder / name, g, s.get("autoscale", {}), title))
    return out


def _one(path: Path, g: pd.DataFrame, a: dict[str, Any], title: str) -> Path:
    fig, axes = figure_with_axes(4, 1, figsize=(8, 10), sharex=True)
    t = g["t"].to_numpy()
    states = [g[k].to_numpy() for k in STATE_COLOURS]
    axes[0].stackplot(
        t, *states, labels=list(STATE_COLOURS), colors=list(STATE_COLOURS.values()), step="post"
    )
    axes[0].set_ylabel("replicas")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    rate = axes[0].twinx()
    rate.plot(t, g["arrival_rate"], color="black", lw=1, label="arrivals/s")
    rate.set_ylabel("requests/s")
    rate.legend(fontsize=7, loc="upper left")
    dt = np.diff(np.concatenate([[0.0], t]))
    gpu_h = np.cumsum(g["gpus"].to_numpy() * dt) / 3600.0
    axes[1].step(t, g["gpus"], where="post", label="GPUs held")
    axes[1].set_ylabel("GPUs")
    cum = axes[1].twinx()
    cum.plot(t, gpu_h, color="tab:red", label="GPU-hours (cumulative)")
    cum.set_ylabel("GPU-hours")
    cum.legend(fontsize=7, loc="upper left")
    axes[2].plot(t, g["slo_attainment"] * 100, marker=".", lw=1, label="SLO attainment")
    axes[2].set_ylabel("% of window's arrivals")
    axes[2].set_ylim(0, 105)
    axes[3].plot(t, g["queued"], label="queued")
    axes[3].set_ylabel("requests queued")
    starts = [c for c in a.get("cold_starts", []) if c.get("decision_to_first_token_s")]
    if starts:
        lat = axes[3].twinx()
        lat.scatter(
            [c["decision"] for c in starts],
            [c["decision_to_first_token_s"] for c in starts],
            color="tab:orange",
            marker="^",
            label="decision -> first token (s)",
        )
        lat.set_ylabel("seconds")
        lat.set_ylim(0, 1.2 * max(c["decision_to_first_token_s"] for c in starts))
        lat.legend(fontsize=7, loc="upper left")
    for e in a.get("events", []):
        for ax in axes:
            ax.axvline(
                e["t"],
                color="tab:blue" if e["action"] == "out" else "tab:purple",
                lw=0.5,
                alpha=0.4,
            )
    axes[3].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    gh, cost = a.get("gpu_hours"), a.get("cost")
    sub = ""
    if gh is not None and cost is not None:
        rate = cost / gh if gh else 0.0
        sub = f"{gh:.3g} GPU-hours, cost {cost:.3g} (at {rate:.3g} per GPU-hour)"
    axes[0].set_title(f"Autoscaling: {title}  {sub}")
    fig.tight_layout()
    return _save(fig, path)
