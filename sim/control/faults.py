"""Fault schedules: the scenario's ``faults:`` section and the seeded random fault process.

A fault is one :class:`FaultSpec` (``at`` seconds, ``kind``, a ``target`` and kind-specific
knobs). Kinds:

* ``kill`` / ``restart`` -- a parameter server (``ps<i>``), a compute node (``node<i>``) or a
  Raft replica (``raft<i>``, or ``raft-leader`` for whoever leads at that moment); ``disk:
  false`` restarts without persistent state (a PS loses its DRAM and SSD copies and is
  re-replicated; a Raft replica rejoins empty, in recovering mode). With ``duration`` a kill
  is followed by a restart that much later.
* ``partition`` -- ``shape``: ``isolate`` (the target host vs every other), ``halves``,
  ``majority-minority`` (a minority of the Raft hosts, including the target if given),
  ``majorities-ring`` (host ``i`` reaches only ``i-1`` and ``i+1``: every host sees a majority,
  no two the same one), ``bridge`` (two halves, one host in the middle sees both);
  ``one_way: true`` cuts only messages from the first side to the second. ``replica``: only
  the Raft replica ``target`` (``raft<i>`` / ``raft-leader``) is cut from the other replicas;
  clients still reach it (its replication links failed; the leader hunt uses it).
* ``heal`` -- remove every partition.
* ``degrade`` -- link degradation of the metadata traffic and the host's data links:
  ``latency`` (extra seconds), ``loss`` / ``duplicate`` (probabilities), ``bandwidth``
  (factor in (0, 1] applied to the target's links).
* ``slow`` -- a slow node: ``factor`` in (0, 1] scales every link of the target host.
* ``corrupt`` -- flip ``bits`` random bits of the stored copy of ``chunk`` (an int chunk id of
  model ``model``, or a random one) on parameter server ``target``.
* ``pause`` -- a clock-free pause of a host (GC-like): it neither serves nor receives
  metadata messages (they wait) for ``duration`` seconds.
* ``push`` -- a parameter update (model push / fine-tune) of ``model`` written by ``writer``
  (a host name); two pushes at the same instant from different writers are concurrent.

Every fault with ``duration`` reverts by itself (restart, heal, undo degradation, resume).

The random process (:func:`random_schedule`) draws faults with exponential gaps from a seeded
Generator (the run's ``faults`` stream) up to ``random.until`` seconds; the schedule is drawn
in full before the run, so it is a pure function of (scenario, seed) and replays exactly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from engine.limits import MIN_INTERVAL, CheckedModel, Interval, IntervalOrOff
from engine.units import parse_duration
from sim.control.raft.buggify import BuggifyConfig

MAX_TIME = 1e6
"""Largest fault time or duration accepted, seconds (11.6 simulated days): a fault must
strike and heal within a run a computer can simulate; later ones are input errors."""

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
FaultTime = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=MAX_TIME)]

KINDS = ("kill", "restart", "partition", "heal", "degrade", "slow", "corrupt", "pause", "push")
SHAPES = ("isolate", "halves", "majority-minority", "majorities-ring", "bridge")
_TARGET_KINDS = ("kill", "restart", "slow", "corrupt", "pause", "degrade")


class _F(CheckedModel, BaseModel):  # BaseModel named too, for linters
    # Every field carries a one-line attribute docstring (its description in the generated
    # docs/scenario-reference.md, see sim.docgen).
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


class FaultSpec(_F):
    """One fault (see the module docstring for the kinds and their fields)."""

    at: FaultTime
    """Simulated time the fault strikes, seconds or a duration (>= 0)."""
    kind: Literal[
        "kill", "restart", "partition", "heal", "degrade", "slow", "corrupt", "pause", "push"
    ]
    """What happens; see the fault kinds below."""
    target: str | None = None
    """ps<i>, node<i>, raft<i> or raft-leader; needed by all kinds but partition/heal/push."""
    duration: FaultTime | None = None
    """Seconds until the fault reverts by itself (restart, heal, undo, resume); null: never."""
    disk: bool = True
    """kill/restart: false restarts without state (a PS loses DRAM+SSD, Raft rejoins empty)."""
    shape: Literal[
        "isolate", "halves", "majority-minority", "majorities-ring", "bridge", "replica"
    ] = "isolate"
    """partition: which hosts are cut from which; see the module docstring of sim.control.faults."""
    one_way: bool = False
    """partition: cut only messages from the first side to the second."""
    latency: FaultTime = 0.0
    """degrade: extra latency added to the target's links, seconds or a duration."""
    loss: float = Field(default=0.0, ge=0, lt=1)
    """degrade: probability a metadata message is lost, in [0, 1)."""
    duplicate: float = Field(default=0.0, ge=0, lt=1)
    """degrade: probability a metadata message is delivered twice, in [0, 1)."""
    bandwidth: float = Field(default=1.0, gt=0, le=1)
    """degrade: factor applied to the bandwidth of the target's links, in (0, 1]."""
    factor: float = Field(default=1.0, gt=0, le=1)
    """slow: factor applied to every link of the target host, in (0, 1]."""
    model: int = Field(default=0, ge=0)
    """corrupt/push: deployment index of the model (0-based)."""
    chunk: int | None = Field(default=None, ge=0)
    """corrupt: chunk id to corrupt; null: a random chunk."""
    bits: int = Field(default=1, ge=1, le=64)
    """corrupt: number of random bits flipped in the stored copy (R28), 1..64."""
    writer: str = "ps0"
    """push: host that writes the new parameter version (R4)."""

    @model_validator(mode="after")
    def _needs_target(self) -> FaultSpec:
        if self.kind in _TARGET_KINDS and not self.target:
            raise ValueError(
                f"a {self.kind!r} fault needs a target (ps<i>, node<i>, raft<i> or raft-leader)"
            )
        if self.kind == "corrupt" and self.target and not self.target.startswith("ps"):
            raise ValueError(f"corrupt targets a parameter server (ps<i>), not {self.target!r}")
        return self


