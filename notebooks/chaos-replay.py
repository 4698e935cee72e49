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
# # Chaos replay: a partition drill, step by step
#
# A chaos run is deterministic: a *replay file* (scenario fully resolved, seed, the fault
# schedule actually applied, the hash of the event trace) re-runs it bit for bit
# (`sim.study.recording`, `pdsim replay FILE [--until T]`). This notebook
#
# 1. records a replay file from the `chaos-partition` drill (R17: a majority/minority
#    partition, a majorities ring, a one-way bridge, each healed) -- or loads one you give it;
# 2. re-runs it and checks the trace hash matches;
# 3. **steps through** the first partition with `replay(..., until=T)`: the cluster's state
#    (Raft replicas, leader, cut links, queues) just before, during and after it;
# 4. observes the whole run at the simulator's own progress steps (no extra events, so the
#    trace hash must still match) and plots **leader changes**, **queue lengths** and
#    **availability** over time against the fault windows.
#
# Files go under `OUT` only.

# %% tags=["parameters"]
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, bare display lines)
import os
from pathlib import Path

import engine

#: the repository root (notebooks run from any folder: Jupyter starts them in notebooks/)
ROOT = Path(engine.__file__).resolve().parent.parent
OUT = Path(os.environ.get("PDSIM_NOTEBOOK_OUT", ROOT / "runs" / "notebooks")) / "chaos-replay"
#: an existing replay file to study (e.g. one `pdsim chaos` wrote for a failing seed);
#: None records a fresh one from SCENARIO with SEED
REPLAY_FILE: str | None = None
SCENARIO = ROOT / "scenarios" / "chaos-partition.yaml"
SEED = 7
#: width of the availability windows (s)
WINDOW = 0.1

# %%
import sys

import matplotlib

if "ipykernel" not in sys.modules:  # headless script run: no display
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sim.cluster import build
from sim.control.faultinject import attach
from sim.scenario import load_scenario
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.metrics import requests_frame
from sim.serving.models import load_catalogue
from sim.study.recording import load_replay, replay, run_checked, write_replay

OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## 1. The replay file

# %%
if REPLAY_FILE is None:
    drill = load_scenario(SCENARIO)
    outcome = run_checked(drill, SEED)
    path = write_replay(OUT / f"{drill.name}-seed{SEED}.replay.json", drill, SEED, outcome)
    print(
        f"recorded {path.name}: checkers {'clean' if outcome.ok else 'FOUND ' + str(outcome.findings)}, "
        f"availability {outcome.availability}, requests lost {outcome.requests_lost}"
    )
else:
    path = Path(REPLAY_FILE)

record, sc = load_replay(path)
print(
    f"{path.name}: scenario {sc.name!r}, seed {record['seed']}, "
    f"package {record.get('package_version')}, simulated {record.get('sim_time', 0):.2f} s"
)
print("findings:", record.get("findings") or "none")
schedule = pd.DataFrame(record.get("faults_applied", []))
schedule

# %% [markdown]
# ## 2. Does it replay bit for bit?

# %%
full = replay(path)
print(f"expected {full.expected}\ngot      {full.got}\nschedule matches: {full.schedule_matches}")
assert full.matches, "the replay diverged from the recorded run"

# %% [markdown]
# ## 3. Step through the first partition
#
# `replay(path, until=T)` re-runs the file and stops at simulated time `T` with a state dump.
# Three stops: just before the first partition starts, in its middle, and after it healed.

# %%
# the first partition; else the first fault with a window; else fixed fractions of the run
kinds = schedule["kind"] if not schedule.empty else pd.Series(dtype=str)
windowed = schedule[(kinds != "heal") & schedule.get("duration", pd.Series(dtype=float)).notna()]
chosen = windowed[windowed["kind"] == "partition"] if not windowed.empty else windowed
chosen = chosen if not chosen.empty else windowed
if not chosen.empty:
    first = chosen.iloc[0]
    at, dur = float(first["at"]), float(first["duration"])
    print(f"first {first['kind']}: {first.to_dict()}")
