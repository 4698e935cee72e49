"""Shared helpers of the fault tests: the small chaos scenario and the shipped drills."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenario import Scenario, load_scenario

DATA = Path(__file__).resolve().parent / "data"
SCEN = Path(__file__).resolve().parents[4] / "scenarios"


def small(overrides: list[str] | None = None) -> Scenario:
    """The small random-fault cluster of the seed tests."""
    return load_scenario(DATA / "chaos-small.yaml", overrides or [])


#: the planted figure-8 bug is provoked by leader hunting under loss and write load
STRESS = [
    "faults.raft.lease_interval=0.02",
    "faults.random.hunt=0.9",
    "faults.raft.loss=0.05",
    "faults.raft.duplicate=0.02",
]


@pytest.fixture
def small_sc() -> Scenario:
    return small()
