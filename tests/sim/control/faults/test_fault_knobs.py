"""Knobs of the random fault schedule added for issue 22, fault-time bounds, and how chaos
rows keep liveness findings apart from safety ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sim.control.faults import MAX_TIME, SHAPES, FaultSpec, RandomFaultsCfg, random_schedule
from sim.control.runcheckers import Finding, is_liveness
from sim.study.chaos import aggregate


def _partitions(cfg: RandomFaultsCfg, seed: int) -> list[FaultSpec]:
    sched = random_schedule(cfg, np.random.default_rng(seed), 2, 3, 5)
    return [f for f in sched if f.kind == "partition"]


@settings(max_examples=25, deadline=None)
@given(
    weights=st.dictionaries(
        st.sampled_from([*SHAPES, "replica"]), st.sampled_from([0.0, 1.0, 3.0])
    ),
    seed=st.integers(0, 10_000),
    bias=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_partition_shapes_follow_their_weights(weights: dict, seed: int, bias: float) -> None:
    if not sum(weights.values()) > 0:
        weights = {"bridge": 1.0}
    cfg = RandomFaultsCfg(
        enabled=True, kinds={"partition": 1.0}, rate=20, until=3.0, shapes=weights, leader_bias=bias
    )
    parts = _partitions(cfg, seed)
    assert parts
    drawn_host = {f.shape for f in parts if f.target != "raft-leader"}
    drawn_leader = {f.shape for f in parts if f.target == "raft-leader"}
    host_w = {s: w for s, w in weights.items() if s in SHAPES and w > 0}
    if host_w:  # host partitions use only host shapes with a positive weight
        assert drawn_host <= set(host_w)
    assert "replica" not in drawn_host
    assert drawn_leader <= {s for s, w in weights.items() if w > 0}
    if bias == 0.0:
        assert not drawn_leader
    if bias == 1.0:
        assert not drawn_host


def test_without_shape_weights_leader_partitions_cut_the_replica_alone() -> None:
    cfg = RandomFaultsCfg(enabled=True, kinds={"partition": 1.0}, rate=20, leader_bias=1.0)
    parts = _partitions(cfg, 3)
    assert parts and {(f.shape, f.target) for f in parts} == {("replica", "raft-leader")}


def test_buggify_knobs_map_onto_the_raft_perturbation() -> None:
    cfg = RandomFaultsCfg(hold=0.1, hold_max=0.9, duplicate=0.2, early_timer=0.3,
                          isolate_after_append=0.4, deafen_leader=0.5,
                          restart_mid_replication=0.6, duration=(0.1, 0.2))  # fmt: skip
    b = cfg.buggify()
    assert (b.hold, b.hold_max, b.duplicate, b.early_timer) == (0.1, 0.9, 0.2, 0.3)
    assert (b.mute_after_append, b.deafen_leader, b.restart_mid_replication) == (0.4, 0.5, 0.6)
    assert b.mute == (0.1, 0.2) and b.active
    off = RandomFaultsCfg(hold=0, duplicate=0, early_timer=0, isolate_after_append=0,
                          deafen_leader=0, restart_mid_replication=0)  # fmt: skip
    assert not off.buggify().active


@pytest.mark.parametrize(
    "spec",
    [
        {"at": 1e30, "kind": "heal"},
        {"at": MAX_TIME * 2, "kind": "heal"},
        {"at": 1, "kind": "kill", "target": "ps0", "duration": 1e308},
        {"at": "1e999", "kind": "heal"},
        {"at": True, "kind": "heal"},
    ],
)
def test_fault_times_are_bounded(spec: dict) -> None:
    with pytest.raises(ValidationError):
        FaultSpec.model_validate(spec)


def test_the_largest_fault_time_is_accepted() -> None:
    assert FaultSpec.model_validate({"at": MAX_TIME, "kind": "heal"}).at == MAX_TIME


def test_random_process_bounds_and_shape_names() -> None:
    with pytest.raises(ValidationError, match="until"):
        RandomFaultsCfg(until=MAX_TIME * 10)
    with pytest.raises(ValidationError, match="unknown partition shape"):
        RandomFaultsCfg(shapes={"donut": 1.0})


def test_liveness_findings_are_counted_apart() -> None:
    live = str(Finding(1.0, "Liveness (election timer)", "x"))
    safe = str(Finding(1.0, "Election Safety", "two leaders in one term (Liveness)"))
    assert is_liveness(live) and not is_liveness(safe)
    rows = [
        {"seed": 1, "ok": False, "violations": [safe], "liveness": [live, live],
         "availability": 1.0, "requests_lost": 0, "degraded": 0, "faults": 3},
        {"seed": 2, "ok": True, "violations": [], "liveness": [],
         "availability": 0.5, "requests_lost": 1, "degraded": 0, "faults": 1},
    ]  # fmt: skip
    agg = aggregate(rows)
    assert agg["violations"] == 1 and agg["liveness_violations"] == 2
    assert agg["failing_seeds"] == [1]


def test_every_fault_kind_has_exactly_one_handler() -> None:
    from sim.control.faultactions import FaultActions
    from sim.control.faults import KINDS

    handlers = FaultActions._handlers(
        object.__new__(FaultActions)
    )  # bound lookups only, no state read
    assert sorted(handlers) == sorted(KINDS)
