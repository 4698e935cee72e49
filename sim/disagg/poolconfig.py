"""The ``disaggregation`` section of a scenario: prefill and decode pools, KV transfer,
routing for both hops and the KV store tier (see docs/disaggregation.md).

With ``enabled: true`` the pools replace the replicas :class:`sim.scenario.ClusterCfg` would
build: ``cluster.gpus_per_server`` still sizes a server, ``cluster.tp`` / ``cluster.pp`` /
``cluster.servers`` are not used (the pools say how many replicas of which ``tp``; the
servers are as many as the pools fill).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from engine.limits import CheckedModel, Interval
from engine.policy import policy_names
from engine.units import parse_duration, parse_rate, parse_size

_Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
_Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
_Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]

#: routing policy names, one registry for both hops (:data:`sim.disagg.routing.ROUTERS`)
ROUTING = Literal["least-loaded", "round-robin", "kv-aware"]


class _D(CheckedModel, BaseModel):  # BaseModel named too, for linters
    # each field's attribute docstring is its description in docs/scenario-reference.md
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


class PoolCfg(_D):
    """One pool of replicas (every replica alike): how many, their tensor-parallel degree and
    their GPU type."""

    replicas: int = Field(default=1, ge=1, le=4096)
    """Replicas in the pool, 1..4096."""
    tp: int = Field(default=1, ge=1, le=64)
    """Tensor-parallel degree of each replica; must divide `cluster.gpus_per_server`."""
    profile: str | None = None
    """Hardware profile (GPU type) of the pool's GPUs; null: the scenario's `profile`."""


class StoreCfg(_D):
    """A Mooncake-style KV store behind the replicas' HBM: prompt KV blocks (one per trace
    `hash_ids` entry) kept in host memory, then SSD, then a remote tier, each an
    `engine.cache.TierCache` whose victims move one tier down."""

    enabled: bool = False
    """Keep prompt KV blocks in the store; a request whose leading blocks are there skips
    prefilling their tokens."""
    block_tokens: int = Field(default=512, ge=1)
    """Tokens per prefix block (one `hash_ids` entry; the Mooncake traces use 512), >= 1."""
    host: _Size = "64GiB"  # type: ignore[assignment]
    """Host-memory tier of the store, bytes or a size; 0: none."""
    ssd: _Size = "1TiB"  # type: ignore[assignment]
    """SSD tier of the store, bytes or a size; 0: none."""
    remote: _Size = 0
    """Remote tier (another machine's store, over RDMA), bytes or a size; 0: none."""
    policy: str = "lru"
    """Eviction policy of every store tier (an `engine.policy` name, not `opt`)."""
    host_bandwidth: _Rate | None = None
    """Read bandwidth from the host tier into a prefill replica; null: profile PCIe x tp."""
    ssd_bandwidth: _Rate | None = None
    """Read bandwidth from the SSD tier; null: profile `nvme`."""
    remote_bandwidth: _Rate | None = None
    """Read bandwidth from the remote tier; null: profile RDMA x tp."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        """A registered eviction policy that needs no future knowledge (not `opt`)."""
        allowed = [n for n in policy_names() if n != "opt"]
        if name not in allowed:
            raise ValueError(f"unknown store policy {name!r}; allowed: {', '.join(allowed)}")
        return name


class DisaggCfg(_D):
    """Prefill/decode disaggregation: prompts run on the `prefill` pool, their KV moves to a
    replica of the `decode` pool over the simulated network, which then generates."""

    enabled: bool = False
    """Run disaggregated; false: every replica prefills and decodes (aggregated)."""
    prefill: PoolCfg = PoolCfg()
    """The prefill pool: prompts only (the first token is sampled there: TTFT)."""
    decode: PoolCfg = PoolCfg()
    """The decode pool: generation from the transferred KV (TPOT)."""
    placement: Literal["packed", "split"] = "packed"
    """`packed`: prefill and decode replicas alternate over the servers' GPUs (a server may
    hold both, so KV moves over NVLink); `split`: each pool on its own servers (KV over RDMA)."""
    overlap: bool = True
    """Send a prompt's KV layer by layer while its last prefill iteration computes: only the
    last layer's share goes after it; false: the whole KV after the prefill."""
    prefill_routing: ROUTING = "least-loaded"
    """Prefill hop: `least-loaded` (fewest queued + running), `round-robin`, or `kv-aware`
    (fewest prompt tokens still to compute, after store hits)."""
    decode_routing: ROUTING = "kv-aware"
    """Decode hop: `least-loaded`, `round-robin`, or `kv-aware` (the replica already holding
    most of the prompt's prefix blocks, then least loaded; held blocks are not re-sent)."""
    retry: Interval = 0.005
    """Wait before re-sending a KV transfer a dropped link failed, seconds or a duration
    (>= 1 us)."""
    store: StoreCfg = StoreCfg()
    """The KV store tier behind HBM."""
