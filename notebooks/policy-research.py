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
# # Policy research: miss-ratio curves, LRU-K vs LRU (R3), colour isolation (R13)
#
# Three questions, all answered by replaying access traces through the *same* eviction
# policies the simulator and the engine use (`engine.policy`, driven by `engine.cache.TierCache`
# through `engine.missratio.replay`):
#
# 1. **Miss-ratio curves** of every registered policy on the Mooncake KV-block trace shipped
#    with the package (and on a trace of your own: `EXTRA_TRACE` below), and on synthetic
#    Zipf traces generated here.
# 2. **R3** -- the article claims LRU-K (K=2) gives **+23 % hit rate vs LRU**. We print the
#    measured relative hit-rate gain `(hit_lruk - hit_lru) / hit_lru` per cache size next to
#    that figure. It depends strongly on the workload and the cache size; the tables show where.
# 3. **R13** -- colour isolation: two tenants share one cache, one of them bursts (a long scan
#    of new blocks). We compare the protected tenant's hit rate under plain LRU and under the
#    colour-aware LRU (`color-lru`) that reserves it a share of the cache.
#
# Everything is deterministic (seeded `numpy` generators); files go under `OUT` only.

# %% tags=["parameters"]
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, bare display lines)
import os
from pathlib import Path

import engine

#: the repository root (notebooks run from any folder: Jupyter starts them in notebooks/)
ROOT = Path(engine.__file__).resolve().parent.parent
#: where figures and tables are written (the test points this at a temporary folder)
OUT = Path(os.environ.get("PDSIM_NOTEBOOK_OUT", ROOT / "runs" / "notebooks")) / "policy-research"
#: fractions of each trace's working set (distinct bytes) used as cache sizes
FRACTIONS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.4]
#: synthetic Zipf traces: accesses per trace and number of distinct objects
ZIPF_ACCESSES = 60_000
ZIPF_OBJECTS = 10_000
#: an extra Mooncake JSONL trace of your own to study too (None: only the shipped slice)
EXTRA_TRACE: Path | None = None
SEED = 7

# %%
import sys

import matplotlib

if "ipykernel" not in sys.modules:  # headless script run: no display
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from engine.cache import TierCache
from engine.missratio import replay
from engine.policy import make_policy, policy_names
from engine.traces import Trace, example_trace, read_mooncake

OUT.mkdir(parents=True, exist_ok=True)
POLICIES = policy_names()
print("policies:", ", ".join(POLICIES))

# %% [markdown]
# ## 1. The traces
#
# A Mooncake request is a list of prefix-hashed KV blocks; `read_mooncake` expands it into one
# access per block (all blocks of one request at the request's arrival time, 256 MiB each for a
# LLaMA-2-7B-like KV cache). The synthetic traces are an independent-reference Zipf stream
# (alpha 0.8 and 1.0) and a Zipf stream interrupted by one-off sequential scans -- the
# pattern LRU-K was designed for (a scan flushes LRU, LRU-K keeps the objects seen twice).


# %%
def zipf_trace(
    n: int, objects: int, alpha: float, rng: np.random.Generator, scan_every: int = 0
) -> Trace:
    """``n`` unit-size accesses, key ``i`` drawn with probability ~ 1 / (i + 1) ** alpha.

    With ``scan_every > 0`` every ``scan_every`` accesses are followed by a scan of
    ``scan_every // 4`` keys never seen before (and never seen again).
    """
    p = 1.0 / np.arange(1, objects + 1, dtype=np.float64) ** alpha
    p /= p.sum()
    # permute ranks so popular keys are not simply the small ids
    ranks = rng.permutation(objects)
    keys = ranks[rng.choice(objects, size=n, p=p)].astype(np.int64)
    if scan_every:
        parts, fresh = [], objects
        for start in range(0, n, scan_every):
            parts.append(keys[start : start + scan_every])
            length = scan_every // 4
            parts.append(np.arange(fresh, fresh + length, dtype=np.int64))
            fresh += length
        keys = np.concatenate(parts)
    m = len(keys)
    return Trace(
        time=np.arange(m, dtype=np.float64) * 1e-3,
        key=keys,
        size=np.ones(m, dtype=np.int64),
        source=f"zipf(alpha={alpha}, scans={'yes' if scan_every else 'no'})",
    )


