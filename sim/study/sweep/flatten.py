"""Flatten a run summary into one row of scalar metrics, and the headline subset.

``flatten`` turns the nested summary of :func:`sim.runner.run_scenario` into dotted column
names (``latency.e2e.p99``, ``per_class.high.latency.e2e.p99``, ``hit_rate.hbm``...). Only scalars are
kept (numbers, booleans as 0/1, strings, ``None``); lists (claims) are dropped. The headline
set is what ``pdsim ab`` compares and what ``pdsim sweep`` prints.
"""

from __future__ import annotations

import re
from typing import Any

#: keys of the summary that describe the run rather than measure it
_SKIP = frozenset({"scenario", "seed", "claims", "variants"})

#: headline metrics in display order; ``per_class.*`` rows are added per class
HEADLINE: tuple[str, ...] = (
    "throughput.offered_rps",
    "throughput.achieved_rps",
    "overloaded",
    "goodput_rps",
    "slo_attainment",
    "throughput.output_tokens_per_s",
    "requests.completed",
    "requests.shed",
    "requests.rejected",
    "requests.unfinished",
    "requests.preemptions",
    "latency.e2e.p50",
    "latency.e2e.p99",
    "latency.ttft.p50",
    "latency.ttft.p99",
    "latency.tpot.p50",
    "latency.tpot.p99",
    "hit_rate.hbm",
    "hit_rate.remote",
    "hit_rate.object",
    "param_wait_share",
    "param_load_p99_s",
    "utilisation.busy",
    "utilisation.token_budget",
    "utilisation.mfu",
    "utilisation.mbu",
    "utilisation.pcie",
    "utilisation.nic",
    "utilisation.kv",
    "max_nic_utilisation",
    "kv_fragmentation",
    "availability",
    "degraded_rate",
    "requests.degraded",
    "faults.availability",
    "faults.requests_lost",
    "faults.recovery_time_s",
)
_PER_CLASS = re.compile(r"^per_class\.[^.]+\.(latency\.e2e\.p99|shed|goodput_rps)$")

#: +1: higher is better, -1: lower is better (used for A/B verdicts)
DIRECTION: dict[str, int] = {
    "throughput.achieved_rps": 1,
    "goodput_rps": 1,
    "slo_attainment": 1,
    "throughput.output_tokens_per_s": 1,
    "requests.completed": 1,
    "requests.shed": -1,
    "requests.rejected": -1,
    "requests.unfinished": -1,
    "requests.preemptions": -1,
    "hit_rate.hbm": 1,
    "hit_rate.remote": -1,
    "hit_rate.object": -1,
    "param_wait_share": -1,
    "param_load_p99_s": -1,
    "availability": 1,
    "degraded_rate": -1,
    "requests.degraded": -1,
    "faults.availability": 1,
    "faults.requests_lost": -1,
    "experts.hit_rate": 1,
    "experts.bytes_moved": -1,
}


def flatten(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted-path -> scalar for every scalar leaf of ``summary`` (insertion order kept)."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if not prefix and k in _SKIP:
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        elif isinstance(v, bool):
            out[name] = int(v)
        elif v is None or isinstance(v, int | float | str):
            out[name] = v
    return out


def direction(metric: str) -> int:
    """+1 if higher is better, -1 if lower is better (latencies and times), 0 if unknown."""
    if metric in DIRECTION:
        return DIRECTION[metric]
    if metric.endswith(".shed"):
        return -1
    if re.search(r"(latency|ttft|tbt)\.", metric) or metric.endswith("_s"):
        return -1
    return 0


def headline(columns: list[str]) -> list[str]:
    """The headline metrics present in ``columns``: :data:`HEADLINE` order, then per class."""
    present = set(columns)
    out = [c for c in HEADLINE if c in present]
    out += [c for c in columns if _PER_CLASS.match(c)]
    return out
