"""The decision rule's invariants (Hypothesis state machine over arbitrary policy asks)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sim.control.autoscale.controller import Controller
from sim.control.autoscale.section import AutoscaleCfg


class ControllerMachine(RuleBasedStateMachine):
    """Replicas start (starting -> serving) and drain (draining -> released) at arbitrary
    moments; the policy asks for anything. The size never leaves [min, max]."""

    @initialize(
        lo=st.integers(1, 5),
        span=st.integers(0, 6),
        up=st.integers(1, 4),
        down=st.integers(1, 3),
        cooldown=st.floats(0, 20),
        delay=st.floats(0, 30),
        start=st.integers(0, 11),
    )
    def setup(
        self, lo: int, span: int, up: int, down: int, cooldown: float, delay: float, start: int
    ) -> None:
        self.cfg = AutoscaleCfg(
            min_replicas=lo,
            max_replicas=lo + span,
            scale_up_step=up,
            scale_down_step=down,
            cooldown=cooldown,
            scale_in_delay=delay,
        )
        self.ctl = Controller(self.cfg)
        self.serving = min(max(start, lo), lo + span)
        self.starting = 0
        self.draining = 0
        self.now = 0.0
        self.last_up: float | None = None

    @rule(desired=st.integers(-5, 40), dt=st.floats(0, 15))
    def decide(self, desired: int, dt: float) -> None:
        self.now += dt
        current = self.serving + self.starting
        act = self.ctl.decide(self.now, desired, current, self.starting, self.draining)
        if act > 0:
            assert act <= self.cfg.scale_up_step
            assert self.last_up is None or self.now - self.last_up >= self.cfg.cooldown
            self.last_up = self.now
            self.starting += act
        elif act < 0:
            assert -act <= self.cfg.scale_down_step and self.starting == 0
            self.serving += act
            self.draining -= act

    @rule()
    def one_starts_serving(self) -> None:
        if self.starting:
            self.starting -= 1
            self.serving += 1

    @rule()
    def one_drained(self) -> None:
        if self.draining:
            self.draining -= 1

    @invariant()
    def within_bounds(self) -> None:
        current = self.serving + self.starting
        assert self.cfg.min_replicas <= current <= self.cfg.max_replicas
        assert current + self.draining <= self.cfg.max_replicas  # GPUs held, draining too


ControllerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestController = ControllerMachine.TestCase


def test_scale_in_waits_for_the_stabilisation_window() -> None:
    ctl = Controller(AutoscaleCfg(min_replicas=1, max_replicas=8, scale_in_delay=30.0))
    assert ctl.decide(0.0, 6, 6, 0) == 0
    # asked for 2 from t=10, but 6 was asked within the last 30 s: no scale-in until t=31
    assert ctl.decide(10.0, 2, 6, 0) == 0
    assert ctl.decide(29.0, 2, 6, 0) == 0
    assert ctl.decide(31.0, 2, 6, 0) == -1  # scale_down_step 1


def test_cooldown_spaces_scale_outs() -> None:
    ctl = Controller(AutoscaleCfg(max_replicas=10, scale_up_step=2, cooldown=10.0))
    assert ctl.decide(0.0, 9, 1, 0) == 2
    assert ctl.decide(5.0, 9, 3, 2) == 0
    assert ctl.decide(10.0, 9, 3, 0) == 2
