# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Calibration: a measured profile, and the real engine against the simulator
#
# The simulator charges compute and copies from a *profile* (`sim.serving.costmodel.Profile`):
# datasheet numbers for real GPUs, or numbers measured on this machine by `pdsim calibrate`
# (`hwbench` probes). This notebook
#
# 1. loads a measured profile (`profiles/cpu-vm.json`) and shows what it says;
# 2. puts the raw probe measurements next to the fitted model the simulator uses
#    (`time = latency + bytes / bandwidth` per link; matmul rate vs the fitted FLOP rate);
# 3. fits the engine's iteration costs (`hwbench.engine_fit.calibrate_engine`) and plots
#    measured engine iterations against the simulator's charge for the same shape;
# 4. runs validation workloads (`hwbench.validate.validate_workload`: the same arrivals on the
#    real NumPy engine and in the simulator) and compares latency, TTFT, throughput and hit
#    rates -- the engine-vs-simulator plots.
#
# Times measured here depend on how busy the machine is; the error table is what this machine
# measured now, not a constant. Files go under `OUT` only.

# %% tags=["parameters"]
# ruff: noqa: E402  (notebook: imports after the parameters cell)
import os
from pathlib import Path

import engine

#: the repository root (notebooks run from any folder: Jupyter starts them in notebooks/)
ROOT = Path(engine.__file__).resolve().parent.parent
OUT = Path(os.environ.get("PDSIM_NOTEBOOK_OUT", ROOT / "runs" / "notebooks")) / "calibration"
#: the measured profile to load (a path, or a shipped profile name such as "a100-80gb")
PROFILE = ROOT / "profiles" / "cpu-vm.json"
#: validation workloads (names from hwbench.workloads.SUITE; each takes ~15-30 s of real
#: time); None picks the suite's first all-resident and first two streaming workloads
WORKLOADS: list[str] | None = None

# %%
import sys

import matplotlib

if "ipykernel" not in sys.modules:  # headless script run: no display
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from hwbench.engine_fit import ImpossibleFit, fit_engine_terms, probe_engine
from hwbench.opprobe import OpGrid, with_op_tables
from hwbench.validate import decoder_config, sim_catalogue, validate_workload
from hwbench.workloads import SUITE, get_workload
from pdsim.cli.validate import LIMITS
from sim.serving.costmodel import LINK_NAMES, load_profile
from sim.serving.opcost import OpCostModel

OUT.mkdir(parents=True, exist_ok=True)
prof = load_profile(PROFILE)
print(f"profile {prof.name!r} ({prof.source}, measured {prof.measured_at} on {prof.hostname})")
print(prof.notes)

# %% [markdown]
# ## 1. What the profile says

# %%
g, h = prof.gpu, prof.host
headline = pd.DataFrame(
    [
        ("device memory (HBM stand-in)", g.hbm_bytes / 2**30, "GiB"),
        ("device memory bandwidth", g.hbm_bandwidth / 1e9, "GB/s"),
        ("peak FLOP/s (fp32)", g.flops_fp32 / 1e9, "GFLOP/s"),
        ("compute efficiency", g.compute_efficiency, ""),
        ("kernel launch", g.kernel_launch_s * 1e6, "us"),
        ("per-layer overhead", g.per_layer_overhead_s * 1e6, "us"),
        ("host DRAM", h.dram_bytes / 2**30, "GiB"),
        ("host DRAM bandwidth", h.dram_bandwidth / 1e9, "GB/s"),
    ]
    + [
        (f"link {name}: bandwidth", getattr(prof.links, name).bandwidth / 1e9, "GB/s")
        for name in LINK_NAMES
    ]
    + [
        (f"link {name}: latency", getattr(prof.links, name).latency * 1e6, "us")
        for name in LINK_NAMES
    ],
    columns=["figure", "value", "unit"],
)
headline.round(3)

# %% [markdown]
# ## 2. Probe measurements vs the fitted link model
#
# Each link was measured as a copy between two stand-in tiers on this machine (the profile's
# notes say which: pcie = host -> device, nvme = SSD -> host, object_store = object store ->
# SSD, nvlink = device -> device, rdma = host -> host loopback). Points: median time per copy
# size with the inter-quartile range; line: the profile's `latency + bytes / bandwidth`.

