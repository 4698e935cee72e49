"""The validation suite: held-out workloads run on the real engine and in the simulator.

Each :class:`ValidationWorkload` fixes everything both sides need: the model (a LLaMA-7B-shaped
decoder scaled down so a 2-core CPU serves it in seconds -- the 17 MB ``decoder`` or the
67 MB ``decoder-large``, larger than a 32 MiB last-level cache -- or a dense no-KV network),
the request arrivals (Poisson, seeded; the first at t = 0) and lengths, the HBM weight-cache
size (as a fraction of the model's bytes: >= 1 keeps every weight resident, < 1 streams
layers from host memory every iteration), the HBM eviction policy, the prefetch window and
the batching limits.

The suite is held out from calibration (:mod:`hwbench.engine_probe`): ``pdsim calibrate``
fits the engine's terms on the small decoder only, with cache fractions 0.6, 0.9 and 1.5,
prompts of 16-512 tokens and its own seeds. :data:`SUITE` uses other seeds and lengths, the
large decoder (``large-resident``: its weights come from DRAM, not from the cache the
calibration model sat in) and cache fractions calibration never saw (0.45 and 0.8).

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
    model: Literal["decoder", "decoder-large", "dense"] = "decoder"
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
        "low-resident",
        "low load, all weights resident, LRU",
        requests=60,
        rate=3.0,
        input_low=48,
        input_high=160,
        output_low=8,
        output_high=24,
        seed=21,
    ),
    ValidationWorkload(
        "sat-resident",
        "near saturation, all weights resident, LRU",
        requests=100,
        rate=9.0,
        input_low=48,
        input_high=160,
        output_low=8,
        output_high=24,
        seed=22,
    ),
    ValidationWorkload(
        "stream-045",
        "low load, HBM holds 45% of the weights (a fraction calibration never saw), LRU",
        requests=50,
        rate=3.0,
        hbm_fraction=0.45,
        seed=23,
    ),
    ValidationWorkload(
        "stream-080-lruk",
        "moderate load, HBM holds 80% of the weights, LRU-K, 24-40-token outputs",
        requests=48,
        rate=3.0,
        input_low=96,
        input_high=224,
        output_low=24,
        output_high=40,
        hbm_fraction=0.8,
        policy="lru-k",
        seed=24,
    ),
    ValidationWorkload(
        "long-context",
        "long prompts (384-640 tokens), short outputs, all resident",
        requests=30,
        rate=1.5,
        input_low=384,
        input_high=640,
        output_low=4,
        output_high=8,
        seed=25,
    ),
    ValidationWorkload(
        "large-resident",
        "the 67 MB decoder (weights spill a 32 MiB last-level cache), all resident",
        model="decoder-large",
        requests=30,
        rate=1.5,
        input_low=32,
        input_high=128,
        output_low=8,
        output_high=16,
        seed=26,
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
