"""Each policy of the registry asks what its rule says, on hand-made observations."""

from __future__ import annotations

import math

import pytest

from sim.control.autoscale.policies import POLICIES, Observation
from sim.control.autoscale.section import AutoscaleCfg, ScheduleStep
from sim.runner import run_scenario
from tests.sim.control.autoscale.conftest import scenario


def obs(t: float = 0.0, **kw: float) -> Observation:
    base = dict(serving=2, starting=0, draining=0, queued=0, running=0, max_num_seqs=16,
                kv_use=0.0, arrival_rate=0.0, ttft_p90=None, tpot_mean=None)  # fmt: skip
    base.update(kw)
    return Observation(t=t, **base)  # type: ignore[arg-type]


def test_registry_names_every_policy() -> None:
    assert set(POLICIES) == {"target-utilisation", "slo", "scheduled", "predictive"}


def test_target_utilisation_is_hpa_rule_with_tolerance() -> None:
    p = POLICIES["target-utilisation"](AutoscaleCfg(target=0.5), None, 10.0)
    # 2 replicas x 16 slots, 24 in flight: utilisation 0.75, ratio 1.5 -> ceil(2 x 1.5) = 3
    assert p.desired(obs(queued=8, running=16)) == 3
    # within 10% of the target: keep the size
    assert p.desired(obs(running=17, starting=1)) == 3  # 17/32 = 0.53, ratio 1.06
    # KV use counts when it is the larger: 0.9 / 0.5 x 2 = 3.6 -> 4
    assert p.desired(obs(running=2, kv_use=0.9)) == 4


def test_slo_policy_steps_on_the_ttft_signal() -> None:
    cfg = AutoscaleCfg(scale_up_step=3, slo_high=0.8, slo_low=0.3, target=0.7)
    p = POLICIES["slo"](cfg, 2.0, 10.0)
    assert p.desired(obs(ttft_p90=1.7)) == 2 + 3  # above 0.8 x 2 s
    assert p.desired(obs(ttft_p90=1.0)) == 2
    assert p.desired(obs(ttft_p90=0.5, running=4)) == 1  # below 0.3 x 2 s, util 0.125
    assert p.desired(obs(ttft_p90=None)) == 2


def test_scheduled_policy_follows_the_latest_started_step() -> None:
    cfg = AutoscaleCfg(schedule=[ScheduleStep(at=10, replicas=4), ScheduleStep(at=30, replicas=2)])
    p = POLICIES["scheduled"](cfg, None, 10.0)
    assert [p.desired(obs(t)) for t in (5.0, 10.0, 29.0, 31.0)] == [2, 4, 4, 2]


def test_predictive_policy_extrapolates_the_rate_trend() -> None:
    cfg = AutoscaleCfg(replica_rate=5.0, lookback=60.0)
    p = POLICIES["predictive"](cfg, None, 20.0)
    # the rate grows 1 req/s per 2 s: read 20 s ahead it is 10 req/s above the last sample
    asks = [p.desired(obs(t=2.0 * i, arrival_rate=float(i))) for i in range(11)]
    assert asks[-1] == math.ceil((10 + 10) / 5.0)  # 4 replicas, not ceil(10 / 5) = 2
    flat = POLICIES["predictive"](cfg, None, 20.0)
    assert [flat.desired(obs(t=2.0 * i, arrival_rate=12.0)) for i in range(5)][-1] == 3


@pytest.mark.parametrize("step", [1, 2])
def test_scheduled_policy_in_a_run_scales_at_the_step(step: int) -> None:
    r = run_scenario(
        scenario(
            "autoscale.policy=scheduled",
            "autoscale.schedule=[{at: 10, replicas: 3}]",
            f"autoscale.scale_up_step={step}",
            "autoscale.cooldown=3",
            "workload.steps=[]",
        ),
        seed=1,
    )
    outs = [e for e in r.summary["autoscale"]["events"] if e["action"] == "out"]
    assert outs[0]["t"] == 10.0 and outs[0]["replicas"] == step
    assert sum(e["replicas"] for e in outs) == 2  # to 3 replicas, never beyond
