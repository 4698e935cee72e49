"""The cluster's metadata service: a Raft group whose messages cross the simulated network.

* :class:`Reachability` -- which host can send to which now (directed cuts from partitions),
  paused hosts, and per-host degradation (extra latency, loss, duplication).
* :class:`NetTransport` -- a :class:`sim.control.raft.transport.Transport` whose endpoints live on
  hosts (``ps<i>`` / ``node<i>``): a message from host ``a`` to host ``b`` takes the latency
  of both hosts' NIC links plus an RPC delay ``min + U(0, jitter)`` (plus degradation), is
  dropped when the
  pair is cut or either NIC is down, and waits while ``b`` is paused.
* :class:`MetaService` -- the Raft group (replicas placed on hosts by
  :func:`sim.control.faults.raft_hosts`), one client per writing host with a FIFO of operations, and
  the watch hub. :class:`RaftDirectory` replaces the in-process directory: the replica map is
  written through Raft (``repl/<model>:<chunk>``) and the fetch path reads a local view that a
  watch keeps up to date (R11), so a replica is used only once its record is committed.

Routing (degradation path "retry on another replica"): a fetch tries the chunk's replicas in
rotation and skips a server that is down, paused, cut off from the node, or whose copy fails
its checksum (:mod:`sim.control.integrity`); each skip is counted as a retry. With no usable replica
the node reads the object store itself. A skip costs no simulated time (a documented
simplification: failure detection is assumed instantaneous for the data plane).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from sim.control.faults import FaultsCfg, raft_hosts
from sim.control.raft import UNKNOWN, RaftConfig, RaftGroup, SafetyChecker
from sim.control.raft.messages import CLIENT_ID_BASE
from sim.control.raft.statemachine import Change
from sim.serving.paramserver import OBJECT, MetadataDirectory

if TYPE_CHECKING:
    from sim.serving.context import SimContext


class Reachability:
    """Directed cuts, pauses and degradation per host. Invariant: ``cuts`` holds only
    pairs of distinct hosts; an empty ``cuts`` means every host reaches every other."""

    def __init__(self, all_hosts: list[str]) -> None:
        self.hosts = list(all_hosts)
        self.cuts: set[tuple[str, str]] = set()
        self.paused: dict[str, int] = {}
        self.extra_latency: dict[str, float] = {}
        self.loss: dict[str, float] = {}
        self.duplicate: dict[str, float] = {}
        self.base_loss = 0.0
        #: Raft replicas cut from the other replicas (clients still reach them)
        self.cut_replicas: set[int] = set()
        self.base_duplicate = 0.0

    def ok(self, a: str, b: str) -> bool:
        """Whether a message from host ``a`` to host ``b`` passes the partition rules."""
        return a == b or (a, b) not in self.cuts

    def is_paused(self, h: str) -> bool:
        return self.paused.get(h, 0) > 0


class NetTransport:
    """See the module docstring. ``host_of(endpoint) -> host``; ``nic(host) -> Link``."""

    def __init__(
        self,
        env: simpy.Environment,
        rng: np.random.Generator,
        reach: Reachability,
        host_of: Callable[[int], str],
        nic: Callable[[str], Any],
        rpc: tuple[float, float] = (0.001, 0.004),
    ) -> None:
        self.env, self.rng, self.reach = env, rng, reach
        self.host_of, self.nic = host_of, nic
        self.rpc_min, self.jitter = rpc
        self._endpoints: dict[int, Callable[[Any], None]] = {}
        self._held: dict[str, list[tuple[int, int, Any]]] = {}
        self.sent = self.delivered = self.dropped = self.duplicated = 0

    def register(self, node: int, deliver: Callable[[Any], None]) -> None:
        self._endpoints[node] = deliver

    def _passes(self, src: int, dst: int, a: str, b: str) -> bool:
        na, nb = self.nic(a), self.nic(b)
        cut = self.reach.cut_replicas
        if cut and src < CLIENT_ID_BASE and dst < CLIENT_ID_BASE and (src in cut) != (dst in cut):
            return False
        return self.reach.ok(a, b) and na.up and nb.up

    def send(self, src: int, dst: int, msg: Any) -> None:
        self.sent += 1
        a, b = self.host_of(src), self.host_of(dst)
        r = self.reach
        loss = r.base_loss + r.loss.get(a, 0.0) + r.loss.get(b, 0.0)
        # one draw per message whatever the fault state, so faults do not shift the stream
        u_loss, u_dup, u_jit = self.rng.random(3)
        if not self._passes(src, dst, a, b) or u_loss < loss:
            self.dropped += 1
            return
        copies = 1
        if u_dup < r.base_duplicate + r.duplicate.get(a, 0.0) + r.duplicate.get(b, 0.0):
            copies = 2
            self.duplicated += 1
        base = 0.0 if a == b else self.nic(a).latency + self.nic(b).latency
        delay = base + self.rpc_min + r.extra_latency.get(a, 0.0) + r.extra_latency.get(b, 0.0)
        for i in range(copies):  # a duplicate arrives one jitter draw later
            ev = self.env.timeout(delay + float(u_jit) * self.jitter * (i + 1))
            ev.callbacks.append(partial(self._arrive, src, dst, msg))

    def _arrive(self, src: int, dst: int, msg: Any, _ev: Any = None) -> None:
        a, b = self.host_of(src), self.host_of(dst)
        if not self._passes(src, dst, a, b) or dst not in self._endpoints:
            self.dropped += 1
            return
        if self.reach.is_paused(b):  # a paused host handles it when it resumes
            self._held.setdefault(b, []).append((src, dst, msg))
            return
        self.delivered += 1
        self._endpoints[dst](msg)

    def resume(self, host: str) -> None:
        """Deliver, in arrival order, what reached ``host`` while it was paused."""
        for src, dst, msg in self._held.pop(host, []):
            self._arrive(src, dst, msg)


class MetaService:
    """The Raft-backed metadata service of one cluster; see the module docstring."""

    def __init__(
        self, ctx: SimContext, cfg: FaultsCfg, all_hosts: list[str], rng: np.random.Generator
    ) -> None:
        self.ctx, self.env, self.cfg = ctx, ctx.env, cfg
        self.reach = Reachability(all_hosts)
        self.reach.base_loss, self.reach.base_duplicate = cfg.raft.loss, cfg.raft.duplicate
        rc = cfg.raft
        self.replica_host = raft_hosts(all_hosts, rc.replicas)
        self._client_host: dict[int, str] = {}
        links = {s.name: s.links["nic"] for s in ctx.servers}
        links.update({n.name: n.ws.links["nic"] for n in ctx.nodes})
        self.transport = NetTransport(
            self.env,
            rng.spawn(1)[0],
            self.reach,
            self.host_of,
            links.__getitem__,
            cfg.raft.rpc_latency,
        )
        self.checker = SafetyChecker(strict=cfg.stop_on_violation)
        raft_cfg = RaftConfig(
            n=rc.replicas,
            election_timeout=rc.election_timeout,
            heartbeat_interval=rc.heartbeat,
            max_batch=rc.max_batch,
            unsafe_commit_old_terms=rc.unsafe_commit_old_terms,
        )
        self.group = RaftGroup(
            self.env, raft_cfg, rng.spawn(1)[0], transport=self.transport, checker=self.checker
        )
        self._clients: dict[str, Any] = {}
        self._queues: dict[str, deque[tuple[str, str, Any, Callable[[Any], None] | None]]] = {}
        self._wake: dict[str, simpy.Event | None] = {}
        self.unknown = 0
        self.leader_log: list[tuple[float, int | None, int]] = []

    def host_of(self, endpoint: int) -> str:
        if endpoint >= CLIENT_ID_BASE:
            return self._client_host[endpoint]
        return self.replica_host[endpoint]

    def start(self) -> None:
        self.group.start()
        self.env.process(self._watch_leader())

    def _watch_leader(self) -> Generator[simpy.Event, Any, None]:
        """Samples the leader every 10 ms (for time-to-elect figures)."""
        last: tuple[int | None, int] = (-1, -1)
        while True:
            lead = self.group.leader()
            cur = (lead, -1 if lead is None else self.group.nodes[lead].current_term)
            if cur != last:
                self.leader_log.append((self.env.now, *cur))
                last = cur
            yield self.env.timeout(0.01)

    # -- writes ------------------------------------------------------------------------------
    def submit(
        self,
        host: str,
        op: str,
        key: str,
        value: Any = None,
        done: Callable[[Any], None] | None = None,
    ) -> None:
        """Queue ``op key value`` from ``host``'s client (FIFO, one call outstanding per
        host); ``done(result)`` runs when acknowledged (:data:`UNKNOWN` if it gave up)."""
        if host not in self._clients:
            c = self.group.client(timeout=self.cfg.raft.client_timeout, give_up=2.0)
            self._client_host[c.id] = host
            self._clients[host] = c
            self._queues[host] = deque()
            self._wake[host] = None
            self.env.process(self._drain(host))
        self._queues[host].append((op, key, value, done))
        w = self._wake[host]
        if w is not None and not w.triggered:
            w.succeed()

    def queued(self, host: str) -> int:
        """Operations from ``host`` queued and not yet sent (0 for a host that sent none)."""
        q = self._queues.get(host)
        return 0 if q is None else len(q)

    def client_on(self, host: str, **kwargs: float) -> Any:
        """A new Raft client endpoint on ``host`` (kwargs go to :class:`sim.control.raft.RaftClient`)."""
        c = self.group.client(**kwargs)
        self._client_host[c.id] = host
        return c

    def _drain(self, host: str) -> Generator[simpy.Event, Any, None]:
        q, c = self._queues[host], self._clients[host]
        while True:
            if not q:
                wake = self._wake[host] = self.env.event()
                yield wake
                self._wake[host] = None
                continue
            op, key, value, done = q.popleft()
            res = yield self.env.process(c.call(op, key, value))
            if res is UNKNOWN:
                self.unknown += 1
            if done is not None:
                done(res)

    def watch(self, prefix: str, cb: Callable[[Change], None]) -> None:
        self.group.watch(prefix, cb)

    def history(self) -> list[Any]:
        return [h for c in self.group.clients for h in c.history]


class RaftDirectory(MetadataDirectory):
    """The chunk directory with its replica map kept in Raft; see the module docstring.

    Built from the in-process directory (same ring placement and warm-up state)."""

    def __init__(self, base: MetadataDirectory, meta: MetaService, integrity: Any) -> None:
        self.__dict__.update(base.__dict__)
        self.meta = meta
        self.integrity = integrity
        self.retries = 0
        self.unavailable = 0
        meta.watch("repl/", self._on_repl)

    def _on_repl(self, ch: Change) -> None:
        m, cid = (int(x) for x in ch.key[5:].split(":"))
        if ch.new is not None:
            self._replicas[m][cid] = list(ch.new)

    def add_replica(self, m: int, cid: int, ps: int) -> None:
        """Record a new replica through Raft; the fetch path sees it once committed."""
        reps = self._replicas[m][cid]
        if ps not in reps:
            src = self.ctx.servers[ps].name
            self.meta.submit(src, "put", f"repl/{m}:{cid}", (*reps, ps))

    def usable(self, ps: int, node_host: str | None) -> bool:
        s = self.ctx.servers[ps]
        r = self.meta.reach
        if not s.up or r.is_paused(s.name):
            return False
        return node_host is None or (r.ok(s.name, node_host) and r.ok(node_host, s.name))

    def serve(
        self, m: int, cid: int, key: int, size: int, now: float, node: int = -1
    ) -> tuple[int, int]:
        """Serve chunk ``(m, cid)`` to compute node ``node``: ``(server, tier)`` or
        ``(-1, OBJECT)`` (see the module docstring for the routing rule)."""
        node_host = f"node{node}" if node >= 0 else None
        self.window_counts[m][cid] += 1
        servers = self.ctx.servers
        reps = self._replicas[m][cid]
        self._rr += 1
        n = len(reps)
        for i in range(n):
            ps = reps[(self._rr + i) % n]
            if not self.usable(ps, node_host):
                self.retries += 1
                continue
            if self.integrity is not None and not self.integrity.check_read(ps, key, now):
                self.retries += 1  # corrupt copy: never used; repaired in the background
                continue
            return ps, servers[ps].serve(key, size, now)
        self.unavailable += 1
        return -1, OBJECT
