"""The validation suite: small workloads run on the real engine and in the simulator.

Each :class:`ValidationWorkload` fixes everything both sides need: the model (a LLaMA-7B-shaped
decoder or a dense no-KV network, scaled down so a 2-core CPU serves it in seconds), the
request arrivals (Poisson, seeded; the first at t = 0) and lengths, the HBM weight-cache size
(as a fraction of the model's bytes: >= 1 keeps every weight resident, < 1 streams layers from
host memory every iteration), the HBM eviction policy, the prefetch window and the batching
limits. The suite differs in load (low, near saturation), cache pressure (all resident,
streaming), policy (lru, lru-k) and context length. Each serves 40-120 requests (10-30 s on a
2-core CPU), so a P99 rests on more than the one or two slowest requests.

Everything starts warm: weights are written to the object store and read once through the
tiers before the first request (the simulator's ``warmup.node_hbm``), so the run measures the
steady state, not the object-store download.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine.errors import InputError

__all__ = ["SUITE", "ValidationWorkload", "arrivals", "get_workload"]


@dataclass(frozen=True)
class ValidationWorkload:
    """One validation workload; see the module docstring."""

    name: str
    description: str
    model: Literal["decoder", "dense"] = "decoder"
    requests: int = 40
    rate: float = 4.0  # requests per second (Poisson)
    input_low: int = 64
    input_high: int = 128
    output_low: int = 16
    output_high: int = 16
    hbm_fraction: float = 1.5  # HBM weight cache / model bytes
    policy: str = "lru"
    policy_params: tuple[tuple[str, float], ...] = ()
    window: int = 2  # prefetch window in layers (0: off)
    max_batch: int = 16
    max_batch_tokens: int = 1024
    seed: int = 1


def arrivals(w: ValidationWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival s, input tokens, output tokens) of ``w``; arrivals start at 0, seeded."""
    rng = np.random.default_rng(w.seed)
    gaps = rng.exponential(1.0 / w.rate, size=w.requests)
    t = np.cumsum(gaps)
    t -= t[0]
    inp = rng.integers(w.input_low, w.input_high + 1, size=w.requests)
    out = rng.integers(w.output_low, w.output_high + 1, size=w.requests)
    return t, inp.astype(np.int64), out.astype(np.int64)


SUITE: tuple[ValidationWorkload, ...] = (
    ValidationWorkload(
        "low-resident-lru",
        "low load, all weights resident, LRU",
        requests=80,
        rate=3.0,
    ),
    ValidationWorkload(
        "sat-resident-lru",
        "near saturation, all weights resident, LRU",
        requests=120,
        rate=9.0,
        seed=2,
    ),
    ValidationWorkload(
        "low-stream-lru",
        "low load, HBM holds 60% of the weights (layers stream from host), LRU",
        requests=60,
        rate=3.0,
        hbm_fraction=0.6,
        seed=3,
    ),
    ValidationWorkload(
        "sat-stream-lru",
        "near saturation, streaming, LRU",
        requests=100,
        rate=7.0,
        hbm_fraction=0.6,
        seed=4,
    ),
    ValidationWorkload(
        "long-context-lruk",
        "long prompts (384-512 tokens), short outputs, all resident, LRU-K",
        requests=40,
        rate=2.0,
        input_low=384,
        input_high=512,
        output_low=4,
        output_high=8,
        policy="lru-k",
        seed=5,
    ),
    ValidationWorkload(
        "mid-stream-lruk-longout",
        "moderate load, streaming, LRU-K, 192-256-token prompts and 24-32-token outputs",
        requests=48,
        rate=2.0,
        input_low=192,
        input_high=256,
        output_low=24,
        output_high=32,
        hbm_fraction=0.6,
        policy="lru-k",
        seed=6,
    ),
)


def get_workload(name: str) -> ValidationWorkload:
    """The suite workload called ``name``; :class:`InputError` listing the names otherwise."""
    for w in SUITE:
        if w.name == name:
            return w
    raise InputError(
        f"unknown workload {name!r}; allowed: {', '.join(w.name for w in SUITE)}",
        where="--workload",
    )