else:
    at, dur = record.get("sim_time", 1.0) / 3, record.get("sim_time", 1.0) / 3
    print("no fault window in this replay: stopping at fixed fractions of the run")
stops = {"before": max(at - 0.05, 0.0), "during": at + dur / 2, "after": at + dur + 0.3}
dumps = {}
for label, t in stops.items():
    rep = replay(path, until=t)
    assert rep.schedule_matches, f"faults applied before {t} s differ from the record"
    dumps[label] = rep.outcome.state

# %%
rows = []
for label, st in dumps.items():
    for r in st["raft"]:
        rows.append(
            {"stop": f"{label} (t={st['time']:.2f}s)", **r, "leader": st["leader"] == r["id"]}
        )
raft_steps = pd.DataFrame(rows)
raft_steps.pivot_table(
    index=["id", "host"], columns="stop", values=["role", "term"], aggfunc="first", sort=False
)

# %%
pd.DataFrame(
    [
        {
            "stop": label,
            "t": st["time"],
            "leader": st["leader"],
            "cut links": len(st["cuts"]),
            "queued": sum(n["queued"] for n in st["nodes"]),
            "running": sum(n["running"] for n in st["nodes"]),
            "arrived": st["requests"]["arrived"],
            "final": st["requests"]["final"],
            "findings": len(st["findings"]),
        }
        for label, st in dumps.items()
    ]
)

# %% [markdown]
# ## 4. The whole run, observed
#
# The same run built from the replay's scenario and seed, with the fault control plane
# attached, sampled through the simulator's progress callback (called between its own run
# steps, so it adds no simulation event). The trace hash must equal the recorded one.

# %%
base = Path(sc.source).parent if Path(sc.source).is_file() else None
cl = build(
    sc, int(record["seed"]), load_catalogue(sc.catalogue), load_profile(sc.profile), CostModel, base
)
ctl = attach(cl)
assert ctl is not None, "the scenario has no fault control plane (faults.enabled is off)"
states: list[dict] = []
end = cl.run(lambda _frac, _now: states.append(ctl.state()))
finished = ctl.finish(end, cl.ctx.trace.hexdigest())
assert finished["trace_hash"] == record["trace_hash"], "observing the run changed it"
print(f"{len(states)} samples over {end:.2f} s; trace hash matches the replay file")

timeline = pd.DataFrame(
    {
        "t": [s["time"] for s in states],
        "leader": [s["leader"] if s["leader"] is not None else np.nan for s in states],
        "term": [max(r["term"] for r in s["raft"]) for s in states],
        "cuts": [len(s["cuts"]) for s in states],
        "arrived": [s["requests"]["arrived"] for s in states],
        "final": [s["requests"]["final"] for s in states],
        **{
            f"queued_{n['name']}": [s["nodes"][i]["queued"] for s in states]
            for i, n in enumerate(states[0]["nodes"])
        },
    }
)
timeline.to_csv(OUT / "timeline.csv", index=False)
# a leader change: a sample whose leader differs from the previous sample's, and is not "none"
lead = timeline["leader"].fillna(-1)
changes = timeline[(lead != lead.shift()) & (lead >= 0) & (timeline.index > 0)]
print(
    f"leader changes seen: {len(changes)}; leaderless samples: "
    f"{int(timeline['leader'].isna().sum())} of {len(timeline)}"
)

# %%
classes = [c.name for c in sc.workload.classes]
reqs = requests_frame(cl.ctx.metrics, cl.wl, [m.name for m in cl.ctx.models], classes)
slo = reqs["cls"].map({c.name: c.slo for c in sc.workload.classes}).astype(float)
reqs["ok"] = (reqs["status"] == "done") & ((reqs["end"] - reqs["arrival"]) <= slo)
edges = np.arange(0.0, reqs["arrival"].max() + WINDOW, WINDOW)
reqs["window"] = pd.cut(reqs["arrival"], edges, right=False, labels=edges[:-1])
reqs["latency"] = reqs["end"] - reqs["arrival"]
avail = reqs.groupby("window", observed=True).agg(
    ok=("ok", "mean"), n=("ok", "size"), p99=("latency", lambda x: x.quantile(0.99))
)
avail.index = avail.index.astype(float)
overall = float(reqs["ok"].mean())
print(f"availability (answered within SLO): {overall:.3f} over {len(reqs)} requests")
reported = finished.get("faults", {}).get("availability")
if reported is not None:
    print(f"the control plane's summary says: {reported:.3f}")
    # same definition (answered within the class SLO / all requests): the two must agree
    assert abs(reported - overall) < 1e-9, "availability differs from the control plane's"


