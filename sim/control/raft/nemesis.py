"""Random fault runs of one Raft group: a seeded fault process, client load, checkers.

:func:`run_seed` builds a group, runs clients and a fault process for ``duration`` simulated
seconds, then heals everything, restarts every crashed replica, lets the group settle and
runs the final checks: online safety checkers (see :mod:`sim.control.raft.safety`), no acknowledged
write missing from the most up-to-date log (the one that would win the next election), and linearizability of the client history.

The fault process is designed to provoke the Raft paper's figure 8 situation often: crashes
favour the current leader (``leader_bias``), crashed replicas come back after a short random
downtime, and messages are lost/duplicated, so leaders frequently die with entries on a
minority and later leaders of other terms inherit them.

Seeds: ``SeedSequence(seed)`` spawns independent streams for the group, the faults and the
clients, so changing the fault knobs does not shift the client workload.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.control.raft.client import RaftClient
from sim.control.raft.group import RaftGroup
from sim.control.raft.groupconfig import RaftConfig
from sim.control.raft.linearizability import SearchBudgetExceeded, check_history
from sim.control.raft.safety import SafetyChecker, Violation
from sim.control.raft.transport import SimTransport


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """Knobs of one random-fault run (times in seconds)."""

    n: int = 3
    duration: float = 4.0
    settle: float = 1.5
    clients: int = 2
    keys: int = 3
    read_fraction: float = 0.3
    think: float = 0.01
    latency: tuple[float, float] = (0.001, 0.004)
    loss: float = 0.05
    duplicate: float = 0.02
    fault_interval: float = 0.6
    leader_bias: float = 0.7
    hunt: float = 0.9
    hunt_delay: float = 0.08
    downtime: tuple[float, float] = (0.05, 0.6)
    diskless: float = 0.0
    unsafe_commit_old_terms: bool = False
    linearizability: bool = True


@dataclass
class SeedResult:
    """Outcome of :func:`run_seed`."""

    seed: int
    violations: list[Violation] = field(default_factory=list)
    non_linearizable_keys: list[str] = field(default_factory=list)
    linearizability_checked: bool = False
    trace_hash: str = ""
    ops: int = 0
    acked: int = 0
    faults: int = 0
    leaders: int = 0
    messages: int = 0
    sim_time: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations and not self.non_linearizable_keys


def _client_loop(
    env: simpy.Environment, c: RaftClient, rng: np.random.Generator, cfg: ChaosConfig
) -> Generator[simpy.Event, Any, None]:
    while True:
        key = f"k{int(rng.integers(cfg.keys))}"
        if rng.random() < cfg.read_fraction:
            yield env.process(c.call("get", key))
        else:
            yield env.process(c.call("put", key, (c.id, len(c.history))))
        yield env.timeout(cfg.think * float(rng.random()))


def _faults(
    env: simpy.Environment,
    g: RaftGroup,
    tr: SimTransport,
    rng: np.random.Generator,
    cfg: ChaosConfig,
    counter: list[int],
) -> Generator[simpy.Event, Any, None]:
    n = cfg.n
    while True:
        yield env.timeout(float(rng.exponential(cfg.fault_interval)))
        if env.now >= cfg.duration:
            return
        counter[0] += 1
        kind = rng.random()
        lead = g.leader()
        biased = lead is not None and rng.random() < cfg.leader_bias
        target = lead if biased and lead is not None else int(rng.integers(n))
        if kind < 0.4:  # crash (usually the leader); it comes back after a short downtime
            if g.nodes[target].alive:
                _crash_and_restart(env, g, target, rng, cfg)
            continue
        # network faults replace the previous network state
        tr.heal()
        if kind < 0.55:
            tr.isolate(target)
        elif kind < 0.85:  # minority side (with the target) vs majority; clients reach both
            others = [i for i in range(n) if i != target]
            rng.shuffle(others)
            k = int(rng.integers(0, (n - 1) // 2 + 1))  # extra members of the minority
            tr.partition([[target, *others[:k]], others[k:]])
        elif kind < 0.92:
            other = int(rng.choice([i for i in range(n) if i != target]))
            tr.one_way_block(target, other) if rng.random() < 0.5 else tr.one_way_block(
                other, target
            )
        # else: healed


def hunt_leaders(
    env: simpy.Environment,
    g: RaftGroup,
    rng: np.random.Generator,
    until: float,
    hunt: float,
    hunt_delay: float,
    strike: Callable[[int], None],
) -> Generator[simpy.Event, Any, None]:
    """Figure 8 provocation (a SimPy process): every 10 ms look for a new leader (a new
    (leader, term) pair); with probability ``hunt``, after a random delay of at most
    ``hunt_delay``, call ``strike(leader)`` if it is still up and the time is before ``until``.
    ``rng`` draws, per new leader: the hunt coin, then the delay (``strike`` draws after)."""
    seen: tuple[int, int] | None = None
    while env.now < until:
        yield env.timeout(0.01)
        lead = g.leader()
        if lead is None or seen == (lead, g.nodes[lead].current_term):
            continue
        seen = (lead, g.nodes[lead].current_term)
        if rng.random() >= hunt:
            continue
        yield env.timeout(float(rng.uniform(0.0, hunt_delay)))
        if env.now >= until or not g.nodes[lead].alive:
            continue
        strike(lead)


def _leader_hunter(
    env: simpy.Environment,
    g: RaftGroup,
    tr: SimTransport,
    rng: np.random.Generator,
    cfg: ChaosConfig,
    counter: list[int],
) -> Generator[simpy.Event, Any, None]:
    """Cut a new leader off from the other replicas (clients still reach it, so it appends
    entries no one else has) or crash it (:func:`hunt_leaders`)."""

    def strike(lead: int) -> None:
        counter[0] += 1
        if rng.random() < 0.5:
            tr.heal()
            tr.partition([[lead], [i for i in range(cfg.n) if i != lead]])
        else:
            _crash_and_restart(env, g, lead, rng, cfg)

    return hunt_leaders(env, g, rng, cfg.duration, cfg.hunt, cfg.hunt_delay, strike)


def _crash_and_restart(
    env: simpy.Environment, g: RaftGroup, node: int, rng: np.random.Generator, cfg: ChaosConfig
) -> None:
    """Crash ``node`` and restart it after a random downtime, without its disk with
    probability ``cfg.diskless`` -- but only while no other replica is without its data
    (recovering, or down awaiting a diskless restart): with two or more such replicas a
    majority of a 3-group can lose a committed entry, which no protocol can prevent."""
    g.crash(node)
    lose = bool(cfg.diskless) and rng.random() < cfg.diskless
    if lose and not any(x.recovering or x.lose_disk_on_restart for x in g.nodes):
        g.nodes[node].lose_disk_on_restart = True
    down = float(rng.uniform(*cfg.downtime))
    env.process(_restart_later(env, g, node, down))


def _restart_later(
    env: simpy.Environment, g: RaftGroup, node: int, delay: float
) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(delay)
    x = g.nodes[node]
    if not x.alive:
        g.restart(node, with_disk=not x.lose_disk_on_restart)
        x.lose_disk_on_restart = False


def run_seed(seed: int, cfg: ChaosConfig | None = None) -> SeedResult:
    """Run one random-fault seed; see the module docstring."""
    cfg = cfg or ChaosConfig()
    root = np.random.SeedSequence(seed)
    s_group, s_net, s_faults, s_clients, s_hunt = root.spawn(5)
    env = simpy.Environment()
    tr = SimTransport(
        env,
        np.random.default_rng(s_net),
        latency=cfg.latency,
        loss=cfg.loss,
        duplicate=cfg.duplicate,
    )
    checker = SafetyChecker()
    rc = RaftConfig(n=cfg.n, unsafe_commit_old_terms=cfg.unsafe_commit_old_terms)
    g = RaftGroup(env, rc, np.random.default_rng(s_group), transport=tr, checker=checker)
    g.start()
    crng = np.random.default_rng(s_clients).spawn(cfg.clients)
    for i in range(cfg.clients):
        c = g.client(timeout=0.3, give_up=2.0)
        env.process(_client_loop(env, c, crng[i], cfg))
    counter = [0]
    env.process(_faults(env, g, tr, np.random.default_rng(s_faults), cfg, counter))
    env.process(_leader_hunter(env, g, tr, np.random.default_rng(s_hunt), cfg, counter))
    env.run(until=cfg.duration)
    # heal (the fault process has stopped): restore every link and replica, let it catch up
    tr.heal()
    tr.set_link(loss=0.0, duplicate=0.0)
    for node in g.nodes:
        if not node.alive:
            node.restart(with_disk=not node.lose_disk_on_restart)
            node.lose_disk_on_restart = False
    env.run(until=cfg.duration + cfg.settle)
    # the most up-to-date log would win the next election: every ack must be in it
    best = max(g.nodes, key=lambda x: (x.log.last_term, x.log.last_index, -x.id))
    checker.check_acked_present(env.now, best.id, [e.command for e in best.log.entries()])
    res = SeedResult(seed=seed, violations=list(checker.violations))
    history = [h for c in g.clients for h in c.history]
    if cfg.linearizability:
        try:
            res.non_linearizable_keys = check_history(history)
            res.linearizability_checked = True
        except SearchBudgetExceeded:  # inconclusive: reported via linearizability_checked
            res.non_linearizable_keys = []
    res.trace_hash = g.trace_hash()
    res.ops = len(history)
    res.acked = len(checker.acked)
    res.faults = counter[0]
    res.leaders = len(checker.leaders)
    res.messages = tr.sent
    res.sim_time = env.now
    return res