# %%
COPY_TABLE = {
    "pcie": "copy_host_to_device",
    "nvme": "copy_ssd_to_host",
    "object_store": "copy_object_to_ssd",
    "nvlink": "copy_device_to_device",
    "rdma": "copy_host_to_host",
}
available = {k: v for k, v in COPY_TABLE.items() if v in prof.fitted}
fig, axes = plt.subplots(1, max(len(available), 1), figsize=(3.6 * max(len(available), 1), 3.4))
axes = np.atleast_1d(axes)
fit_rows = []
for ax, (link, table) in zip(axes, available.items(), strict=False):
    t = pd.DataFrame(prof.fitted[table])
    lp = getattr(prof.links, link)
    model = lp.latency + t["bytes"] / lp.bandwidth
    yerr = np.vstack([t["median_s"] - t["q25_s"], t["q75_s"] - t["median_s"]]).clip(min=0)
    ax.errorbar(t["bytes"], t["median_s"], yerr=yerr, fmt="o", ms=4, label="measured")
    xs = np.geomspace(t["bytes"].min(), t["bytes"].max(), 50)
    ax.plot(xs, lp.latency + xs / lp.bandwidth, "-", label="profile model")
    ax.set(xscale="log", yscale="log", xlabel="bytes", ylabel="seconds", title=link)
    ax.grid(alpha=0.3)
    # relative error of the model at the largest size (where bandwidth dominates)
    big = t["bytes"].idxmax()
    fit_rows.append(
        {
            "link": link,
            "table": table,
            "sizes": len(t),
            "model_vs_median_at_largest": float(model[big] / t["median_s"][big] - 1.0),
        }
    )
axes[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "links.png", dpi=100)
plt.show()
pd.DataFrame(fit_rows).round(3)