# %%
def shade(ax: plt.Axes) -> None:
    """Shade each fault window of the schedule (partitions orange, others grey)."""
    for _, f in schedule.iterrows():
        d = f.get("duration")
        if f["kind"] == "heal" or d is None or not np.isfinite(d):
            continue
        color = "orange" if f["kind"] == "partition" else "grey"
        ax.axvspan(f["at"], f["at"] + d, color=color, alpha=0.15)


fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
ax = axes[0]
ax.step(timeline["t"], timeline["leader"], where="post", label="leader replica id")
ax.step(timeline["t"], timeline["term"], where="post", ls="--", label="highest term")
ax.plot(changes["t"], changes["leader"], "rv", ms=6, label="leader change")
ax.set(ylabel="replica / term", title=f"{sc.name}, seed {record['seed']} (orange: partitions)")
ax.legend(fontsize=7, loc="upper left")
for col in [c for c in timeline.columns if c.startswith("queued_")]:
    axes[1].step(timeline["t"], timeline[col], where="post", label=col.removeprefix("queued_"))
axes[1].set(ylabel="queued requests")
axes[1].legend(fontsize=7, loc="upper left")
axes[2].bar(avail.index, avail["ok"], width=WINDOW * 0.9, align="edge", label="per window")
lat_ax = axes[2].twinx()
lat_ax.plot(avail.index + WINDOW / 2, avail["p99"], "r.-", lw=0.8, label="P99 latency")
lat_ax.set_ylabel("P99 latency (s), by arrival", color="r")
axes[2].axhline(overall, color="k", ls="--", lw=0.8, label=f"whole run {overall:.2f}")
axes[2].set(xlabel="simulated time (s)", ylabel="answered within SLO (bars)", ylim=(0, 1.05))
axes[2].legend(fontsize=7, loc="lower left")
for a in axes:
    shade(a)
    a.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(OUT / "chaos_timeline.png", dpi=100)
plt.show()

# %% [markdown]
# ## 5. What the control plane reported

# %%
faults = finished.get("faults", {})
print("checker violations:", faults.get("violations") or "none")
print("initial election (s):", faults.get("initial_election_s"))
print("time to elect a new leader per fault (s):", faults.get("time_to_elect_s"))
print("requests lost:", faults.get("requests_lost"))
pd.DataFrame(faults.get("downtime", []))

# %% [markdown]
# **Reading.** What to look for in the timeline:
#
# * **Leader changes.** A partition that leaves the leader with a majority changes nothing for
#   the majority, but the cut-off replicas keep starting elections, so the highest term
#   (dashed) climbs while the leader stays. When such a partition heals, the cut-off
#   replica's higher term makes the leader step down (this Raft has no pre-vote), so a
#   leaderless gap can come *after* the heal. A partition that cuts the leader off from the
#   majority ends its term inside the window; the majority side elects a new one.
# * **Queues.** Nodes cut off from parameter servers retry on other replicas or fall back to
#   the object store; fetches slow down and queues build inside the fault windows and drain
#   after the heals.
# * **Availability.** The bars are the share of requests (by arrival window) answered within
#   their class SLO; the red line their P99 latency. A drill the cluster rides out keeps the
#   bars at 1 while the latency line shows the cost.
#
# Every number here is reproducible from the replay file alone.

# %%
print("files written:", ", ".join(sorted(p.name for p in OUT.iterdir())))
