"""Eviction policies: one registry, one contract (see :mod:`engine.policy.base`)."""

from engine.policy import lru  # noqa: F401  (registers "lru")
from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import make_policy, policy_class, policy_names, register

__all__ = ["EvictionPolicy", "Key", "make_policy", "policy_class", "policy_names", "register"]