class RandomFaultsCfg(_F):
    """The seeded random fault process (off unless ``enabled``)."""

    enabled: bool = False
    """Draw random faults for this run (from the run's `faults` seed stream)."""
    rate: float = Field(default=2.0, gt=0, le=1 / MIN_INTERVAL)
    """Mean faults per simulated second (exponential gaps), > 0 and at most 1e6."""
    start: Duration = 0.2
    """No random fault before this time, seconds or a duration."""
    until: Duration = 3.0
    """No random fault from this time on, seconds or a duration."""
    kinds: dict[str, float] = {
        "kill": 3.0,
        "partition": 2.0,
        "degrade": 1.0,
        "slow": 0.5,
        "corrupt": 1.0,
        "pause": 0.5,
    }
    """Relative weight of each fault kind (kinds left out are never drawn; not restart/heal)."""
    duration: tuple[float, float] = (0.1, 0.8)
    """How long a drawn fault lasts: U(lo, hi) seconds, 0 < lo <= hi."""
    leader_bias: float = Field(default=0.5, ge=0, le=1)
    """Probability a kill (or a partition, then cutting its replica off) targets the Raft leader."""
    diskless: float = Field(default=0.2, ge=0, le=1)
    """Probability a killed server or node restarts without its disk (Raft replicas keep theirs)."""
    hunt: float = Field(default=0.0, ge=0, le=1)
    """Leader hunting: probability each new leader is crashed or cut off soon after election."""
    hunt_delay: Duration = 0.08
    """Leader hunting: the hunt strikes U(0, hunt_delay) seconds after a leader appears."""
    shapes: dict[str, float] | None = None
    """Weight of each partition shape drawn (SHAPES, and `replica`: only for partitions around the leader, which then take the leader as target); null: equal, leader partitions are `replica`."""
    hold: float = Field(default=0.05, ge=0, le=1)
    """BUGGIFY: probability a Raft message is held back U(0, hold_max) s (delay across elections, reordering)."""
    hold_max: Duration = Field(default=1.0, le=MAX_TIME)
    """BUGGIFY: longest hold of a Raft message or of its duplicate, seconds or a duration."""
    duplicate: float = Field(default=0.05, ge=0, le=1)
    """BUGGIFY: probability a Raft message is sent again U(0, hold_max) s later (stale replies)."""
    early_timer: float = Field(default=0.02, ge=0, le=1)
    """BUGGIFY: probability an election timer is drawn early, U(0, lo) instead of U(lo, hi)."""
    isolate_after_append: float = Field(default=0.3, ge=0, le=1)
    """Figure 8: probability a leader's messages to the replicas are cut right after it appends its term's first client entry (replies still reach it)."""
    deafen_leader: float = Field(default=0.005, ge=0, le=1)
    """Probability a leader stops hearing the replicas right after it appends (they still hear it: a stale leader)."""
    restart_mid_replication: float = Field(default=0.005, ge=0, le=1)
    """Probability a follower crashes right after storing entries (its ack in flight) and restarts with its disk."""

    def buggify(self) -> BuggifyConfig:
        """The BUGGIFY knobs of the Raft replicas (:mod:`sim.control.raft.buggify`)."""
        return BuggifyConfig(
            hold=self.hold,
            hold_max=self.hold_max,
            duplicate=self.duplicate,
            early_timer=self.early_timer,
            mute_after_append=self.isolate_after_append,
            deafen_leader=self.deafen_leader,
            mute=self.duration,
            restart_mid_replication=self.restart_mid_replication,
        )

    @model_validator(mode="after")
    def _check(self) -> RandomFaultsCfg:
        bad = [k for k in self.kinds if k not in KINDS or k in ("restart", "heal")]
        if bad:
            allowed = ", ".join(k for k in KINDS if k not in ("restart", "heal"))
            raise ValueError(f"unknown fault kind(s) {bad}; allowed: {allowed}")
        if any(v < 0 for v in self.kinds.values()) or not sum(self.kinds.values()) > 0:
            raise ValueError("kind weights must be >= 0 with a positive sum")
        lo, hi = self.duration
        if not 0 < lo <= hi <= MAX_TIME:
            raise ValueError(f"duration {self.duration!r}: allowed 0 < lo <= hi <= {MAX_TIME:g}")
        if self.until > MAX_TIME:
            raise ValueError(f"until {self.until!r}: allowed <= {MAX_TIME:g} s")
        if self.shapes is not None:
            bad = [k for k in self.shapes if k not in (*SHAPES, "replica")]
            if bad:
                raise ValueError(
                    f"unknown partition shape(s) {bad}; allowed: {', '.join(SHAPES)}, replica"
                )
            w = list(self.shapes.values())
            if any(not v >= 0 for v in w) or not 0 < sum(w) < float("inf"):
                raise ValueError("shape weights must be finite, >= 0, with a positive sum")
        return self