# %%
if "matmul_float32" in prof.fitted:
    mm = pd.DataFrame(prof.fitted["matmul_float32"])
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(mm["work"], mm["rate"] / 1e9, "o-", label="measured (median)")
    ax.axhline(g.flops_fp32 / 1e9, color="k", ls="--", label="profile peak")
    ax.axhline(g.flops_fp32 * g.compute_efficiency / 1e9, color="grey", ls=":", label="peak x eff.")
    ax.set(xscale="log", xlabel="FLOPs per matmul", ylabel="GFLOP/s", title="matmul (fp32)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "matmul.png", dpi=100)
    plt.show()

# %% [markdown]
# ## 3. Engine iterations vs the simulator's charge
#
# The simulator prices an iteration op by op from the profile's op tables (measured on the
# engine's backend by `pdsim calibrate`), plus the engine's own terms fitted on whole
# iterations with those tables held fixed (`hwbench.engine_fit`: overheads per iteration
# and per layer). A profile without them gets them here (like `pdsim calibrate`).

# %%
cfg = decoder_config()
spec = sim_catalogue(cfg)[cfg.name]
if prof.ops is not None and prof.ops.engine is not None:
    fitted = prof
    print("profile already has op tables and engine terms: using them")
    points = None
else:
    # what `pdsim calibrate --quick` does, step by step, so the measured iterations can be
    # shown even when the fit is rejected
    tables = with_op_tables(prof, np, OpGrid.quick())
    points, probe = probe_engine(np, mode="quick")
    try:
        fitted, _report = fit_engine_terms(tables, spec, points, probe)
    except ImpossibleFit as err:
        # `pdsim calibrate` refuses such a fit and writes nothing (exit 1). Here the rest of
        # the notebook runs on the measured op tables alone, without engine terms, so the
        # validation errors below show what the engine's own overheads are worth.
        print(f"engine fit REJECTED (as pdsim calibrate would): {err}")
        fitted = tables
    else:
        (OUT / "profile-with-engine-fit.json").write_text(
            fitted.model_dump_json(indent=2) + "\n", encoding="utf-8"
        )
assert fitted.ops is not None
print(
    "engine terms:",
    fitted.ops.engine,
    "iteration overhead",
    fitted.ops.roofline.iteration_overhead_s,
)

cost = OpCostModel(fitted, spec)
passes = (
    pd.DataFrame([p.row() for p in points])
    if points is not None
    else pd.DataFrame(fitted.fitted.get("engine_pass", []))
)
if not passes.empty:
    passes["sim_s"] = [
        cost.iteration_time(
            int(r.tokens), round(r.sq_tokens), int(r.prompts) if r.tokens else 0,
            int(r.batch), float(r.context),
        )
        for r in passes.itertuples()
    ]  # fmt: skip
    passes["rel_error"] = passes["sim_s"] / passes["mean_s"] - 1.0
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    kind = np.where(passes["tokens"] > 0, "prefill", "decode")
    for k in ("prefill", "decode"):
        sel = kind == k
        ax.loglog(passes["mean_s"][sel], passes["sim_s"][sel], "o", ms=4, label=k)
    lo, hi = passes[["mean_s", "sim_s"]].min().min(), passes[["mean_s", "sim_s"]].max().max()
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax.set(xlabel="engine iteration (s, measured)", ylabel="simulator charge (s)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "engine_iterations.png", dpi=100)
    plt.show()
    print(
        f"{len(passes)} iteration shapes; |relative error| median "
        f"{passes['rel_error'].abs().median():.1%}, max {passes['rel_error'].abs().max():.1%}"
    )

# %% [markdown]
# ## 4. Validation runs: the same workload on the engine and in the simulator
#
# Each workload serves real requests on the NumPy engine (weights as verified chunks in a
# local object store, read through device/host/SSD tiers) and simulates the same arrivals with
# the fitted profile. `pdsim validate` prints the same table; its pass limits are
# `LIMITS` (relative errors); hit rates and bytes per access are consistency checks.

# %%
if WORKLOADS is None:
    resident = [w.name for w in SUITE if w.hbm_fraction >= 1][:1]
    streaming = [w.name for w in SUITE if w.hbm_fraction < 1][:2]
    WORKLOADS = resident + streaming
comps = []
for name in WORKLOADS:
    w = get_workload(name)
    print(f"{w.name}: {w.description}", flush=True)
    comps.append(validate_workload(w, fitted))

rows = []
for c in comps:
    for metric, e, s, err, kind in c.rows:
        rows.append(
            {
                "workload": c.workload,
                "metric": metric,
                "engine": e,
                "sim": s,
                "error": err,
                "kind": "abs (fraction)" if kind == "abs" else "relative",
                "limit": LIMITS.get(metric, 0.01 if kind == "abs" else np.nan),
            }
        )
val = pd.DataFrame(rows)
val["within_limit"] = np.where(val["limit"].notna(), val["error"].abs() <= val["limit"], np.nan)
val.to_csv(OUT / "validation.csv", index=False)
val.pivot_table(index="metric", columns="workload", values="error", sort=False).round(3)

# %%
# the hit rates are decided by the same cache code on both sides; they can differ only where
# the engine's background prefetcher (real time, a loaded machine) lands a layer earlier or
# later than the simulated one
hits = val[val["metric"].str.startswith("hit_rate_")]
print(hits[["workload", "metric", "engine", "sim", "error"]].round(4).to_string(index=False))
print(
    f"hit rates within 1 pp: {int((hits['error'].abs() <= 0.01).sum())} of {len(hits)}; "
    f"largest difference {hits['error'].abs().max() * 100:.2f} pp"
)

# %%
fig, axes = plt.subplots(1, len(comps), figsize=(4.2 * len(comps), 3.4), squeeze=False)
for ax, c in zip(axes[0], comps, strict=True):
    for data, label, style in (
        (c.engine_latency, "engine", "-"),
        (c.sim_latency, "simulator", "--"),
    ):
        x = np.sort(data)
        ax.plot(x, np.arange(1, x.size + 1) / max(x.size, 1), style, label=label)
    ax.set(xlabel="request latency (s)", ylabel="CDF", title=c.workload)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "latency_cdfs.png", dpi=100)
plt.show()

# %%
headline_metrics = ["latency_p50", "latency_p99", "ttft_p50", "throughput_rps"]
bars = val[val["metric"].isin(headline_metrics)].pivot_table(
    index="metric", columns="workload", values="error", sort=False
)
ax = (bars * 100).plot.bar(figsize=(7, 3.6), rot=0)
for metric, limit in LIMITS.items():
    if metric in bars.index:
        i = list(bars.index).index(metric)
        ax.hlines([limit * 100, -limit * 100], i - 0.4, i + 0.4, colors="k", linestyles=":")
ax.axhline(0, color="grey", lw=0.8)
ax.set(ylabel="(sim - engine) / engine  (%)", title="simulator error per workload (dotted: limit)")
ax.grid(alpha=0.3, axis="y")
plt.tight_layout()
plt.savefig(OUT / "errors.png", dpi=100)
plt.show()

# %% [markdown]
# **Reading.** Where all weights are resident the hit rates are equal by construction (nothing
# to decide). When layers stream, the same cache code decides on both sides, so a gap in hit
# rate means the two saw different access orders: the engine's background prefetcher runs in
# real time, and on a loaded machine its copies land earlier or later relative to compute than
# the simulated ones. Re-run on a quiet machine before reading a streaming gap as a model
# error. Throughput follows the arrivals at these loads. Latency and TTFT depend on the fitted
# compute terms, so they are only as good as the calibration is fresh: on a machine shared
# with other jobs, iterations run slower or faster than when the engine probe ran and the
# error moves with it: calibrate and validate in the same quiet window (`pdsim validate`
# warns when a fixed reference workload runs more than 5% faster or slower than it did at
# calibration).

# %%
print("files written:", ", ".join(sorted(p.name for p in OUT.iterdir())))