rng = np.random.default_rng(SEED)
traces: dict[str, Trace] = {"mooncake-slice": read_mooncake(example_trace())}
if EXTRA_TRACE is not None:
    traces[f"mooncake-{EXTRA_TRACE.stem}"] = read_mooncake(EXTRA_TRACE)
traces["zipf-0.8"] = zipf_trace(ZIPF_ACCESSES, ZIPF_OBJECTS, 0.8, rng)
traces["zipf-1.0"] = zipf_trace(ZIPF_ACCESSES, ZIPF_OBJECTS, 1.0, rng)
traces["zipf-0.8+scans"] = zipf_trace(ZIPF_ACCESSES, ZIPF_OBJECTS, 0.8, rng, scan_every=4_000)

summary = pd.DataFrame(
    [
        {
            "trace": name,
            "accesses": len(t),
            "objects": t.n_objects,
            "working_set_bytes": t.unique_bytes(),
            "one_hit_share": float((np.bincount(t.key) == 1).sum() / t.n_objects),
        }
        for name, t in traces.items()
    ]
)
summary

# %% [markdown]
# ## 2. Miss-ratio curves of every policy
#
# Cache sizes are fractions of each trace's working set. `opt` is Belady's offline optimum
# (it reads the future), the lower bound every online policy is measured against.
# `color-lru` without colour shares is exactly LRU (its docstring says so; the curves must
# coincide, which the cell after the plot checks).

# %%
frames = []
for name, t in traces.items():
    ws = t.unique_bytes()
    nominal = {max(1, int(ws * f)): f for f in sorted(FRACTIONS)}  # bytes -> fraction
    df = replay(t, POLICIES, list(nominal))
    df.insert(0, "trace", name)
    df["fraction"] = df["cache_bytes"].map(nominal)
    frames.append(df)
curves = pd.concat(frames, ignore_index=True)
curves.to_csv(OUT / "miss_ratio_curves.csv", index=False)
# replay's invariant, visible here: every row accounts for every access
assert (curves["hits"] + curves["misses"] == curves["requests"]).all()

fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.6), squeeze=False)
for ax, (name, g) in zip(axes[0], curves.groupby("trace", sort=False), strict=True):
    for pol, gp in g.groupby("policy", sort=False):
        style = "k--" if pol == "opt" else "-"
        ax.plot(gp["fraction"], gp["miss_ratio"], style, marker="o", ms=3, label=pol)
    ax.set(xscale="log", xlabel="cache size / working set", ylabel="miss ratio", title=name)
    ax.grid(alpha=0.3)
axes[0][0].legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "miss_ratio_curves.png", dpi=100)
plt.show()

# %%
wide = curves.pivot_table(index=["trace", "fraction"], columns="policy", values="miss_ratio")
# keep the traces in the order they were built, sizes ascending within each
wide = wide.loc[pd.MultiIndex.from_frame(curves[["trace", "fraction"]].drop_duplicates())]
# checks that could fail: OPT is a lower bound; colour-less color-lru is LRU
assert (wide["opt"] <= wide[POLICIES].min(axis=1) + 1e-12).all(), "OPT must be the lower bound"
assert np.allclose(wide["color-lru"], wide["lru"]), "color-lru without shares must equal LRU"
wide.round(4)

# %% [markdown]
# ## 3. R3: does LRU-K (K=2) give +23 % hit rate vs LRU?
#
# Relative gain in hit rate per trace and cache size, next to the article's +23 %. A gain is
# undefined (NaN) where LRU hits nothing.

