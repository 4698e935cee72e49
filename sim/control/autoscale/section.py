"""The scenario's ``autoscale:`` section (strict pydantic, documented field by field).

Checks that need the rest of the scenario (the load path against ``mode``, the initial size
within ``[min_replicas, max_replicas]``, an SLO for the ``slo`` policy) are in
:func:`check_autoscale`, called when the cluster is built (an :class:`engine.errors.InputError`
naming the field and the allowed values)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from engine.config import StrictModel
from engine.errors import InputError
from engine.limits import Interval
from engine.units import parse_duration

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]

#: the policy names (one registry: sim.control.autoscale.policies.POLICIES)
POLICY_NAMES = ("target-utilisation", "slo", "scheduled", "predictive")
SOURCE_NAMES = ("auto", "object", "nvme", "host", "param-servers", "peers")


class _A(StrictModel, BaseModel):  # BaseModel named too, so linters see a pydantic model
    """The base of the autoscale section's models."""


class ScheduleStep(_A):
    """One step of the `scheduled` policy: from `at` on, ask for `replicas`."""

    at: Duration
    """Simulated time the step starts, seconds or a duration."""
    replicas: int = Field(ge=1, le=4096)
    """Replicas asked for from `at` on (clamped to `[min_replicas, max_replicas]`)."""


class ColdStartCfg(_A):
    """How a new replica gets its weights (sim/serving/coldstart.py)."""

    load_from: Literal["auto", "object", "nvme", "host", "param-servers", "peers"] = "auto"
    """Load path. Coupled mode: `object` (object store -> PCIe), `nvme` (local NVMe -> PCIe),
    `host` (host memory -> PCIe); the whole checkpoint before serving. `pd` mode:
    `param-servers` (parameter servers -> NICs), `peers` (multicast from serving replicas
    over the GPU network); layer-streamed while serving. `auto`: `object` when coupled,
    `param-servers` when pd."""
    provision: Duration | None = None
    """Provisioning delay (server or container start), seconds; null: the profile's
    `coldstart.provision_s`."""
    warmup: Duration | None = None
    """Engine warm-up (graph capture), seconds; null: the profile's `coldstart.warmup_s`."""


class AutoscaleCfg(_A):
    """Autoscaling (R22): a control loop that adds and drains replicas of an aggregated
    cluster while it runs (sim/control/autoscale/; docs/design/autoscaling.md). The cluster
    starts with `cluster.servers`' replicas."""

    enabled: bool = False
    """Run the autoscaler."""
    policy: Literal["target-utilisation", "slo", "scheduled", "predictive"] = "target-utilisation"
    """`target-utilisation` (HPA/KEDA-like: requests in flight over `target` x
    `max_num_seqs` per replica), `slo` (recent P90 TTFT against the tightest class
    `ttft_slo`), `scheduled` (`schedule` steps), `predictive` (the arrival rate's linear
    trend over `lookback`, `horizon` ahead, over `replica_rate`)."""
    interval: Interval = 5.0
    """Seconds between two decisions (the loop reads the signals then)."""
    min_replicas: int = Field(default=1, ge=1, le=4096)
    """Fewest replicas (serving or starting); never fewer."""
    max_replicas: int = Field(default=8, ge=1, le=4096)
    """Most replicas (serving, starting or draining); never more."""
    scale_up_step: int = Field(default=2, ge=1, le=4096)
    """Most replicas one decision adds."""
    scale_down_step: int = Field(default=1, ge=1, le=4096)
    """Most replicas one decision drains."""
    cooldown: Duration = 10.0
    """No scale-out within this many seconds of the previous one."""
    scale_in_delay: Duration = 60.0
    """Scale in only to the largest size asked for over this many seconds (HPA's
    stabilisation window), and not within this long of a scale-out."""
    target: float = Field(default=0.7, gt=0, le=1)
    """`target-utilisation`: the share of a replica's batch (`max_num_seqs`) or KV to keep
    in use."""
    slo_high: float = Field(default=0.8, gt=0)
    """`slo`: scale out when recent P90 TTFT > `slo_high` x the TTFT objective."""
    slo_low: float = Field(default=0.3, ge=0)
    """`slo`: scale in when recent P90 TTFT < `slo_low` x the objective and utilisation is
    below `target` / 2."""
    signal_window: Interval = 10.0
    """Seconds of recent requests the TTFT and TPOT signals read."""
    schedule: list[ScheduleStep] = []
    """`scheduled`: the steps (at least one)."""
    replica_rate: float | None = Field(default=None, gt=0)
    """`predictive`: requests/s one replica serves within its SLO (required)."""
    lookback: Interval = 60.0
    """`predictive`: seconds of arrival-rate history the trend is fitted over."""
    horizon: Duration | None = None
    """`predictive`: seconds ahead the rate is predicted; null: provisioning + warm-up +
    10 s."""
    gpu_hour_cost: float = Field(default=2.0, ge=0)
    """Price of one GPU-hour (any currency) for the cost figure."""
    cold_start: ColdStartCfg = ColdStartCfg()
    """A new replica's load path and start-up terms."""

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleCfg:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})"
            )
        if self.enabled and self.policy == "scheduled" and not self.schedule:
            raise ValueError("policy scheduled: give at least one schedule step")
        if self.enabled and self.policy == "predictive" and self.replica_rate is None:
            raise ValueError("policy predictive: replica_rate is required (requests/s)")
        return self


def resolved_source(cfg: AutoscaleCfg, mode: str) -> str:
    """The cold start's load path: the configured one, or ``auto``'s choice for ``mode``."""
    src = cfg.cold_start.load_from
    if src == "auto":
        return "object" if mode == "coupled" else "param-servers"
    return src


def check_autoscale(sc: Any) -> None:
    """Reject an autoscale section the scenario cannot run (``InputError`` naming the field
    and the allowed values); nothing when autoscaling is off."""
    a: AutoscaleCfg = sc.autoscale
    if not a.enabled:
        return
    if sc.disaggregation.enabled:
        raise InputError(
            "autoscale with disaggregation.enabled is not supported; allowed: aggregated "
            "clusters (disaggregation.enabled: false)",
            source=sc.source,
            where="autoscale.enabled",
        )
    src = resolved_source(a, sc.mode)
    allowed = ("object", "nvme", "host") if sc.mode == "coupled" else ("param-servers", "peers")
    if src not in allowed:
        raise InputError(
            f"{src!r} is not a load path of mode {sc.mode}; allowed: auto, {', '.join(allowed)}",
            source=sc.source,
            where="autoscale.cold_start.load_from",
        )
    n = sc.cluster.replicas
    if not a.min_replicas <= n <= a.max_replicas:
        raise InputError(
            f"the cluster starts with {n} replicas (cluster.servers), outside "
            f"[min_replicas, max_replicas] = [{a.min_replicas}, {a.max_replicas}]",
            source=sc.source,
            where="autoscale.min_replicas",
        )
    if a.policy == "slo" and not any(c.ttft_slo for c in sc.workload.classes):
        raise InputError(
            "policy slo needs a ttft_slo on some workload class; allowed: set "
            "workload.classes[*].ttft_slo, or another policy",
            source=sc.source,
            where="autoscale.policy",
        )