class RaftCfg(_F):
    """The metadata service's Raft group (R8)."""

    replicas: Literal[1, 3, 5] = 3
    """Raft replicas (1, 3 or 5), placed on parameter servers first, then compute nodes."""
    election_timeout: tuple[float, float] = (0.15, 0.30)
    """A follower without a heartbeat starts an election after U(lo, hi) seconds."""
    heartbeat: Interval = 0.05
    """Interval of the leader's heartbeats (AppendEntries), seconds or a duration (>= 1 us)."""
    lease_interval: IntervalOrOff = 0.25
    """Background metadata load: each compute node renews its membership this often (>= 1 us);
    0: off."""
    client_timeout: Interval = 0.3
    """A metadata client retries (another replica) after this many seconds without an answer
    (>= 1 us)."""
    rpc_latency: tuple[float, float] = (0.001, 0.004)
    """Delay of one metadata message: min + U(0, jitter) seconds, added to the NIC latencies."""
    loss: float = Field(default=0.0, ge=0, lt=1)
    """Baseline probability that a metadata message is lost, in [0, 1)."""
    duplicate: float = Field(default=0.0, ge=0, lt=1)
    """Baseline probability that a metadata message is delivered twice, in [0, 1)."""
    max_batch: int = Field(default=64, ge=1)
    """Most log entries in one AppendEntries; small values make a lagging follower catch up in many short batches."""
    unsafe_commit_old_terms: bool = False
    """TEST ONLY: plant a Raft bug (a leader commits old-term entries by counting)."""

    @model_validator(mode="after")
    def _timers(self) -> RaftCfg:
        lo, hi = self.election_timeout
        if not MIN_INTERVAL <= lo <= hi <= MAX_TIME:
            raise ValueError(
                f"election_timeout {self.election_timeout!r}: allowed "
                f"{MIN_INTERVAL:g} <= lo <= hi <= {MAX_TIME:g} s"
            )
        base, jitter = self.rpc_latency
        if not (0 <= base <= MAX_TIME and 0 <= jitter <= MAX_TIME):
            raise ValueError(
                f"rpc_latency {self.rpc_latency!r}: allowed min and jitter in [0, {MAX_TIME:g}] s"
            )
        return self