# %%
ARTICLE_GAIN = 0.23
hit = 1.0 - wide[["lru", "lru-k"]]
r3 = pd.DataFrame(
    {
        "lru_hit_rate": hit["lru"],
        "lruk_hit_rate": hit["lru-k"],
        "measured_gain": (hit["lru-k"] - hit["lru"]) / hit["lru"].where(hit["lru"] > 0),
    }
)
r3["article_gain"] = ARTICLE_GAIN
r3["measured_minus_article"] = r3["measured_gain"] - ARTICLE_GAIN
r3.to_csv(OUT / "r3_lruk_vs_lru.csv")
print(
    r3.to_string(
        formatters={
            "lru_hit_rate": "{:.3f}".format,
            "lruk_hit_rate": "{:.3f}".format,
            "measured_gain": "{:+.1%}".format,
            "article_gain": "{:+.0%}".format,
            "measured_minus_article": "{:+.1%}".format,
        }
    )
)

# %%
best = r3.groupby(level="trace", sort=False)["measured_gain"].agg(["min", "median", "max"])
best["sizes_reaching_+23%"] = [
    ", ".join(
        f"{f:g}" for f in g.index.get_level_values("fraction")[g["measured_gain"] >= ARTICLE_GAIN]
    )
    or "none"
    for _, g in r3.groupby(level="trace", sort=False)
]
print("relative hit-rate gain of lru-k over lru per trace, over the cache sizes tried:")
print(best.to_string(formatters={c: "{:+.1%}".format for c in ("min", "median", "max")}))

fig, ax = plt.subplots(figsize=(6, 3.6))
for name, g in r3.groupby(level="trace", sort=False):
    ax.plot(g.index.get_level_values("fraction"), g["measured_gain"] * 100, marker="o", label=name)
ax.axhline(ARTICLE_GAIN * 100, color="k", ls="--", label="article: +23 %")
ax.axhline(0, color="grey", lw=0.8)
ax.set(xscale="log", xlabel="cache size / working set", ylabel="hit-rate gain of LRU-K (%)")
ax.legend(fontsize=7)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(OUT / "r3_gain.png", dpi=100)
plt.show()

# %% [markdown]
# **Reading the R3 table.** LRU-K's gain is a curve, not a constant: it is largest when the
# cache is small relative to the working set (the "seen twice" filter keeps one-off objects
# from displacing reused ones, which matters most when space is scarce) and shrinks toward
# zero as the cache approaches the working set (both policies then hold everything that is
# reused). Scans (`zipf-0.8+scans`) and traces where most blocks are seen once (Mooncake:
# `one_hit_share` above) are where the filter pays. On the Mooncake slice the hit rates are a
# few percent, so relative gains there are large ratios of small numbers -- read them with the
# absolute hit rates next to them. The article's +23 % is reproduced only at the sizes listed
# in `sizes_reaching_+23%`.

# %% [markdown]
# ## 4. R13: colour isolation under a burst
#
# Tenant `hi` (protected) issues a steady Zipf stream over 2,000 blocks. Tenant `lo` issues
# its own Zipf stream, and in the middle third of the run it **bursts**: 4 of every 5
# accesses become a scan of blocks never seen before. The cache holds 1,500 blocks.
# `color-lru` reserves half of it for `hi` (`shares={"hi": 0.5}`); its contract: a colour within
# its reservation never loses an object while an over-share colour still has one.

# %%
N_ISO = 60_000
CAP = 1_500


def two_tenant_trace(rng: np.random.Generator) -> tuple[list[int], list[str], np.ndarray]:
    """(keys, colours, phase) of the burst experiment; phase 0 before, 1 during, 2 after."""
    p = 1.0 / np.arange(1, 2_001, dtype=np.float64) ** 0.9
    p /= p.sum()
    hi_keys = rng.choice(2_000, size=N_ISO, p=p)  # ids 0..1999
    lo_keys = 10_000 + rng.choice(2_000, size=N_ISO, p=p)  # ids 10000..11999
    keys: list[int] = []
    colors: list[str] = []
    phases: list[int] = []
    fresh = 100_000
    for i in range(N_ISO):
        p_i = 3 * i // N_ISO  # 0 before, 1 during, 2 after the burst
        keys.append(int(hi_keys[i]))
        colors.append("hi")
        phases.append(p_i)
        if p_i == 1:  # the burst: lo scans new blocks, four for every hi access
            keys.extend(range(fresh, fresh + 4))
            colors.extend(["lo"] * 4)
            phases.extend([p_i] * 4)
            fresh += 4
        else:
            keys.append(int(lo_keys[i]))
            colors.append("lo")
            phases.append(p_i)
    ph = np.asarray(phases)
    return keys, colors, ph


