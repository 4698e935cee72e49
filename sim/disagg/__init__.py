"""Prefill/decode disaggregation (issue 17): pools of prefill and decode replicas, KV moved
between them over the simulated network, routing for both hops, and a KV store tier behind
HBM. See docs/disaggregation.md.

``sim.scenario`` imports this package for its schema, so only modules that do not import the
scenario are re-exported here; the coordinator is ``sim.disagg.coordinator``."""

from sim.disagg.layout import Slot, place_pools
from sim.disagg.poolconfig import DisaggCfg, PoolCfg, StoreCfg
from sim.disagg.routing import ROUTERS
from sim.disagg.store import TIER_NAMES, KvStore

__all__ = [
    "ROUTERS",
    "TIER_NAMES",
    "DisaggCfg",
    "KvStore",
    "PoolCfg",
    "Slot",
    "StoreCfg",
    "place_pools",
]
