"""``run_scenario``: the importable, CLI-free API that runs one scenario (all its variants).

Sweeps, chaos runs and the engine validation call this. It validates feasibility of every
variant *before* simulating anything, so a bad scenario raises :class:`InputError` and writes
nothing. With ``out_dir`` it writes the run folder (:mod:`sim.results`) atomically.

A scenario with ``variants`` runs once per variant (the variant's ``set`` overrides applied to
the base); the summary then holds ``variants: {name: summary}`` and the evaluated ``claims``.
Without variants the summary is the single run's. ``trace_hash`` is the blake2b of the event
trace (of all variants, in order): same scenario and seed -> same hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.cluster import Cluster, build, check_feasible
from sim.costmodel import CostModel, load_profile
from sim.metrics import TIERS, requests_frame, summarize
from sim.models import load_catalogue
from sim.scenario import Scenario, resolved_dict, variant

Progress = Callable[[float, str], None]


@dataclass
class RunResult:
    """Everything one run produced. ``requests``/``timeseries`` carry a ``variant`` column."""

    summary: dict[str, Any]
    requests: pd.DataFrame
    timeseries: pd.DataFrame
    trace_hash: str
    config: dict[str, Any]
    out_dir: Path | None = None
    claims: list[dict[str, Any]] = field(default_factory=list)
    #: the fault schedule actually applied, unrounded (one list per variant, in order)
    faults_applied: list[list[dict[str, Any]]] = field(default_factory=list)


def _timeseries(cl: Cluster) -> pd.DataFrame:
    cols = [
        "t",
        "arrived",
        "final",
        "queued",
        "running",
        *[f"hits_{t}" for t in TIERS],
        *[f"bytes_{t}" for t in TIERS],
        "hbm_weights_bytes",
        "kv_reserved_bytes",
        "kv_fragmentation",
    ]
    df = pd.DataFrame(cl.ctx.metrics.samples, columns=cols)
    dt = df["t"].diff().replace(0, np.nan)
    df["qps"] = (df["arrived"].diff() / dt).fillna(0.0)
    hits = df[[f"hits_{t}" for t in TIERS]].diff()
    tot = hits.sum(axis=1).replace(0, np.nan)
    df["hbm_hit_rate"] = (hits["hits_hbm"] / tot).astype(float)
    return df


def _extra(cl: Cluster, end: float) -> dict[str, Any]:
    ctx, env = cl.ctx, cl.env
    nodes = ctx.nodes
    span = max(end, 1e-12)
    nic = [lk.utilisation(env.now) for n in nodes for lk in [n.ws.links["nic"]]]
    ps_nic = [s.links["nic"].utilisation(env.now) for s in ctx.servers]
    pcie = [n.ws.links["pcie"].utilisation(env.now) for n in nodes]
    frag = [s[-1] for s in ctx.metrics.samples] or [0.0]
    met = ctx.metrics
    util = sum(n.busy for n in nodes) / (len(nodes) * span)
    return {
        "events": env.steps,
        "events_per_request": env.steps / max(cl.wl.n, 1),
        "peak_hbm_bytes_per_node": met.peak_hbm,
        "weight_bytes_per_node": float(np.mean([n.ws.hbm.used for n in nodes])),
        "compute_utilisation": util,
        "pcie_utilisation": float(np.mean(pcie)),
        "fetches_after_warmup": int(sum(n.ws.fetches_after_warmup for n in nodes)),
        "kv_fragmentation": float(np.mean(frag)),
        # the busiest NIC of any compute node or parameter server (0..1)
        "max_nic_utilisation": float(max(nic + ps_nic)) if nic else 0.0,
        "recovery_time_s": None,  # set by fault scenarios (issue 5)
        "max_context_limit": {m.name: int(min(m.max_context, 1 << 30)) for m in ctx.models},
        # for sim.plan (issue 7): which resource saturates first
        "node_nic_utilisation": float(max(nic)) if nic else 0.0,
        "ps_nic_utilisation": float(max(ps_nic)) if ps_nic else 0.0,
        "ps_utilisation": float(
            max(
                (
                    max(s.links["nic"].utilisation(env.now), s.links["ssd"].utilisation(env.now))
                    for s in ctx.servers
                ),
                default=0.0,
            )
        ),
        "hbm_bytes_per_node": int(ctx.nodes[0].ws.hbm.capacity + ctx.nodes[0].kv.capacity),
    }


def _run_one(
    sc: Scenario,
    seed: int,
    cat: dict[str, Any],
    prof: Any,
    base: Path | None,
    progress: Callable[[float, float], None] | None,
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame, str, list[dict[str, Any]]]:
    cl = build(sc, seed, cat, prof, CostModel, base)
    from sim.faultinject import attach  # control plane + faults (issue 5); None when off

    ctl = attach(cl)
    end = cl.run(progress)
    ctx = cl.ctx
    names = [m.name for m in ctx.models]
    classes = [c.name for c in sc.workload.classes]
    df = requests_frame(ctx.metrics, cl.wl, names, classes)
    slos = {c.name: c.slo for c in sc.workload.classes}
    h = ctx.trace.hexdigest()
    extra = _extra(cl, end)
    extra["trace_hash"] = h
    if ctl is not None:
        extra.update(ctl.finish(end, h))
        h = extra["trace_hash"]
        extra["recovery_time_s"] = extra["faults"]["recovery_time_s"]
    summary = summarize(df, ctx.metrics, end, slos, extra)
    applied = list(ctl.applied) if ctl is not None else []
    return summary, df, _timeseries(cl), h, applied


def lookup_metric(summary: dict[str, Any], path: str) -> Any:
    """Value at dotted ``path`` (e.g. ``per_class.high.latency.p99``) or ``None``."""
    cur: Any = summary
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def evaluate_claims(sc: Scenario, summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim with the figure this run measured for it (never hard-coded)."""
    out = []
    first = next(iter(summaries))
    for c in sc.claims:
        v = lookup_metric(summaries.get(c.variant or first, {}), c.metric)
        measured: float | None
        if c.kind == "value":
            measured = v
        else:
            b = lookup_metric(summaries.get(c.baseline or first, {}), c.metric)
            if v is None or b is None or b == 0:
                measured = None
            elif c.kind == "relative":
                measured = (v - b) / b * 100.0
            else:
                measured = v / b
        out.append({**c.model_dump(), "measured": measured})
    return out


