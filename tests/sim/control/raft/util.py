"""Helpers shared by the Raft tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from sim.control.raft import Command, Entry, RaftConfig, RaftGroup, SimTransport


def make_group(
    n: int = 3,
    seed: int = 0,
    loss: float = 0.0,
    duplicate: float = 0.0,
    keep_trace: bool = False,
    **cfg: Any,
) -> tuple[simpy.Environment, RaftGroup, SimTransport]:
    """A group on a fresh environment with its own SimTransport."""
    env = simpy.Environment()
    rng = np.random.default_rng(seed)
    tr = SimTransport(env, np.random.default_rng(seed + 10_000), loss=loss, duplicate=duplicate)
    g = RaftGroup(env, RaftConfig(n=n, **cfg), rng, transport=tr, keep_trace=keep_trace)
    return env, g, tr


def entries(terms: Sequence[int], tag: str = "x") -> list[Entry]:
    """Log entries with the given terms; commands identify (tag, index, term)."""
    return [Entry(t, Command("put", f"{tag}{i}", t, 999, i)) for i, t in enumerate(terms, 1)]


def wait_leader(env: simpy.Environment, g: RaftGroup, limit: float = 5.0) -> int:
    """Run until some live leader exists; return its id."""
    end = env.now + limit
    while env.now < end:
        env.run(until=env.now + 0.01)
        lead = g.leader()
        if lead is not None:
            return lead
    raise AssertionError(f"no leader by t={env.now}")
