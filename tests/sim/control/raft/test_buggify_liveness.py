"""BUGGIFY perturbation, the liveness checker and the new safety invariants of sim.control.raft."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from sim.control.raft import RaftLog, SafetyChecker
from sim.control.raft.buggify import Buggify, BuggifyConfig
from sim.control.raft.liveness import LivenessChecker
from sim.control.raft.node import Role

from .util import entries, make_group, wait_leader


def _findings() -> tuple[list[tuple[str, str]], object]:
    out: list[tuple[str, str]] = []
    return out, lambda prop, detail: out.append((prop, detail))


# -- Buggify -----------------------------------------------------------------------------------
def test_all_zero_knobs_draw_nothing_and_send_once() -> None:
    rng = np.random.default_rng(1)
    b = Buggify(BuggifyConfig(), rng)
    state = rng.bit_generator.state
    assert not b.cfg.active
    assert all(b.send_delays(0, 1, 0.0) == [0.0] for _ in range(50))
    assert b.election_timeout(0.15, 0.3) is None
    assert rng.bit_generator.state == state


@settings(max_examples=30, deadline=None)
@given(hold=st.floats(0.0, 1.0), dup=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1))
def test_send_delays_match_the_knobs(hold: float, dup: float, seed: int) -> None:
    b = Buggify(BuggifyConfig(hold=hold, duplicate=dup, hold_max=0.5), np.random.default_rng(seed))
    n = 400
    plans = [b.send_delays(0, 1, 0.0) for _ in range(n)]
    assert all(1 <= len(p) <= 2 and all(0.0 <= d <= 0.5 for d in p) for p in plans)
    assert b.held >= sum(p[0] > 0 for p in plans)
    assert b.duplicated == sum(len(p) == 2 for p in plans)
    # binomial bounds (6 sigma): the rates follow the knobs
    for rate, count in ((hold, b.held), (dup, b.duplicated)):
        sd = (n * rate * (1 - rate)) ** 0.5
        assert abs(count - n * rate) <= 6 * sd + 1
    # client messages are never touched
    assert b.send_delays(0, 1000, 0.0) == [0.0]


def test_early_timer_draws_below_lo() -> None:
    b = Buggify(BuggifyConfig(early_timer=1.0), np.random.default_rng(3))
    draws = [b.election_timeout(0.15, 0.3) for _ in range(200)]
    assert all(d is not None and 0.0 <= d < 0.15 for d in draws)


def test_bad_knobs_are_input_errors() -> None:
    with pytest.raises(InputError, match=r"buggify\.hold"):
        BuggifyConfig(hold=1.5).validate()
    with pytest.raises(InputError, match=r"buggify\.mute"):
        BuggifyConfig(mute=(0.5, 0.1)).validate()


def test_muted_leader_sends_nothing_to_replicas_but_still_hears_them() -> None:
    env, g, _ = make_group(3, seed=4)
    b = Buggify(BuggifyConfig(mute_after_append=1.0, mute=(10.0, 10.0)), np.random.default_rng(0))
    for x in g.nodes:
        x.buggify = b
    g.start()
    lead = wait_leader(env, g)
    c = g.client(timeout=0.2, give_up=0.5)
    env.process(c.call("put", "k", 1))
    env.run(until=env.now + 0.05)
    assert b.muted == 1
    assert b.send_delays(lead, (lead + 1) % 3, env.now) == []
    assert not b.deaf(lead, (lead + 1) % 3, env.now)
    # its entry stays on it alone: no follower stores the put
    others = [x for x in g.nodes if x.id != lead]
    assert all(all(e.command.key != "k" for e in x.log.entries()) for x in others)


# -- liveness ------------------------------------------------------------------------------------
def test_a_healthy_group_has_no_liveness_findings_and_passes_the_probe() -> None:
    env, g, _ = make_group(5, seed=2)
    found, report = _findings()
    live = LivenessChecker(env, g, report, bound=1.0)
    g.start()
    live.start()
    env.run(until=1.0)
    live.healed(g.client(timeout=0.1, give_up=1.0))
    env.run(until=2.0)
    live.final()
    assert found == []
    assert live.leader_at is not None and live.commit_at is not None
    assert live.caught_up_at is not None and live.caught_up_at - live.heal_at <= 1.0


def test_a_leader_that_ignores_a_higher_term_is_flagged() -> None:
    env, g, _ = make_group(3, seed=5)
    found, report = _findings()
    live = LivenessChecker(env, g, report)
    g.start()
    live.start()
    lead = wait_leader(env, g)
    x = g.nodes[lead]
    x.seen_term, x.seen_term_at = x.current_term + 3, env.now  # delivered, never handled
    env.run(until=env.now + 0.2)
    assert [p for p, _ in found] == ["Liveness (term adoption)"]


def test_an_election_timer_held_back_is_flagged() -> None:
    env, g, _ = make_group(3, seed=6)
    found, report = _findings()
    live = LivenessChecker(env, g, report)
    g.start([0])  # one replica alone: it must keep standing for election
    live.start()
    x = g.nodes[0]
    real = x._reset_election_deadline

    def never_fires() -> None:
        real()
        x._deadline += 10.0

    x._reset_election_deadline = never_fires  # type: ignore[method-assign]
    env.run(until=1.5)
    assert [p for p, _ in found] == ["Liveness (election timer)"]


def test_a_cluster_that_never_elects_fails_the_after_heal_rule() -> None:
    env, g, _ = make_group(3, seed=7)
    found, report = _findings()
    live = LivenessChecker(env, g, report, bound=0.5)
    g.start([0])  # no quorum: no leader can be elected
    live.start()
    env.run(until=0.5)
    live.healed(g.client(timeout=0.1, give_up=0.5))
    env.run(until=1.1)
    live.final()
    assert ("Liveness (after heal)", "no leader within 0.5s of the heal at 0.500000s") in found


# -- safety invariants -------------------------------------------------------------------------
def test_commit_rule_flags_an_earlier_term_commit_by_a_leader() -> None:
    c = SafetyChecker()
    log = RaftLog(entries([1, 1, 2]))
    c.on_commit(0.0, 0, log, 0, 2, leader_term=2)
    assert [v.prop for v in c.violations] == ["Commit Rule"]
    ok = SafetyChecker()
    ok.on_commit(0.0, 0, log, 0, 3, leader_term=2)
    ok.on_commit(0.0, 1, log, 0, 2)  # a follower learning the commit index is fine
    assert ok.violations == []


def test_a_leader_needs_a_majority_of_grants_in_its_term() -> None:
    c = SafetyChecker()
    c.on_grant(1, 0, 5)
    c.on_leader(0.0, 0, 5, RaftLog(), members=5)
    assert [v.prop for v in c.violations] == ["Election Safety"]
    c2 = SafetyChecker()
    for voter in (1, 2):
        c2.on_grant(voter, 0, 5)
    c2.on_grant(3, 0, 4)  # an earlier term's grant does not count
    c2.on_leader(0.0, 0, 5, RaftLog(), members=5)
    assert c2.violations == []


def test_match_index_raised_by_a_stale_reply_is_flagged() -> None:
    c = SafetyChecker()
    c.on_match_raise(0.0, 0, 4, 1, 7, reply_term=4)
    assert c.violations == []
    c.on_match_raise(0.0, 0, 4, 1, 9, reply_term=3)
    assert [v.prop for v in c.violations] == ["Leader Match Index"]


def test_sampled_match_index_must_hold_on_the_follower() -> None:
    env, g, _ = make_group(3, seed=8)
    found, report = _findings()
    live = LivenessChecker(env, g, report)
    g.start()
    lead = wait_leader(env, g)
    env.run(until=env.now + 0.2)
    live.check_now()
    assert found == []
    x = g.nodes[lead]
    p = next(iter(x.match_index))
    x.match_index[p] = x.log.last_index + 5  # more than anyone holds
    assert x.role is Role.LEADER
    live.check_now()
    assert [q for q, _ in found] == ["Leader Match Index"]
