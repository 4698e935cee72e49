"""The real inference engine: models on real bytes, weights through the tiers, prefetch on a
background thread, continuous batching, per-request records in the simulator's schema."""

from engine.runtime.engine import Engine, EngineResult, EngineWorkload
from engine.runtime.model import DecoderConfig, DecoderModel, DenseConfig, DenseModel, unpack
from engine.runtime.prefetcher import Prefetcher
from engine.runtime.weights import TIER_NAMES, ResidentWeights, TieredWeights, WeightSource

__all__ = [
    "TIER_NAMES",
    "DecoderConfig",
    "DecoderModel",
    "DenseConfig",
    "DenseModel",
    "Engine",
    "EngineResult",
    "EngineWorkload",
    "Prefetcher",
    "ResidentWeights",
    "TieredWeights",
    "WeightSource",
    "unpack",
]
