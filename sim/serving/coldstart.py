"""A new replica's cold start, from the mechanisms: provisioning, weights along a path, warm-up.

One scale-out decision starts a :class:`ColdStart` for the replicas it adds (made by
:class:`sim.serving.replicafactory.ReplicaFactory` with empty tiers). Its phases:

1. **provisioning** -- ``provision_s`` (the profile's :class:`sim.serving.costmodel.ColdStartProfile`
   or the scenario's override): a server or container comes up.
2. **loading** -- the weights move over the replica's own links, shared max-min fairly with
   every other flow (:class:`sim.serving.network.Network`), along the ``source`` path:

   * coupled mode (a replica serves only once every weight is in HBM): per model, in the
     deployments' share order, ONE transfer of the whole checkpoint over ``object`` ->
     ``pcie`` (object store), ``nvme`` -> ``pcie`` (local NVMe) or ``pcie`` (host memory),
     then the ``warmup_s`` of graph capture. It serves at
     ``provision + sum(latencies) + bytes / bottleneck + warmup`` when nothing else moves.
   * parameter/data-separated mode (a replica fetches what it lacks on demand,
     :mod:`sim.serving.fetchpath`): it serves after ``provision + warmup`` and its weights
     stream in layer by layer, in model then layer order, while it serves, until its HBM
     weight cache is full: from the parameter servers over their NICs and its NIC
     (``param-servers``: the fetch path's own transfer, one per source), or from running
     replicas over the GPU network (``peers``: ONE multicast flow per layer from a serving
     replica holding the layer, over its NIC and the NIC of every replica of the group: the
     bytes leave the source once; a layer no serving replica holds comes from the parameter
     servers). A request that reaches a layer still in flight waits for that layer only
     (the stream's chunks count as in flight, :meth:`sim.serving.paramstore.WeightStore.begin_stream`).

Times of each replica are kept in :attr:`ColdStart.times` (decision, provisioned, serving,
loaded) and the bytes moved per source in :attr:`ColdStart.bytes`. The cold start does not
mark a replica serving itself: ``on_state(node, state)`` is told each phase (``loading``,
``serving``) and its owner (the autoscaler) puts the replica into service.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Literal

import simpy

if TYPE_CHECKING:
    from sim.serving.link import Link
    from sim.serving.replica import ComputeNode

Source = Literal["object", "nvme", "host", "param-servers", "peers"]
#: the load paths of each mode
COUPLED_SOURCES: tuple[str, ...] = ("object", "nvme", "host")
PD_SOURCES: tuple[str, ...] = ("param-servers", "peers")
#: the stream's transfers yield to an iteration's demand fetches (priority 0)
STREAM_PRIORITY = 1


def coupled_path(node: ComputeNode, source: str) -> list[Link]:
    """The links a coupled replica's checkpoint crosses from ``source`` into HBM."""
    lk = node.ws.links
    if source == "object":
        return [lk["object"], lk["pcie"]]
    if source == "nvme":
        return [lk["nvme"], lk["pcie"]]
    if source == "host":
        return [lk["pcie"]]
    raise ValueError(f"coupled cold start: source {source!r}; allowed: {COUPLED_SOURCES}")


