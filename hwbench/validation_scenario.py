"""The simulator side of the validation: the scenario folder that mirrors the engine's setup.

:func:`write_scenario` writes ``scenario.yaml``, ``trace.csv``, ``catalogue.yaml`` and
``profile.json`` for a :class:`hwbench.workloads.ValidationWorkload`: one node, one (unused)
parameter server, the same chunking, HBM weight cache, host and NVMe sizes, policies,
prefetch window and order (``prefetch.order: after-pin``), KV budget, batching limits and HBM
warm-up as :mod:`hwbench.validation_engine` serves it with (all from
:mod:`hwbench.validation_models`). ``pdsim run DIR/scenario.yaml`` of that folder builds the
scenario as :func:`hwbench.validate.run_simulator` does, so it reproduces the simulator's
figures.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import yaml

from hwbench.validation_models import (
    CHUNK_BYTES,
    HOLD_PINS,
    Sizes,
    catalogue_text,
    model_config,
    sizes,
)
from hwbench.workloads import ValidationWorkload, arrivals
from sim.serving.costmodel import Profile

__all__ = ["scenario_dict", "write_scenario"]


def scenario_dict(w: ValidationWorkload, sz: Sizes, model: str, trace: Path) -> dict[str, Any]:
    """The simulator scenario that matches the engine's setup for ``w``: model ``model``,
    capacities ``sz``, requests read from the CSV trace ``trace``."""
    return {
        "name": f"validate-{w.name}",
        "deployments": [{"model": model}],
        "cluster": {
            "servers": 1,
            "param_servers": 1,
            "gpu": {
                "hbm": 4 * sz.hbm_weights,  # weight cache = hbm / 4 exactly, KV = the rest
                "memory_utilization": 1.0,
                "workspace": 0,
                "weight_cache_fraction": 0.25,
            },
            "server": {"host": sz.host, "nvme": sz.ssd},
            # the engine's batch scheduler: whole prompts, the first always admitted
            "replica": {
                "max_num_seqs": w.max_batch,
                "max_num_batched_tokens": w.max_batch_tokens,
                "chunked_prefill": False,
            },
            "ps": {"dram": sz.model, "ssd": 4 * sz.model},
        },
        "chunks": {"size": CHUNK_BYTES, "sharding": "layer"},
        "cache": {
            "hbm_policy": w.policy,
            "host_policy": "lru",
            "nvme_policy": "lru",
            "params": dict(w.policy_params),
            "high_watermark": 1.0,
            "low_watermark": 1.0,
        },
        "prefetch": {
            "enabled": w.window > 0,
            "window_batches": max(w.window, 1),
            "order": "after-pin" if HOLD_PINS else "before-demand",  # the engine's rule
        },
        "warmup": {"enabled": True, "ps_fraction": 1.0, "node_hbm": True},
        "kv": {"block_tokens": 16},
        "workload": {
            "kind": "trace",
            "trace": str(trace),
            "trace_format": "csv",
            "requests": w.requests,
        },
    }


def write_scenario(w: ValidationWorkload, profile: Profile, folder: Path) -> Path:
    """Write ``w``'s simulator scenario folder (module docstring) into ``folder`` (created if
    missing) and return the path of its ``scenario.yaml``."""
    cfg = model_config(w)
    sz = sizes(w, cfg)
    folder.mkdir(parents=True, exist_ok=True)
    t, inp, out = arrivals(w)
    with (folder / "trace.csv").open("w", newline="", encoding="utf-8") as fh:
        wr = csv.writer(fh)
        wr.writerow(["time", "input_tokens", "output_tokens"])
        for row in zip(t.tolist(), inp.tolist(), out.tolist(), strict=True):
            wr.writerow([repr(row[0]), row[1], row[2]])
    (folder / "catalogue.yaml").write_text(catalogue_text(cfg), encoding="utf-8")
    (folder / "profile.json").write_text(profile.model_dump_json(indent=2) + "\n", "utf-8")
    doc = scenario_dict(w, sz, cfg.name, Path("trace.csv"))
    doc["profile"] = str((folder / "profile.json").resolve())
    doc["catalogue"] = str((folder / "catalogue.yaml").resolve())
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
