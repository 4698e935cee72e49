"""Real storage tiers of the engine (object store, SSD, host, device) and the tier stack."""

from engine.tiers.base import Tier, TierKind, TierMiss, as_host_bytes, check_name
from engine.tiers.device import DeviceTier
from engine.tiers.host import HostTier
from engine.tiers.objectstore import ObjectStoreTier
from engine.tiers.ssd import SsdTier
from engine.tiers.stack import (
    Level,
    ObjectCorrupt,
    ObjectMissing,
    ReadResult,
    TierStack,
    default_name,
    level_caches,
    make_stack,
)

__all__ = [
    "DeviceTier",
    "HostTier",
    "Level",
    "ObjectCorrupt",
    "ObjectMissing",
    "ObjectStoreTier",
    "ReadResult",
    "SsdTier",
    "Tier",
    "TierKind",
    "TierMiss",
    "TierStack",
    "as_host_bytes",
    "check_name",
    "default_name",
    "level_caches",
    "make_stack",
]
