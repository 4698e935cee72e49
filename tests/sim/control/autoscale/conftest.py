"""A small autoscaling cluster: one A100 replica of llama-2-7b, a step burst."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sim.cluster import Cluster, build
from sim.scenario import Scenario, apply_overrides, validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.models import load_catalogue

BASE: dict[str, Any] = {
    "name": "autoscale-small",
    "profile": "a100-80gb",
    "mode": "coupled",
    "deployments": [{"model": "llama-2-7b"}],
    "cluster": {
        "servers": 1,
        "param_servers": 1,
        "server": {"host": "64GiB"},
        "replica": {"max_num_seqs": 16},
    },
    "chunks": {"size": "16MiB"},
    "workload": {
        "kind": "step",
        "duration": "60s",
        "rate": 1,
        "steps": [{"at": "20s", "rate": 40}, {"at": "40s", "rate": 1}],
        "input_tokens": {"dist": "fixed", "mean": 256},
        "output_tokens": {"dist": "fixed", "mean": 64},
        "classes": [{"name": "normal", "slo": "10s", "ttft_slo": "2s"}],
    },
    "autoscale": {
        "enabled": True,
        "interval": "2s",
        "max_replicas": 5,
        "cooldown": "5s",
        "scale_in_delay": "6s",
    },
}


def scenario(*sets: str) -> Scenario:
    """The base scenario with ``key=value`` overrides."""
    data = apply_overrides(copy.deepcopy(BASE), list(sets), "<test>")
    return validate(data)


def built(sc: Scenario, seed: int = 1) -> tuple[Cluster, Any]:
    """The cluster of ``sc`` and its profile (nothing started)."""
    prof = load_profile(sc.profile)
    return build(sc, seed, load_catalogue(sc.catalogue), prof, CostModel), prof


@pytest.fixture
def make() -> Any:
    return scenario
