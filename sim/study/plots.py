"""PNG plots of a run, a sweep, an A/B test and a capacity plan (matplotlib, no pyplot).

A run: ``autoscale.png`` when it autoscales (:mod:`sim.study.autoscaleplot`), ``latency_cdf.png`` (CDF per model/class, each class's SLO as a dashed line, a dot at
each curve's P99), ``timeseries.png`` (arrivals and completions per second, queue and
running requests with the share of the iterations' token budget in use, latency P50/P99 of the requests
finishing in each bin, HBM hit rate) and ``bytes_by_tier.png`` (parameter bytes per source
tier; when nothing moved it says so instead of drawing empty bars). Titles name the scenario;
legends appear only when there is more than one line to tell apart. Sweeps, A/B tests and
plans get :func:`sweep_plot`, :func:`ab_plot` and :func:`frontier_plot`.

Figures are made with :func:`figure_with_axes` (a ``matplotlib.figure.Figure``, drawn by the
Agg canvas when saved), never through pyplot: importing or calling this module selects no
backend and leaves no figure open, so a notebook keeps its inline plots.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from sim.serving.metrics import TIERS


def _seconds(x: float, _pos: Any = None) -> str:
    if x <= 0:
        return "0"
    if x < 1:
        ms = x * 1e3
        return f"{ms:g} ms" if ms >= 1 else f"{ms:.2g} ms"
    return f"{x:g} s"


def figure_with_axes(nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[Figure, Any]:
    """A new ``Figure`` (not registered with pyplot) and its axes, as pyplot's ``subplots``
    returns them; ``figsize`` and ``constrained_layout`` go to the figure, the rest to
    ``Figure.subplots``."""
    fig_kw = {k: kw.pop(k) for k in ("figsize", "constrained_layout") if k in kw}
    fig = Figure(**fig_kw)
    return fig, fig.subplots(nrows, ncols, **kw)


def _save(fig: Any, path: Path) -> Path:
    """Save ``fig`` to ``path`` via a temporary sibling (with the user's umask)."""
    from sim.study.sweep.resultcache import as_umask

    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
        as_umask(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _scenario(result: Any) -> dict[str, Any]:
    cfg = getattr(result, "config", None) or {}
    sc = cfg.get("scenario", cfg) if isinstance(cfg, dict) else {}
    return sc if isinstance(sc, dict) else {}


def _name(result: Any) -> str:
    return str(_scenario(result).get("name") or result.summary.get("scenario") or "run")


def write_plots(folder: Path, result: Any) -> list[Path]:
    """Write the run's plots into ``folder``; returns their paths."""
    out = [_latency_cdf(folder, result), _timeseries(folder, result), _bytes(folder, result)]
    scaled = getattr(result, "autoscale", None)
    if scaled is not None:
        from sim.study.autoscaleplot import autoscale_plots

        out.extend(autoscale_plots(folder, result, scaled))
    return out


def _latency_cdf(folder: Path, result: Any) -> Path:
    df = result.requests
    done = df[df["status"] == "done"]
    fig, ax = figure_with_axes(figsize=(7.5, 4.5))
    groups = list(done.groupby(["variant", "model", "cls"], observed=True, sort=True))
    p99s: list[float] = []
    for (var, model, cls), g in groups:
        lat = np.sort((g["end"] - g["arrival"]).to_numpy())
        if not lat.size:
            continue
        label = "/".join(str(x) for x in (var, model, cls) if x != "")
        (line,) = ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=label)
        p99 = float(np.quantile(lat, 0.99))
        p99s.append(p99)
        ax.plot([p99], [0.99], "o", color=line.get_color(), ms=5)
    slos = {
        str(c.get("name")): float(c["slo"])
        for c in _scenario(result).get("workload", {}).get("classes", []) or []
        if isinstance(c, dict) and c.get("slo")
    }
    for cls, slo in sorted(slos.items(), key=lambda kv: kv[1]):
        ax.axvline(slo, color="0.35", ls="--", lw=1)
        ax.annotate(
            f"SLO {cls}: {_seconds(slo)}", (slo, 0.5), xytext=(-3, 0), rotation=90,
            textcoords="offset points", ha="right", va="center", fontsize=8, color="0.25",
        )  # fmt: skip
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(_seconds))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("latency (arrival to last token)")
    ax.set_ylabel("fraction of finished requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="major")
    ax.set_title(f"Request latency: {_name(result)} ({len(done):,} requests; dots: P99)")
    if len(ax.get_legend_handles_labels()[0]) > 1:
        ax.legend(fontsize=7, loc="upper left")
    return _save(fig, folder / "latency_cdf.png")


def _per_bin(done: pd.DataFrame, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Completions per second, P50 and P99 latency of the requests ending in each bin."""
    idx = np.clip(np.searchsorted(edges, done["end"].to_numpy(), side="right") - 1, 0, None)
    lat = (done["end"] - done["arrival"]).to_numpy()
    n = len(edges) - 1
    width = np.diff(edges)
    count = np.bincount(idx, minlength=n)[:n]
    p50, p99 = np.full(n, np.nan), np.full(n, np.nan)
    for b in np.unique(idx[idx < n]):
        v = lat[idx == b]
        p50[b], p99[b] = np.quantile(v, 0.5), np.quantile(v, 0.99)
    return count / np.where(width > 0, width, 1.0), p50, p99


def _timeseries(folder: Path, result: Any) -> Path:
    ts, df = result.timeseries, result.requests
    fig, axes = figure_with_axes(4, 1, figsize=(8, 9), sharex=True)
    variants = sorted(ts["variant"].unique())
    many = len(variants) > 1
    for var in variants:
        g = ts[ts["variant"] == var]
        tag = f" ({var})" if many else ""
        t = g["t"].to_numpy()
        edges = np.append(t, t[-1] + (t[-1] - t[-2] if len(t) > 1 else 1.0))
        d = df[(df["variant"] == var) & (df["status"] == "done")]
        comp, p50, p99 = _per_bin(d, edges)
        axes[0].plot(t, g["qps"], label=f"arrivals{tag}")
        axes[0].plot(t, comp, label=f"completions{tag}", alpha=0.8)
        axes[1].plot(t, g["queued"], label=f"queued{tag}")
        axes[1].plot(t, g["running"], label=f"running{tag}")
        axes[2].plot(t, p50, label=f"P50{tag}")
        axes[2].plot(t, p99, label=f"P99{tag}")
        axes[3].plot(t, g["hbm_hit_rate"] * 100, label=f"HBM hit rate{tag}")
        if "token_budget" in g:
            axes[3].plot(t, g["token_budget"] * 100, label=f"token budget in use{tag}")
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("requests")
    axes[1].yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: whole ticks
    axes[2].set_ylabel("latency")
    axes[2].set_ylim(bottom=0)
    axes[2].yaxis.set_major_formatter(FuncFormatter(_seconds))
    axes[3].set_ylabel("%")
    axes[3].set_ylim(0, 105)
    axes[3].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_title(f"Over time: {_name(result)} (latency of requests finishing in each bin)")
    fig.tight_layout()
    return _save(fig, folder / "timeseries.png")


def _bytes(folder: Path, result: Any) -> Path:
    df = result.requests
    tiers = [t for t in TIERS if t != "hbm"]
    variants = sorted(df["variant"].unique())
    vals = {
        v: [float(df.loc[df["variant"] == v, f"bytes_{t}"].sum()) / 2**30 for t in tiers]
        for v in variants
    }
    fig, ax = figure_with_axes(figsize=(7, 4))
    ax.set_title(f"Parameter bytes by source tier: {_name(result)}")
    if not any(x > 0 for vs in vals.values() for x in vs):
        ax.axis("off")
        ax.text(
            0.5, 0.5, "No parameter bytes were fetched from host, NVMe, remote nodes or\n"
            "the object store: every weight the requests used was already in HBM.",
            ha="center", va="center", fontsize=10, transform=ax.transAxes,
        )  # fmt: skip
        return _save(fig, folder / "bytes_by_tier.png")
    width = 0.8 / max(len(variants), 1)
    for i, var in enumerate(variants):
        bars = ax.bar(np.arange(len(tiers)) + i * width, vals[var], width, label=str(var))
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(np.arange(len(tiers)) + width * (len(variants) - 1) / 2, tiers)
    ax.set_ylabel("GiB fetched")
    ax.set_ylim(bottom=0)
    if len(variants) > 1:
        ax.legend(fontsize=7)
    return _save(fig, folder / "bytes_by_tier.png")


def ab_plot(diffs: Sequence[Any], path: Path, title: str) -> Path | None:
    """B - A per metric as a percentage of A's mean, with its 95% interval (coloured by
    verdict: green B better, red B worse, grey no verdict); ``None`` when no metric."""
    rows = [d for d in diffs if d.mean_a not in (0, 0.0)]
    if not rows:
        return None
    fig, ax = figure_with_axes(figsize=(8, 0.35 * len(rows) + 1.5))
    y = np.arange(len(rows))[::-1]
    for yi, d in zip(y, rows, strict=True):
        scale = 100.0 / abs(d.mean_a)
        lo, mid, hi = d.ci_low * scale, d.diff * scale, d.ci_high * scale
        color = {"B better": "tab:green", "B worse": "tab:red"}.get(d.verdict or "", "0.5")
        ax.errorbar(mid, yi, xerr=[[mid - lo], [hi - mid]], fmt="o", color=color, capsize=3)
    ax.axvline(0, color="0.3", lw=1)
    ax.set_yticks(y, [d.metric for d in rows], fontsize=8)
    ax.set_xlabel("B - A, % of A's mean (95% bootstrap interval)")
    ax.set_title(f"{title} (green: B better, red: B worse)")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


#: the sweep results' columns :func:`sweep_plot` draws (``results-TAG.parquet``, flattened)
THROUGHPUT, P99 = "throughput.achieved_rps", "latency.e2e.p99"


def sweep_plot(df: pd.DataFrame, keys: list[str], path: Path, title: str) -> Path | None:
    """Mean over seeds of throughput and P99 latency against the first grid key (one line
    per combination of the other keys); ``None`` when there is no grid key or no ok run."""
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    cols = [c for c in (THROUGHPUT, P99) if c in ok.columns]
    if not keys or ok.empty or not cols:
        return None
    x, rest = keys[0], keys[1:]
    fig, axes = figure_with_axes(1, len(cols), figsize=(5.5 * len(cols), 4), squeeze=False)
    groups = list(ok.groupby(rest, sort=True, dropna=False)) if rest else [((), ok)]
    for ax, col in zip(axes[0], cols, strict=True):
        for gk, g in groups:
            m = g.groupby(x, sort=True)[col].apply(lambda s: pd.to_numeric(s).mean())
            gv = gk if isinstance(gk, tuple) else (gk,)
            label = ", ".join(f"{k}={v}" for k, v in zip(rest, gv, strict=False)) or None
            numeric = pd.api.types.is_numeric_dtype(m.index.dtype)
            xs = m.index if numeric else [str(v) for v in m.index]
            ax.plot(xs, m.to_numpy(dtype=float), "o-", label=label)
        ax.set_xlabel(x)
        ax.set_ylabel("achieved throughput (req/s)" if col == THROUGHPUT else "P99 E2E latency")
        if col != THROUGHPUT:
            ax.yaxis.set_major_formatter(FuncFormatter(_seconds))
        if numeric and all(float(v).is_integer() for v in m.index):  # sizes, counts
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if rest:
            ax.legend(fontsize=7)
    fig.suptitle(f"{title} (mean over seeds)")
    fig.tight_layout()
    return _save(fig, path)


def frontier_plot(
    df: pd.DataFrame, size_key: str, alternatives: Sequence[str], qps_top: float, path: Path
) -> Path:
    """A plan's frontier: smallest size per load, highest load per size. Sizes get integer
    ticks; a load that reached the top of the search range is drawn hollow with an arrow
    ("at least"), not as a measured capacity."""
    qs = [q for q in ("min-size", "max-qps") if not df.empty and (df["question"] == q).any()]
    fig, axes = figure_with_axes(
        1, max(len(qs), 1), figsize=(5.5 * max(len(qs), 1), 4), squeeze=False
    )
    keys = list(alternatives)
    for ax, q in zip(axes[0], qs, strict=False):
        sub = df[df["question"] == q]
        if q == "min-size" and sub["qps"].nunique() == 1:  # one load: a dot says nothing
            _sizes_by_alternative(ax, sub, keys, size_key)
            continue
        groups = sub.groupby(keys, sort=False) if keys else [("", sub)]
        for name, g in groups:
            g = g.dropna(subset=["qps", "size"])
            label = ", ".join(
                f"{k}={v}"
                for k, v in zip(keys, name if isinstance(name, tuple) else (name,), strict=False)
            )
            if q == "min-size":
                ax.plot(g["qps"], g["size"], "o-", label=label or None)
                continue
            top = g["qps"] >= qps_top
            (line,) = ax.plot(g["size"], g["qps"], "-", label=label or None)
            c = line.get_color()
            ax.plot(g.loc[~top, "size"], g.loc[~top, "qps"], "o", color=c)
            ax.plot(g.loc[top, "size"], g.loc[top, "qps"], "o", mfc="none", color=c)
            for sx, sy in zip(g.loc[top, "size"], g.loc[top, "qps"], strict=True):
                ax.annotate(
                    f">= {sy:g}", (sx, sy), xytext=(0, 12), textcoords="offset points",
                    ha="center", fontsize=8, arrowprops={"arrowstyle": "<-", "color": c},
                )  # fmt: skip
            if top.any():
                ax.text(
                    0.02, 0.03, f"hollow: the search reached the top of qps_range ({qps_top:g});"
                    "\nthe capacity is at least that, not measured",
                    transform=ax.transAxes, fontsize=8, color="0.3",
                )  # fmt: skip
        sizes = sub["size"].dropna().astype(int).tolist()
        if q == "min-size":
            ax.set(xlabel="offered load (QPS)", ylabel=f"smallest {size_key}", title="size needed")
            _integer_axis(ax.yaxis, sizes, ax.set_ylim)
        else:
            ax.set(xlabel=size_key, ylabel="highest QPS meeting the SLOs", title="capacity")
            _integer_axis(ax.xaxis, sizes, ax.set_xlim)
            ax.set_ylim(bottom=0, top=max(qps_top * 1.2, ax.get_ylim()[1]))
        ax.grid(alpha=0.3)
        if keys:
            ax.legend()
    fig.tight_layout()
    return _save(fig, path)


def _sizes_by_alternative(ax: Any, sub: pd.DataFrame, keys: list[str], size_key: str) -> None:
    """One load: a bar per alternative (one bar without alternatives) with the smallest size
    (its value on top); an alternative without an answer gets its reason's first words
    instead of a bar (a line through one dot would say nothing)."""
    qps = float(sub["qps"].iloc[0])
    labels = [
        ", ".join(f"{k}={r[k]}" for k in keys) or f"{qps:g} QPS" for r in sub.to_dict("records")
    ]
    sizes = [r["size"] if r["size"] == r["size"] else None for r in sub.to_dict("records")]
    xs = np.arange(len(labels))
    top = max((s for s in sizes if s is not None), default=1.0)
    for x, size, r in zip(xs, sizes, sub.to_dict("records"), strict=True):
        if size is None:
            why = str(r.get("reason") or "no answer").split(":", 1)[0]
            ax.text(x, top * 0.05, f"none:\n{why}", ha="center", fontsize=8, color="0.3")
            continue
        ax.bar(x, size, color="tab:blue", width=0.6)
        ax.text(x, size, f"{size:g}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_xlim(-0.5 - 0.5 / len(xs), len(xs) - 0.5 + 0.5 / len(xs))  # one bar: not full width
    ax.set_ylim(0, top * 1.15)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(ylabel=f"smallest {size_key}", title=f"size needed at {qps:g} QPS")
    ax.grid(alpha=0.3, axis="y")


def _integer_axis(axis: Any, values: list[int], set_lim: Any) -> None:
    """Whole-number ticks on a size axis: one below to one above the sizes shown when they
    span fewer than a dozen, else matplotlib's integer locator."""
    if values and max(values) - min(values) < 12:
        lo, hi = max(min(values) - 1, 0), max(values) + 1
        set_lim(lo - 0.3, hi + 0.3)
        axis.set_ticks(range(lo, hi + 1))
    else:
        axis.set_major_locator(MaxNLocator(integer=True))


def pareto_plot(df: pd.DataFrame, path: Path, tpot_limit_s: float | None, title: str) -> Path:
    """``pdsim frontier``'s plot: tokens/s/GPU against tokens/s/user of every configuration
        at its capacity (one colour per deployment: aggregated tp, or disaggregated pools as
    squares; each point labelled by max_num_seqs), the
        Pareto frontier as a line, the chosen point as a star, and the TPOT objective as the
        vertical line ``1 / TPOT`` tokens/s/user (a median user slower than it misses it)."""
    fig, ax = figure_with_axes(figsize=(7, 4.5))
    ok = df.dropna(subset=["tokens_per_s_per_user", "tokens_per_s_per_gpu"])
    groups = ok.groupby("deployment", sort=False) if "deployment" in ok else ok.groupby("tp")
    for name, g in groups:
        disagg = str(name).startswith("P ")
        ax.plot(g["tokens_per_s_per_user"], g["tokens_per_s_per_gpu"], "s" if disagg else "o",
                alpha=0.6, label=str(name))  # fmt: skip
        for _, r in g.iterrows():
            ax.annotate(f"{int(r['max_num_seqs'])}", (r["tokens_per_s_per_user"],
                        r["tokens_per_s_per_gpu"]), xytext=(3, 3), textcoords="offset points",
                        fontsize=7, color="0.35")  # fmt: skip
    front = ok[ok["on_frontier"]].sort_values("tokens_per_s_per_user")
    if not front.empty:
        ax.plot(front["tokens_per_s_per_user"], front["tokens_per_s_per_gpu"], "-", color="k",
                lw=1.2, label="Pareto frontier")  # fmt: skip
    best = ok[ok["chosen"]]
    if not best.empty:
        r = best.iloc[0]
        ax.plot(
            [r["tokens_per_s_per_user"]],
            [r["tokens_per_s_per_gpu"]],
            "*",
            ms=16,
            color="tab:red",
            label=f"chosen: {r.get('deployment', 'tp=' + str(r['tp']))}, "
            f"max_num_seqs={r['max_num_seqs']}",
        )
    if tpot_limit_s:
        ax.axvline(
            1.0 / tpot_limit_s,
            color="tab:red",
            ls="--",
            lw=1,
            label=f"TPOT SLO {tpot_limit_s * 1e3:g} ms = {1 / tpot_limit_s:.1f} tok/s/user",
        )
    if ok.empty:
        ax.text(0.5, 0.5, "no configuration meets the SLOs", transform=ax.transAxes,
                ha="center")  # fmt: skip
    ax.set(xlabel="tokens/s per user (median decode speed)",
           ylabel="output tokens/s per GPU", title=title)  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
