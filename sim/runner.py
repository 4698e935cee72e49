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
from sim.scenario import Scenario, resolved_dict, variant
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.expertpath import merge_summaries
from sim.serving.metrics import TIERS, requests_frame, summarize
from sim.serving.models import load_catalogue
from sim.serving.prefixcache import prefix_summary

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
    #: the autoscaler's timeline (sim.control.autoscale.report.timeline; ``variant``
    #: column), None when no variant autoscales
    autoscale: pd.DataFrame | None = None


def _timeseries(cl: Cluster) -> pd.DataFrame:
    """The sampler's rows plus rates between samples: ``qps`` (arrivals/s), ``completed_rps``
    (requests final/s), ``hbm_hit_rate`` (HBM hits / chunk accesses), ``busy`` and
    ``token_budget`` (the replicas' mean utilisation, as in the summary)."""
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
        "accesses",
        "busy_s",
        "token_s",
        "preemptions",
    ]
    df = pd.DataFrame(cl.ctx.metrics.samples, columns=cols)
    dt = df["t"].diff().replace(0, np.nan)
    df["qps"] = (df["arrived"].diff() / dt).fillna(0.0)
    df["completed_rps"] = (df["final"].diff() / dt).fillna(0.0)
    acc = df["accesses"].diff().replace(0, np.nan)
    df["hbm_hit_rate"] = (df["hits_hbm"].diff() / acc).astype(float)
    r = max(len(cl.ctx.nodes), 1)
    df["busy"] = (df["busy_s"].diff() / (dt * r)).fillna(0.0)
    budget = cl.ctx.sc.cluster.replica.max_num_batched_tokens
    df["token_budget"] = (df["token_s"].diff() / (dt * r * budget)).fillna(0.0)
    return df


def utilisation(
    cl: Cluster, held: Callable[[float, float], float] | None = None
) -> dict[str, float]:
    """Each resource's used share of its capacity over the steady window (work counters at
    its two ends, :meth:`sim.cluster.Cluster.snapshot`): ``busy`` (a replica computing; at
    most 1),
    ``token_budget`` (tokens per iteration / ``max_num_batched_tokens``, time-weighted),
    ``mfu`` (model FLOPs / peak FLOP/s of every GPU), ``mbu`` (HBM bytes read / HBM bandwidth
    of every GPU), and bytes carried / bandwidth x time of the replicas' ``pcie``, ``nic`` and
    ``nvme`` links and the parameter servers' ``ps_nic`` and ``ps_ssd``; ``kv`` is the mean
    share of the KV blocks reserved (time-series samples in the window). ``held(t0, t1)``:
    replica-seconds held in ``[t0, t1]`` when the replica count changes (autoscaling); the
    replica and GPU shares then divide by it instead of every replica x the window."""
    a, b = cl.snaps["w0"], cl.snaps["w1"]
    dt = max(b["t"] - a["t"], 1e-12)
    sc = cl.ctx.sc
    c = sc.cluster
    r: float = len(cl.ctx.nodes)
    if held is not None:
        r = max(held(a["t"], b["t"]) / dt, 1e-12)  # mean replicas held over the window
    gpus = cl.ctx.disagg.gpus if cl.ctx.disagg is not None else r * c.gpus_per_replica
    gpu = cl.ctx.models[0].cost.profile.gpu
    peak = gpu.flops_fp16 if cl.ctx.models[0].cost.model.dtype_bytes <= 2 else gpu.flops_fp32

    def d(key: str) -> float:
        return b[key] - a[key]

    out = {
        # busy time is counted when an iteration (or a closed-form run of them) is priced,
        # so one that crosses the window's end counts whole: the share is capped at 1
        "busy": min(d("busy") / (r * dt), 1.0),
        "token_budget": d("tok_s") / (c.replica.max_num_batched_tokens * r * dt),
        "mfu": d("flops") / (peak * gpus * dt),
        "mbu": d("hbm_read") / (gpu.hbm_bandwidth * gpus * dt),
    }
    for kind in ("pcie", "nic", "nvme", "ps_nic", "ps_ssd"):
        bw = b[f"{kind}_bw"]
        out[kind] = d(f"{kind}_bytes") / (bw * dt) if bw > 0 else 0.0
    cap: float = sum(n.kv.capacity for n in cl.ctx.nodes)
    if held is not None:  # autoscaled replicas are alike: one's capacity x the mean held
        cap = cl.ctx.nodes[0].kv.capacity * r
    kv = [row[16] for row in cl.ctx.metrics.samples if a["t"] <= row[0] <= b["t"]]
    out["kv"] = float(np.mean(kv)) / cap if kv and cap else 0.0
    return out


