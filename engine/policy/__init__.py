"""Eviction policies: one registry, one contract (see :mod:`engine.policy.base`)."""

from engine.policy import (
    arc,  # noqa: F401  (registers "arc")
    color_lru,  # noqa: F401  (registers "color-lru")
    fifo,  # noqa: F401  (registers "fifo")
    lru,  # noqa: F401  (registers "lru")
    lruk,  # noqa: F401  (registers "lru-k")
    opt,  # noqa: F401  (registers "opt")
    pin,  # noqa: F401  (registers "pin")
    priority,  # noqa: F401  (registers "priority")
)
from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import make_policy, policy_class, policy_names, register

__all__ = ["EvictionPolicy", "Key", "make_policy", "policy_class", "policy_names", "register"]