class ColdStart:
    """The cold start of the replicas one decision adds (see the module docstring)."""

    def __init__(
        self,
        nodes: list[ComputeNode],
        source: str,
        provision_s: float,
        warmup_s: float,
        order: list[int],
        on_state: Callable[[ComputeNode, str], None],
        peers: Callable[[], list[ComputeNode]],
        rdma_latency: float,
    ) -> None:
        """``order``: model indices in load order; ``peers()``: the replicas serving now
        (multicast sources); ``rdma_latency``: a GPU-network transfer's first-byte delay."""
        if provision_s < 0 or warmup_s < 0:
            raise ValueError(f"provision and warm-up must be >= 0, got {provision_s}, {warmup_s}")
        self.nodes = nodes
        self.source = source
        self.provision_s = float(provision_s)
        self.warmup_s = float(warmup_s)
        self.order = order
        self.on_state = on_state
        self.peers = peers
        self.rdma_latency = float(rdma_latency)
        self.env = nodes[0].env
        self.coupled = source in COUPLED_SOURCES
        if not self.coupled and source not in PD_SOURCES:
            raise ValueError(
                f"cold start source {source!r}; allowed: {COUPLED_SOURCES + PD_SOURCES}"
            )
        t = float(self.env.now)
        #: per replica index: ``decision``, ``provisioned``, ``serving``, ``loaded`` times (s)
        self.times: dict[int, dict[str, float]] = {n.idx: {"decision": t} for n in nodes}
        #: bytes moved into the group per source (``object``, ``nvme``, ``host``,
        #: ``param-servers``, ``peers``; multicast bytes counted once per receiver)
        self.bytes: dict[str, int] = {}

    def start(self) -> simpy.Process:
        """Start the cold start's process."""
        return self.env.process(self._run())

    def _mark(self, node: ComputeNode, key: str) -> None:
        self.times[node.idx][key] = float(self.env.now)

    def _run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        yield env.timeout(self.provision_s)
        for n in self.nodes:
            self._mark(n, "provisioned")
            self.on_state(n, "loading")
        if self.coupled:
            yield simpy.AllOf(env, [env.process(self._load_coupled(n)) for n in self.nodes])
            for n in self.nodes:
                self._mark(n, "loaded")
            yield env.timeout(self.warmup_s)
            for n in self.nodes:
                self._mark(n, "serving")
                self.on_state(n, "serving")
            return
        stream = env.process(self._stream())
        yield env.timeout(self.warmup_s)
        for n in self.nodes:
            self._mark(n, "serving")
            self.on_state(n, "serving")
        yield stream

    # -- coupled: one checkpoint read per model ------------------------------------------------
    def _load_coupled(self, node: ComputeNode) -> Generator[simpy.Event, Any, None]:
        ws, net = node.ws, node.ctx.network
        path = coupled_path(node, self.source)
        for m in self.order:
            claims = [
                (layer, c)
                for layer in range(node.ctx.models[m].n_layers)
                if (c := ws.begin_stream(m, layer)) is not None
            ]
            total = sum(c[1] for _, c in claims)
            ok = True
            if total:
                ev = net.transfer(path, total, 0)
                try:
                    yield ev
                except Exception:  # a dropped link (faults): the node loads it on demand
                    ok = False
                self.bytes[self.source] = self.bytes.get(self.source, 0) + total
            for layer, (cids, _, done) in claims:
                ws.end_stream(m, layer, cids, done, ok)

    # -- parameter/data separated: layer-streamed ---------------------------------------------
    def _room(self, node: ComputeNode, nbytes: int) -> bool:
        hbm = node.ws.hbm
        return bool(hbm.used + nbytes <= hbm.capacity)

    def _stream(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        models = self.nodes[0].ctx.models
        for m in self.order:
            mr = models[m]
            for layer in range(mr.n_layers):
                lb = mr.layer_bytes[layer]
                if lb == 0:
                    continue
                dsts = [n for n in self.nodes if self._room(n, lb)]
                if not dsts:
                    break
                events = self._layer(m, layer, dsts)
                if events:
                    yield simpy.AllOf(env, events)
        for n in self.nodes:
            self._mark(n, "loaded")

    def _layer(self, m: int, layer: int, dsts: list[ComputeNode]) -> list[simpy.Event]:
        """Start moving ``layer`` of model ``m`` into ``dsts``; the events to wait for."""
        src = self._source_of(m, layer) if self.source == "peers" else None
        if src is None:
            return [ev for n in dsts if (ev := self._from_param_servers(n, m, layer)) is not None]
        claims = [(n, c) for n in dsts if (c := n.ws.begin_stream(m, layer)) is not None]
        if not claims:
            return []
        nbytes = max(c[1] for _, c in claims)
        path = [src.ws.links["nic"], *(n.ws.links["nic"] for n, _ in claims)]
        net = src.ctx.network
        ev = net.transfer(path, nbytes, STREAM_PRIORITY, after=self.rdma_latency)
        self.bytes["peers"] = self.bytes.get("peers", 0) + nbytes * len(claims)

        def landed(e: simpy.Event) -> None:
            ok = bool(e.ok)
            if not ok:
                e.defused = True
            for n, (cids, _, done) in claims:
                n.ws.end_stream(m, layer, cids, done, ok)

        ev.callbacks.append(landed)
        return [done for _, (_, _, done) in claims]

    def _from_param_servers(self, node: ComputeNode, m: int, layer: int) -> simpy.Event | None:
        ws = node.ws

        def count(tier: int, chunks: int, nbytes: int) -> None:
            self.bytes["param-servers"] = self.bytes.get("param-servers", 0) + nbytes

        return ws.fetch(m, layer, ws.missing(m, layer), STREAM_PRIORITY, count)

    def _source_of(self, m: int, layer: int) -> ComputeNode | None:
        """A serving replica holding ``layer`` of model ``m`` in HBM: the one whose NIC
        carries the fewest flows (ties: lowest index); None if none holds it."""
        best: ComputeNode | None = None
        best_key = (0, 0)
        for n in self.peers():
            if not n.ws.layer_resident(m, layer):
                continue
            key = (n.ws.links["nic"].n_flows, n.idx)
            if best is None or key < best_key:
                best, best_key = n, key
        return best