def _hit_rate(cl: Cluster) -> dict[str, float | None]:
    """Weight-chunk accesses over the steady window: ``hbm`` = accesses that found the chunk
    in HBM / accesses (each access counted once); ``host``, ``nvme``, ``remote``, ``object``
    = chunks fetched into HBM from that tier / accesses (prefetches included, so with
    prefetch these need not add up to 1 - hbm); ``local`` = hbm + host + nvme."""
    a, b = cl.snaps["w0"], cl.snaps["w1"]
    acc = b["accesses"] - a["accesses"]
    out: dict[str, float | None] = {
        t: ((b[f"hits_{t}"] - a[f"hits_{t}"]) / acc if acc else None) for t in TIERS
    }
    out["local"] = (
        sum(v for k, v in out.items() if k in ("hbm", "host", "nvme") and v is not None)
        if acc
        else None
    )
    out["cross_node"] = out["remote"]
    out["disk_fallback"] = out["object"]
    return out


def _extra(
    cl: Cluster, end: float, held: Callable[[float, float], float] | None = None
) -> dict[str, Any]:
    ctx, env = cl.ctx, cl.env
    nodes = ctx.nodes
    frag = [s[17] for s in ctx.metrics.samples] or [0.0]
    met = ctx.metrics
    util = utilisation(cl, held)
    nic = [n.ws.links["nic"].utilisation(env.now) for n in nodes]
    ps_nic = [s.links["nic"].utilisation(env.now) for s in ctx.servers]
    experts = [e for n in nodes for e in n.experts if e is not None]
    more = {"experts": merge_summaries(experts)} if experts else {}
    return {
        **more,
        "events": env.steps,
        "events_per_request": env.steps / max(cl.wl.n, 1),
        "replicas": len(nodes),
        "gpus": len(nodes) * ctx.sc.cluster.gpus_per_replica,
        "utilisation": util,
        "hit_rate": _hit_rate(cl),
        "bytes_by_tier": {t: float(met.tier_bytes[i]) for i, t in enumerate(TIERS) if i > 0},
        "peak_hbm_bytes_per_replica": met.peak_hbm,
        "weight_bytes_per_replica": float(np.mean([n.ws.hbm.used for n in nodes])),
        "kv_bytes_per_replica": int(nodes[0].kv.capacity),
        "fetches_after_warmup": int(sum(n.ws.fetches_after_warmup for n in nodes)),
        "kv_fragmentation": float(np.mean(frag)),
        "kv": prefix_summary([getattr(n, "prefix", None) for n in nodes]),
        # the busiest NIC of any replica or parameter server, over the whole run (0..1)
        "max_nic_utilisation": float(max(nic + ps_nic)) if nic else 0.0,
        "recovery_time_s": None,  # set by fault scenarios
        "max_context_limit": {m.name: int(min(m.max_context, 1 << 30)) for m in ctx.models},
        "stop_reason": cl.stop_reason,
        "rejected_reasons": cl.rejected_reasons(),
    }


