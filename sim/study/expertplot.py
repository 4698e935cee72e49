"""The expert-offload comparison (``scenarios/expert-offload.yaml``): its rows and its plot.

:func:`expert_rows` reads, from a run summary with variants, per variant its HBM expert
budget, eviction policy and prefetch switch (from the variant's resolved scenario) and its
figures: mean and P99 TPOT, expert hit rate, expert bytes moved (the ``experts`` block).
:func:`expert_plot` draws three panels against the budget -- TPOT, hit rate, bytes moved --
one line per (policy, prefetch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.scenario import Scenario, variant
from sim.study.plots import figure_with_axes


def expert_rows(sc: Scenario, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per variant of ``sc`` in ``summary["variants"]`` (see the module docstring)."""
    rows = []
    for v in sc.variants:
        s = summary["variants"][v.name]
        vs = variant(sc, v)
        e = s["experts"]
        tpot = s["latency"]["tpot"]
        rows.append(
            {
                "variant": v.name,
                "budget": vs.experts.hbm_budget,
                "policy": vs.cache.hbm_policy,
                "prefetch": vs.experts.prefetch,
                "tpot_mean_s": tpot["mean"],
                "tpot_p99_s": tpot["p99"],
                "hit_rate": e["hit_rate"],
                "bytes_moved": e["bytes_moved"],
                "demand_fetched": e["demand_fetched"],
                "prefetched": e["prefetched"],
            }
        )
    return rows


def expert_plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Draw the three panels of the module docstring to ``path`` (PNG); returns ``path``."""
    fig, axes = figure_with_axes(1, 3, figsize=(15, 4.2))
    panels = (
        ("tpot_mean_s", "mean TPOT (ms)", 1e3, True),
        ("hit_rate", "expert hit rate", 1.0, False),
        ("bytes_moved", "expert bytes moved (GiB)", 2.0**-30, False),
    )
    lines: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for r in rows:
        lines.setdefault((r["policy"], r["prefetch"]), []).append(r)
    for ax, (key, label, scale, log) in zip(axes, panels, strict=True):
        for (policy, pf), rs in lines.items():
            rs = sorted(rs, key=lambda r: r["budget"])
            xs = [100 * r["budget"] for r in rs]
            ys = [(r[key] or 0.0) * scale for r in rs]
            style = "o-" if pf else "s--"
            ax.plot(xs, ys, style, label=f"{policy}, prefetch {'on' if pf else 'off'}")
        ax.set_xlabel("HBM expert budget (% of experts)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.set_xticks([25, 50, 100])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
