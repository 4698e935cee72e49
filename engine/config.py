"""The knobs of the tier, recency and prefetch code: one config object for both sides.

The simulator's scenario has these as its ``cache`` and ``prefetch`` sections
(:class:`sim.scenario.Scenario`); the engine's runtime takes the same objects
(:func:`engine.tiers.make_stack`, :class:`engine.runtime.Engine`), so a knob such as the heat
map's half-life or the HBM watermarks cannot mean one thing in simulation and another for
real. The recency rule's history length is one constant,
:data:`engine.tiers.chain.TOUCH_HISTORY`, used by both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from engine.limits import CheckedModel
from engine.policy import policy_names
from engine.units import parse_duration

__all__ = ["CacheCfg", "Duration", "PrefetchCfg", "StrictModel"]

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


class StrictModel(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A config section: unknown keys are errors, numbers are checked
    (:class:`engine.limits.CheckedModel`), and each field's one-line attribute docstring is
    its description (``sim.docgen`` prints it)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


class CacheCfg(StrictModel):
    """Eviction policies of the node tiers (R3, R13, R24) and HBM watermarks (R30)."""

    hbm_policy: str = "lru"
    """Eviction policy of the HBM weight cache: a policy listed below but `opt` (`pin`: PD mode)."""
    host_policy: str = "lru"
    """Eviction policy of the pinned host memory tier; an eviction policy name."""
    nvme_policy: str = "lru"
    """Eviction policy of the node NVMe tier; an eviction policy name."""
    params: dict[str, Any] = {}
    """Keyword parameters of the HBM policy, e.g. `{k: 2}` for `lru-k`; unknown ones are errors."""
    high_watermark: float = Field(default=1.0, gt=0, le=1)
    """HBM cache evicts when use exceeds this share of capacity (R30: 0.8); 1.0: only when full."""
    low_watermark: float = Field(default=1.0, gt=0, le=1)
    """Eviction after crossing the high watermark stops at this share (capped at the high one)."""

    @field_validator("hbm_policy", "host_policy", "nvme_policy")
    @classmethod
    def _online_policy(cls, name: str) -> str:
        """A registered policy that needs no knowledge of the future (not `opt`)."""
        allowed = ", ".join(n for n in policy_names() if n != "opt")
        if name == "opt":
            raise ValueError(
                "'opt' (Belady's MIN) needs the future reference string, which a running "
                "cluster does not know (replay a trace with `pdsim cache replay` to compare "
                f"against it); allowed here: {allowed}"
            )
        if name not in policy_names():
            raise ValueError(f"unknown eviction policy {name!r}; allowed: {allowed}")
        return name


class PrefetchCfg(StrictModel):
    """Asynchronous weight prefetch guided by an access heat map (R7, R30)."""

    enabled: bool = True
    """Prefetch the weights of the next batches while the current one computes."""
    window_batches: int = Field(default=3, ge=1, le=16)
    """How many batches ahead to prefetch (R30 suggests 3-5), 1..16."""
    heat_half_life: Duration = 10.0
    """Half-life of the access heat map, seconds or a duration."""
    order: Literal["before-demand", "after-pin"] = "before-demand"
    """When a layer's prefetch is planned: `before-demand` (before its own missing chunks are
    fetched) or `after-pin` (the real engine's order: fetch and pin the layer, then plan, and
    keep it pinned until that prefetch lands)."""