def _run_one(
    sc: Scenario,
    seed: int,
    cat: dict[str, Any],
    prof: Any,
    base: Path | None,
    progress: Callable[[float, float], None] | None,
) -> tuple[
    dict[str, Any], pd.DataFrame, pd.DataFrame, str, list[dict[str, Any]], pd.DataFrame | None
]:
    cl = build(sc, seed, cat, prof, CostModel, base)
    from sim.control.faultinject import attach  # control plane + faults (issue 5); None when off

    ctl = attach(cl)
    from sim.control.autoscale import attach as attach_autoscaler  # None when off

    scaler = attach_autoscaler(cl, prof)
    end = cl.run(progress)
    ctx = cl.ctx
    names = [m.name for m in ctx.models]
    classes = [c.name for c in sc.workload.classes]
    df = requests_frame(ctx.metrics, cl.wl, names, classes)
    h = ctx.trace.hexdigest()
    extra = _extra(cl, end, scaler.replica_seconds if scaler is not None else None)
    extra["trace_hash"] = h
    if ctx.disagg is not None:
        extra["gpus"] = ctx.disagg.gpus
        extra["disaggregation"] = ctx.disagg.summary()
    if ctl is not None:
        extra.update(ctl.finish(end, h))
        h = extra["trace_hash"]
        extra["recovery_time_s"] = extra["faults"]["recovery_time_s"]
    scaled = None
    if scaler is not None:
        from sim.control.autoscale import report

        extra["autoscale"] = report.summary(scaler, end, df)
        extra["gpus"] = extra["autoscale"]["peak_replicas"] * sc.cluster.gpus_per_replica
        scaled = report.timeline(scaler, df, classes_slo(sc))
    summary = summarize(
        df, ctx.metrics, end, classes_slo(sc), extra, cl.window(), cl.wl.closed_loop
    )
    applied = list(ctl.applied) if ctl is not None else []
    return summary, df, _timeseries(cl), h, applied, scaled


def classes_slo(sc: Scenario) -> dict[str, dict[str, float | None]]:
    """Each workload class's objectives: ``{"e2e", "ttft", "tpot"}`` in seconds or ``None``."""
    return {
        c.name: {"e2e": c.slo, "ttft": c.ttft_slo, "tpot": c.tpot_slo} for c in sc.workload.classes
    }


def lookup_metric(summary: dict[str, Any], path: str) -> Any:
    """Value at dotted ``path`` (e.g. ``per_class.high.latency.p99``) or ``None``; a key that
    itself holds dots (``max_context_limit.llama-3.1-8b``) is matched whole."""
    cur: Any = summary
    parts = path.split(".")
    i = 0
    while i < len(parts):
        if not isinstance(cur, dict):
            return None
        for j in range(len(parts), i, -1):  # the longest dotted key first
            key = ".".join(parts[i:j])
            if key in cur:
                cur, i = cur[key], j
                break
        else:
            return None
    return cur


def evaluate_claims(sc: Scenario, summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim with the figure this run measured for it (never hard-coded), with
    ``seeds: 1`` and ``ci_low``, ``ci_high``, ``verdict`` of ``None`` (see :mod:`sim.study.claims`)."""
    if not sc.claims:
        return []  # the study package is not imported for a run without claims
    from sim.study.claims import single_run_fields

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
        # one run is one seed: no interval, no verdict (``python -m sim.study.claims`` gives them)
        out.append({**c.model_dump(), **single_run_fields(measured)})
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
    seeds = c.get("seeds", 1)
    note = "; 1 seed: no interval or verdict" if seeds == 1 else ""
    return f"{c['id']}: article: {c['article']}, measured: {ms}  [{what}{note}]"


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
    reqs, series, scaled = [], [], []
    hashes = hashlib.blake2b(digest_size=16)
    for i, (name, sc) in enumerate(runs):

        def prog(frac: float, now: float, i: int = i, name: str = name) -> None:
            if progress is not None:
                progress((i + frac) / len(runs), f"{name or scenario.name} t={now:.2f}s")

        s, df, ts, h, applied, sc_ts = _run_one(sc, seed, cat, prof, base, prog)
        if sc_ts is not None:
            sc_ts.insert(0, "variant", name)
            scaled.append(sc_ts)
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
        # one run: its frame as is (a concat would copy every column once more)
        requests=reqs[0] if len(reqs) == 1 else pd.concat(reqs, ignore_index=True),
        timeseries=series[0] if len(series) == 1 else pd.concat(series, ignore_index=True),
        trace_hash=str(summary["trace_hash"]),
        config={"scenario": resolved_dict(scenario), "seed": seed},
        claims=claims,
        faults_applied=applied_all,
        autoscale=pd.concat(scaled, ignore_index=True) if scaled else None,
    )
    if out_dir is not None:
        from sim.results import write_run

        result.out_dir = write_run(Path(out_dir), scenario, seed, result)
    return result