class FaultsCfg(_F):
    """The scenario's ``faults:`` section: control plane, integrity, checkers, faults."""

    enabled: bool = False
    """Run the Raft metadata service, integrity checks, versions and checkers at all."""
    raft: RaftCfg = RaftCfg()
    """The metadata service's Raft group (R8)."""
    schedule: list[FaultSpec] = []
    """Faults at fixed times (see `FaultSpec`)."""
    random: RandomFaultsCfg = RandomFaultsCfg()
    """The seeded random fault process."""
    deadline: Duration = 2.0
    """A request not placed on a node that reaches its parameters by then ends degraded (R28)."""
    verify: bool = True
    """Verify CRC32C + SHA-256 of every chunk a parameter server serves (R28)."""
    linearizability_max_ops: int = Field(default=300, ge=0)
    """Check linearizability of the metadata history when it has at most this many ops."""
    stop_on_violation: bool = True
    """Stop the run at the first checker violation."""
    liveness: Duration = Field(default=1.5, le=60)
    """After the last fault heals, a leader, a committed probe write and every replica holding it within this many seconds (sim.control.raft.liveness); 0: no liveness checks."""


def hosts(param_servers: int, nodes: int) -> list[str]:
    """Every host name in the fixed order used by partitions and Raft placement."""
    return [f"ps{i}" for i in range(param_servers)] + [f"node{i}" for i in range(nodes)]


def raft_hosts(all_hosts: list[str], replicas: int) -> list[str]:
    """Host of each Raft replica: parameter servers first, then compute nodes (wrapping)."""
    return [all_hosts[i % len(all_hosts)] for i in range(replicas)]


def random_schedule(
    cfg: RandomFaultsCfg, rng: np.random.Generator, n_ps: int, n_nodes: int, n_raft: int
) -> list[FaultSpec]:
    """Draw the random fault schedule (see the module docstring); deterministic in ``rng``."""
    kinds = [k for k in KINDS if cfg.kinds.get(k, 0.0) > 0]  # fixed order, not dict order
    w = np.array([cfg.kinds[k] for k in kinds], dtype=float)
    w /= w.sum()
    out: list[FaultSpec] = []
    t = cfg.start
    while True:
        t += float(rng.exponential(1.0 / cfg.rate))
        if t >= cfg.until:
            return out
        kind = kinds[int(rng.choice(len(kinds), p=w))]
        dur = float(rng.uniform(*cfg.duration))
        spec: dict[str, Any] = {"at": t, "kind": kind, "duration": dur}
        if kind == "kill":
            r = float(rng.random())
            if r < cfg.leader_bias:
                spec["target"] = "raft-leader"
            else:
                pool = (
                    [f"ps{i}" for i in range(n_ps)]
                    + [f"node{i}" for i in range(n_nodes)]
                    + [f"raft{i}" for i in range(n_raft)]
                )
                spec["target"] = pool[int(rng.integers(len(pool)))]
            lose = bool(rng.random() < cfg.diskless)
            # a Raft replica that forgets its vote can break Election Safety when it rejoins
            # through a stale leader (sim.control.raft.node's caveat; safe only with a membership
            # change, not modelled), so random faults restart Raft replicas with their disks
            spec["disk"] = not lose or str(spec["target"]).startswith("raft")
        elif kind == "partition":
            spec["shape"] = _draw_shape(cfg.shapes, SHAPES, rng)
            spec["one_way"] = bool(rng.random() < 0.3)
            spec["target"] = hosts(n_ps, n_nodes)[int(rng.integers(n_ps + n_nodes))]
            if float(rng.random()) < cfg.leader_bias:  # a partition around the leader
                spec["target"] = "raft-leader"
                spec["shape"] = (
                    "replica"
                    if cfg.shapes is None
                    else _draw_shape(cfg.shapes, (*SHAPES, "replica"), rng)
                )
        elif kind == "degrade":
            spec["target"] = hosts(n_ps, n_nodes)[int(rng.integers(n_ps + n_nodes))]
            spec["latency"] = float(rng.uniform(0.0, 0.02))
            spec["loss"] = float(rng.uniform(0.0, 0.2))
            spec["duplicate"] = float(rng.uniform(0.0, 0.1))
            spec["bandwidth"] = float(rng.uniform(0.1, 1.0))
        elif kind == "slow":
            spec["target"] = f"node{int(rng.integers(n_nodes))}"
            spec["factor"] = float(rng.uniform(0.05, 0.5))
        elif kind == "corrupt":
            spec["target"] = f"ps{int(rng.integers(n_ps))}"
            spec["bits"] = int(rng.integers(1, 9))
            spec["chunk"] = None
            spec["duration"] = None
        elif kind == "pause":
            spec["target"] = hosts(n_ps, n_nodes)[int(rng.integers(n_ps + n_nodes))]
        elif kind == "push":
            spec["writer"] = f"ps{int(rng.integers(n_ps))}"
            spec["duration"] = None
        out.append(FaultSpec.model_validate(spec))


