"""Code that behaves identically in simulation and for real: policies, caches, KV blocks."""

from engine.cache import CacheStats, TierCache
from engine.errors import InputError, ObjectTooLargeError
from engine.policy import EvictionPolicy, make_policy, policy_names

__all__ = [
    "CacheStats",
    "EvictionPolicy",
    "InputError",
    "ObjectTooLargeError",
    "TierCache",
    "make_policy",
    "policy_names",
]
