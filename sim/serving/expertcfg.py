"""The ``experts:`` section of a scenario: routed experts as parameter chunks.

With ``mode: pd`` and a mixture-of-experts model, ``experts.enabled`` makes each routed
expert of each expert layer one chunk of the tier chain (HBM expert cache, host memory, NVMe,
parameter servers); which experts an iteration needs comes from a seeded Zipf popularity or
a routing trace (docs/design/expert-offload.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from engine.config import StrictModel


class ExpertsCfg(StrictModel, BaseModel):  # BaseModel named too, so linters see a pydantic model
    """Routed experts as parameter chunks (docs/design/expert-offload.md)."""

    enabled: bool = False
    """Each routed expert of each expert layer is one chunk streamed through the tier chain,
    fetched only when an iteration's tokens route to it; needs `mode: pd`, no
    disaggregation, and a deployed model with experts."""
    hbm_budget: float | None = Field(default=None, gt=0, le=1)
    """Share of the model's routed experts the HBM weight cache holds next to its dense
    weights, in (0, 1] (rounded down to whole experts); null: the cache
    `cluster.gpu.weight_cache_fraction` gives."""
    routing: Literal["zipf", "trace"] = "zipf"
    """Where the experts an iteration activates come from: `zipf` (each token draws `top_k`
    distinct experts by a Zipf popularity, seeded) or `trace` (the CSV `trace`)."""
    zipf: float = Field(default=1.0, ge=0, le=4)
    """Zipf exponent of expert popularity inside a layer (0: uniform), 0..4; each layer ranks
    its experts in its own seeded order."""
    trace: str | None = None
    """Routing trace (`routing: trace`): a CSV with header `step,layer,expert,tokens`, path
    relative to the scenario file; `layer` is the block number, steps repeat cyclically."""
    prefetch: bool = False
    """While a layer computes, fetch the next expert layer's likely experts (by the replica's
    own routing counts, `prefetch_share`) that are neither resident nor in flight."""
    prefetch_share: float = Field(default=0.5, gt=0, le=1)
    """An expert is likely when it was active in at least this share of the replica's
    iterations so far, in (0, 1]."""

    @model_validator(mode="after")
    def _trace_given(self) -> ExpertsCfg:
        if self.routing == "trace" and not self.trace:
            raise ValueError("routing: trace needs `trace`, a CSV path")
        if self.routing == "zipf" and self.trace:
            raise ValueError("`trace` is used only with routing: trace")
        return self
