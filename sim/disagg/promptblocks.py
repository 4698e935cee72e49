"""Each request's prompt as prefix blocks: the ``hash_ids`` of a Mooncake trace, aligned with
the workload :func:`sim.serving.workload.make_workload` built from the same file.

The workload keeps the first ``workload.requests`` records (all of them when
``workload.duration`` bounds it), sorts them by timestamp (stable) and, when bounded, keeps the
arrivals before ``duration`` (times scaled by :func:`sim.serving.tracescale.time_scale`); this
module applies the same rule so request ``i`` gets the block list of the record that became
request ``i``. A record without ``hash_ids`` has no blocks.
Other workloads (generated, CSV traces) have none: the store then never hits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim.scenario import WorkloadCfg
from sim.serving.traceformat import trace_format
from sim.serving.tracescale import time_scale
from sim.serving.workload import trace_path


def trace_blocks(cfg: WorkloadCfg, n: int, base_dir: Path | None = None) -> list[list[int]]:
    """Per request (``n`` of them): its prompt's block ids, or ``[]`` (see the module
    docstring). The trace was read and validated by the workload already."""
    if cfg.kind != "trace" or not cfg.trace:
        return [[] for _ in range(n)]
    p = trace_path(cfg.trace, base_dir)
    if trace_format(cfg.trace_format, p) != "mooncake":
        return [[] for _ in range(n)]
    bounded = cfg.duration > 0
    limit = (1 << 62) if bounded else cfg.requests
    ts: list[float] = []
    blocks: list[list[int]] = []
    with p.open(encoding="utf-8") as fh:
        for line in fh:
            if len(ts) >= limit:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            ts.append(float(rec["timestamp"]) / 1000.0)
            blocks.append([int(h) for h in rec.get("hash_ids") or []])
    arrival = np.asarray(ts)
    order = np.argsort(arrival, kind="stable")
    out = [blocks[i] for i in order.tolist()]
    if bounded:
        rel = arrival[order] - arrival[order][0]
        rel = rel * time_scale(cfg, rel)
        out = [b for b, t in zip(out, rel.tolist(), strict=True) if t < cfg.duration]
    if len(out) != n:
        raise ValueError(f"trace gave {len(out)} block lists for {n} requests")
    return out