def format_claim(c: dict[str, Any]) -> str:
    m = c["measured"]
    if m is None:
        ms = "n/a"
    elif c["kind"] == "relative":
        ms = f"{m:+.1f}%"
    elif c["kind"] == "ratio":
        ms = f"{m:.2f}x"
    elif "latency" in c["metric"] or "ttft" in c["metric"] or c["metric"].endswith("_s"):
        ms = f"{m * 1e3:.1f} ms" if abs(m) < 1 else f"{m:.3g} s"
    elif "bytes" in c["metric"]:
        ms = f"{m / 2**30:.1f} GiB"
    else:
        ms = f"{m:.4g}"
    what = c["metric"] + (f" ({c['variant']} vs {c['baseline']})" if c["kind"] != "value" else "")
    return f"{c['id']}: article: {c['article']}, measured: {ms}  [{what}]"


def run_scenario(
    scenario: Scenario,
    seed: int = 0,
    out_dir: str | Path | None = None,
    progress: Progress | None = None,
    catalogue: dict[str, Any] | None = None,
    profile: Any = None,
) -> RunResult:
    """Run ``scenario`` (every variant) with root ``seed``; write the run folder under
    ``out_dir`` if given (see :func:`sim.results.write_run`). ``progress(fraction, label)``."""
    cat = catalogue if catalogue is not None else load_catalogue(scenario.catalogue)
    prof = profile if profile is not None else load_profile(scenario.profile)
    runs = [(v.name, variant(scenario, v)) for v in scenario.variants] or [("", scenario)]
    for _, sc in runs:  # every error before any simulation or any file
        check_feasible(sc, cat, prof)
    base = Path(scenario.source).parent if scenario.source != "<memory>" else None
    summaries: dict[str, dict[str, Any]] = {}
    applied_all: list[list[dict[str, Any]]] = []
    reqs, series = [], []
    hashes = hashlib.blake2b(digest_size=16)
    for i, (name, sc) in enumerate(runs):

        def prog(frac: float, now: float, i: int = i, name: str = name) -> None:
            if progress is not None:
                progress((i + frac) / len(runs), f"{name or scenario.name} t={now:.2f}s")

        s, df, ts, h, applied = _run_one(sc, seed, cat, prof, base, prog)
        applied_all.append(applied)
        summaries[name] = s
        df.insert(0, "variant", name)
        ts.insert(0, "variant", name)
        reqs.append(df)
        series.append(ts)
        hashes.update(h.encode())
    claims = evaluate_claims(scenario, summaries)
    if len(runs) == 1 and not scenario.variants:
        summary = dict(summaries[""])
    else:
        summary = {"variants": summaries, "trace_hash": hashes.hexdigest()}
    summary = {"scenario": scenario.name, "seed": seed, **summary, "claims": claims}
    result = RunResult(
        summary=summary,
        requests=pd.concat(reqs, ignore_index=True),
        timeseries=pd.concat(series, ignore_index=True),
        trace_hash=str(summary["trace_hash"]),
        config={"scenario": resolved_dict(scenario), "seed": seed},
        claims=claims,
        faults_applied=applied_all,
    )
    if out_dir is not None:
        from sim.results import write_run

        result.out_dir = write_run(Path(out_dir), scenario, seed, result)
    return result