def run_isolation(
    policy: str, params: dict[str, object], keys: list[int], colors: list[str], ph: np.ndarray
) -> tuple[pd.DataFrame, np.ndarray]:
    """Hit rate of each tenant in each phase under ``policy`` (one TierCache, unit sizes)."""
    cache = TierCache(
        capacity=CAP,
        policy=make_policy(policy, **params),
        high_watermark=1.0,
        low_watermark=1.0,
        name=policy,
    )
    hits = np.zeros(len(keys), dtype=bool)
    for i, (k, c) in enumerate(zip(keys, colors, strict=True)):
        hits[i] = cache.access(k, 1, i * 1e-3, c)
    col = np.asarray(colors)
    rows = []
    for tenant in ("hi", "lo"):
        for p, label in enumerate(("before", "burst", "after")):
            sel = (col == tenant) & (ph == p)
            rows.append(
                {"policy": policy, "tenant": tenant, "phase": label, "hit_rate": hits[sel].mean()}
            )
    return pd.DataFrame(rows), hits


keys, colors, ph = two_tenant_trace(np.random.default_rng(SEED + 1))
iso_lru, hits_lru = run_isolation("lru", {}, keys, colors, ph)
iso_col, hits_col = run_isolation("color-lru", {"shares": {"hi": 0.5}}, keys, colors, ph)
iso = pd.concat([iso_lru, iso_col], ignore_index=True)
iso_table = iso.pivot_table(
    index=["tenant", "phase"], columns="policy", values="hit_rate", sort=False
)
iso_table.to_csv(OUT / "r13_isolation.csv")
iso_table.round(3)

# %%
hi_burst = iso_table.loc[("hi", "burst")]
print(
    f"protected tenant 'hi' during the burst: lru {hi_burst['lru']:.3f}, "
    f"color-lru {hi_burst['color-lru']:.3f} "
    f"({(hi_burst['color-lru'] - hi_burst['lru']) / max(hi_burst['lru'], 1e-9):+.0%})"
)
# the isolation the contract promises must show: the reservation protects hi during the burst
assert hi_burst["color-lru"] > hi_burst["lru"], "color-lru should protect the hi tenant"

# rolling hit rate of hi over time (window of 2,000 hi accesses)
col = np.asarray(colors)
hi_idx = np.flatnonzero(col == "hi")
fig, ax = plt.subplots(figsize=(7, 3.4))
for label, h in (("lru", hits_lru), ("color-lru (hi 50 %)", hits_col)):
    s = pd.Series(h[hi_idx].astype(float)).rolling(2_000, min_periods=200).mean()
    ax.plot(np.arange(len(s)), s, label=label)
ax.axvspan(N_ISO // 3, 2 * N_ISO // 3, color="orange", alpha=0.15, label="lo bursts")
ax.set(xlabel="hi access #", ylabel="hi hit rate (rolling)", title="R13: colour isolation")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(OUT / "r13_isolation.png", dpi=100)
plt.show()

# %% [markdown]
# **Reading R13.** Under plain LRU the burst's scan pushes `hi`'s working set out, so its hit
# rate collapses during the burst and needs time to recover after it. With `color-lru`, `hi`
# stays within its reserved half, so only `lo`'s own objects are evicted and `hi`'s hit rate
# barely moves. The price is paid by `lo` outside the burst (it can use at most the other half
# while `hi` holds its share). The simulator-level version of this claim (tail latency of the
# high-priority model) is `scenarios/multi-model-coloring.yaml` (`pdsim run`).

# %%
print("files written:", ", ".join(sorted(p.name for p in OUT.iterdir())))
