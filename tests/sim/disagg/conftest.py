"""A small disaggregated scenario (Llama-3.1-8B on one H200 server) the tests build on."""

from __future__ import annotations

import copy
from typing import Any

from sim.cluster import Cluster, build
from sim.scenario import Scenario, validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.models import load_catalogue

BASE: dict[str, Any] = {
    "name": "disagg-test",
    "profile": "h200-sxm-vllm",
    "mode": "coupled",
    "deployments": [{"model": "llama-3.1-8b"}],
    "cluster": {"servers": 1, "gpus_per_server": 8, "param_servers": 1, "server": {"nvme": 0}},
    "workload": {
        "kind": "poisson",
        "rate": 4.0,
        "requests": 40,
        "input_tokens": {"dist": "uniform", "low": 100, "high": 3000},
        "output_tokens": {"dist": "uniform", "low": 2, "high": 40},
    },
    "disaggregation": {
        "enabled": True,
        "prefill": {"replicas": 2, "tp": 1},
        "decode": {"replicas": 2, "tp": 2},
        "decode_routing": "least-loaded",
    },
}

#: Llama-3.1-8B in bf16: K and V x 32 layers x 8 KV heads x 128 head_dim x 2 bytes
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def scenario(**over: Any) -> Scenario:
    """``BASE`` with top-level sections updated one level deep (``disaggregation={...}``)."""
    data = copy.deepcopy(BASE)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return validate(data)


def run(sc: Scenario, seed: int = 0) -> Cluster:
    """Build and run ``sc``; returns the finished cluster."""
    cl = build(sc, seed, load_catalogue(sc.catalogue), load_profile(sc.profile), CostModel)
    cl.run()
    return cl