def _draw_shape(
    weights: dict[str, float] | None, shapes: tuple[str, ...], rng: np.random.Generator
) -> str:
    """A partition shape drawn by ``weights`` among ``shapes`` (equal weights when none is
    given or all of these are 0)."""
    w = np.array([(weights or {}).get(x, 0.0) for x in shapes], dtype=float)
    if not w.sum() > 0:
        return shapes[int(rng.integers(len(shapes)))]
    return shapes[int(rng.choice(len(shapes), p=w / w.sum()))]


def partition_cuts(
    shape: str, all_hosts: list[str], target: str | None, raft: list[str], one_way: bool
) -> list[tuple[str, str]]:
    """Directed host pairs ``(a, b)`` whose messages ``a -> b`` are cut by a partition.

    Sides are deterministic functions of the host order, the target and the Raft hosts.
    """
    n = len(all_hosts)
    idx = {h: i for i, h in enumerate(all_hosts)}
    t = idx.get(target or "", 0)
    if shape == "majorities-ring":
        order = all_hosts[t:] + all_hosts[:t]
        pos = {h: i for i, h in enumerate(order)}
        cuts = []
        for a in all_hosts:
            for b in all_hosts:
                d = abs(pos[a] - pos[b])
                if a != b and min(d, n - d) > 1:
                    cuts.append((a, b))
        return cuts  # symmetric by construction
    if shape == "isolate":
        left, right = [all_hosts[t]], [h for h in all_hosts if h != all_hosts[t]]
    elif shape == "halves":
        left, right = all_hosts[: n // 2], all_hosts[n // 2 :]
    elif shape == "majority-minority":
        k = (len(raft) - 1) // 2 or 1
        rh = sorted(set(raft), key=lambda h: idx[h])
        start = rh.index(all_hosts[t]) if all_hosts[t] in rh else 0
        minority = [rh[(start + i) % len(rh)] for i in range(min(k, len(rh)))]
        left, right = minority, [h for h in all_hosts if h not in minority]
    else:  # bridge: the target sits in the middle and reaches both halves
        rest = [h for h in all_hosts if h != all_hosts[t]]
        left, right = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    cuts = [(a, b) for a in left for b in right]
    if not one_way:
        cuts += [(b, a) for a in left for b in right]
    return cuts


def check_faults(sc: Any) -> None:
    """Raise :class:`InputError` naming the scenario file and field for a fault that names a
    host, replica, model or writer the scenario does not have."""
    from engine.errors import InputError

    c = sc.cluster
    f = sc.faults
    d = sc.disaggregation  # a disaggregated cluster's nodes are its pools' replicas
    n_nodes = d.prefill.replicas + d.decode.replicas if d.enabled else c.replicas
    all_hosts = hosts(c.param_servers, n_nodes)
    replicas = [f"raft{i}" for i in range(f.raft.replicas)]
    allowed = [*all_hosts, *replicas, "raft-leader"]
    for i, spec in enumerate(f.schedule):
        where = f"faults.schedule[{i}]"
        if spec.target is not None and spec.target not in allowed:
            if spec.kind == "partition" and spec.target in all_hosts:
                continue
            raise InputError(
                f"unknown target {spec.target!r}; allowed: {', '.join(allowed)}",
                source=sc.source,
                where=f"{where}.target",
            )
        if spec.kind == "corrupt" and spec.target not in all_hosts[: c.param_servers]:
            raise InputError(
                f"corrupt needs a parameter server; allowed: "
                f"{', '.join(all_hosts[: c.param_servers])}",
                source=sc.source,
                where=f"{where}.target",
            )
        if spec.kind in ("push", "corrupt") and spec.model >= len(sc.deployments):
            raise InputError(
                f"model index {spec.model} out of range; allowed: 0..{len(sc.deployments) - 1}",
                source=sc.source,
                where=f"{where}.model",
            )
        if spec.kind == "push" and spec.writer not in all_hosts:
            raise InputError(
                f"unknown writer {spec.writer!r}; allowed: {', '.join(all_hosts)}",
                source=sc.source,
                where=f"{where}.writer",
            )
