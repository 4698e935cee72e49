"""Copy/compute interference: a streamed layer costs more than "copy overlapped with compute".

On a CPU the engine's prefetch thread (copying a layer host -> device) and its compute thread
share the cores, the memory bus and Python's GIL: on such a machine "host" and "device" memory
are the same DRAM, so the copy and the layer's weight reads compete for one bus. The
simulator's node charges a layer ``max(C, X)`` when a prefetch of ``X`` seconds (bytes /
``links.pcie.bandwidth``) is issued as a layer starts computing for ``C`` seconds
(``hold_pins``, the engine's order: the layer's own missing chunks are fetched and pinned
first, then the next layers' prefetch is planned; the layer ends when compute and prefetch
are both done). The engine measurably takes longer. This module models the difference
with calibrated terms: a factor ``s`` (``fitted.engine_fit[0]["copy_interference"]``) and a
fixed overhead ``h`` per streamed iteration of each kind -- decode-only iterations,
iterations that admit prompts back to back, and iterations that admit prompts after an idle
spell (:data:`H_KEYS`). Absent or 0 = no interference, so datasheet GPU profiles and every
ordinary scenario are unchanged:

    a layer with compute ``C`` and a copy of ``X`` issued as it starts computing ends after
    ``max(C, X) + s * min(C, X)``  (s = 0: fully parallel; s = 1: the overlapped part
    serialises, ``C + X``; s > 1: contention costs more than taking turns); an iteration
    that moved any bytes then costs ``h`` of its kind more.

(Per-kind factors can be given too -- ``"copy_interference_prefill"`` and
``"copy_interference_wake"``, each defaulting to the previous kind's -- but the calibration
writes one: see :func:`fit_terms`.)

Why this shape, from the engine on the 2-core VM (same arrivals served streaming and
resident, LRU streaming 20 MB per iteration, LRU-K 30 MB):

* The extra of a streamed decode step over its resident time grows by ~1.05 ms for the
  extra 10.4 MB, which is the copy's own time at the measured bandwidth (s ~ 1: copy and
  compute take turns), on top of ~0.9 ms that does not grow with the bytes (the compute
  thread's waits on the copy thread, plausibly): ``h``.
* A prompt-admitting iteration after an idle spell pays 2.5-4.5 ms over its resident time
  against ~2 ms for one back to back (its resident counterpart already pays ``wake_s``;
  plausibly the copy thread and its buffers start cold too).
* The symmetric form keeps LRU and LRU-K consistent: a decode step's ``min(C, X)`` is its
  compute, so the factor does not scale the extra copy; the earlier form ``max(C, X) + s *
  X`` needed 1.28 for LRU and 1.05 for LRU-K runs. A factor alone (no ``h``), fitted to
  probe runs of mixed batches, came out 6-9% low on batch-1 decode steps and 10-18% low on
  prefills after idle, the bulk of light load.

The probe runs tell ``s`` from the overheads only loosely (the prompt-admitting iterations
carry that information and are few): on the VM ``s`` came out 0-1.09 over six calibrations
while the extras charged within the probe's range moved less (a streamed batch-1 decode
step's 2.31-2.59 ms, a prefill's after idle 2.16-2.77 ms); see
docs/design/engine-calibration.md.

:func:`install` applies this to a built cluster's nodes (simulator side, used by
:func:`hwbench.validate.run_simulator`) without touching :mod:`sim.node`'s logic: each node's
``_layers`` is wrapped to learn the iteration's compute time and kind (``node.admitted``,
``node.woke``) and ``_prefetch`` to add one timeout event, ending at the formula's time, to
the events the (held) layer waits for (the copy's own transfer events still gate it too: a
copy queued behind others ends later); the iteration's overhead rides on that event of its
first layer with a copy in flight, so the node's own busy accounting includes it. Given a
:class:`KindBusy`, the wrapper also adds each streamed iteration's seconds to it by kind. :func:`fit_terms` finds ``s`` and the overheads so that
the simulator's busy seconds per kind on probe streaming runs match the engine's
(:func:`hwbench.engine_probe.fit_stream`).

Invariant: with every factor and overhead 0 (or no prefetch issued) the wrapped node
behaves exactly as the plain node (no event is added); without a :class:`KindBusy` and with
every term 0 nothing is wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import simpy

__all__ = [
    "DEFAULT",
    "H_KEYS",
    "H_MAX",
    "KEY",
    "KEYS",
    "KEY_PREFILL",
    "KEY_WAKE",
    "S_GRID",
    "S_MAX",
    "Interference",
    "KindBusy",
    "fit_terms",
    "install",
    "interference_of",
    "layer_time",
    "overhead_of",
]

KEY = "copy_interference"  # decode-only iterations (every iteration if the others are absent)
KEY_PREFILL = "copy_interference_prefill"  # prompt-admitting iterations (absent: KEY's)
KEY_WAKE = "copy_interference_wake"  # prompt-admitting iterations after idle (absent: prefill's)
KEYS = (KEY, KEY_PREFILL, KEY_WAKE)  # in Interference's order
#: fixed seconds per streamed iteration, by kind (absent: 0)
H_KEYS = ("stream_overhead_decode_s", "stream_overhead_prefill_s", "stream_overhead_wake_s")
DEFAULT = 0.0  # no interference
S_MAX = 4.0  # the factors' upper end (4: the overlapped part costs 5x its length)
H_MAX = 0.05  # the overheads' upper end, seconds per iteration


class Interference(NamedTuple):
    """One number per iteration kind: decode-only iterations, iterations that admit prompts
    back to back, and those that admit prompts after an idle spell (the node waited for a
    request). Holds the factors ``s`` or the overheads ``h`` (seconds)."""

    decode: float
    prefill: float
    wake: float

    @classmethod
    def of(cls, s: float | tuple[float, ...]) -> Interference:
        """``s`` as a triple: one number serves every kind; a pair (decode, prefill) gives
        the wake kind the prefill one."""
        if isinstance(s, tuple):
            if len(s) == 2:
                return cls(float(s[0]), float(s[1]), float(s[1]))
            if len(s) == 3:
                return cls(float(s[0]), float(s[1]), float(s[2]))
            raise ValueError(f"need 1-3 numbers (one per iteration kind), got {len(s)}")
        return cls(float(s), float(s), float(s))


def _zeros() -> list[float]:
    return [0.0, 0.0, 0.0]


@dataclass
class KindBusy:
    """What the simulator's nodes did on streamed iterations (iterations that moved bytes;
    summed over nodes), per kind in :class:`Interference`'s order: ``busy`` seconds,
    ``overlap`` = the sum of ``min(C, X)`` over their layers with a copy in flight (how busy
    grows with the factor ``s``) and ``count`` = the iterations (how it grows with ``h``)."""

    busy: list[float] = field(default_factory=_zeros)
    overlap: list[float] = field(default_factory=_zeros)
    count: list[float] = field(default_factory=_zeros)

    def kinds(self) -> tuple[float, float, float]:
        """Busy seconds (decode, prefill, wake)."""
        return self.busy[0], self.busy[1], self.busy[2]


def layer_time(compute_s: float, copy_s: float, s: float) -> float:
    """Seconds a layer computing ``compute_s`` takes while a copy of ``copy_s`` seconds
    issued at its start is in flight: ``max(C, X) + s * min(C, X)`` (module docstring)."""
    return max(compute_s, copy_s) + s * min(compute_s, copy_s)


def _triple(profile: Any, keys: tuple[str, str, str], default: float) -> Interference:
    fit = (profile.fitted.get("engine_fit") or [{}])[0]
    first = float(fit.get(keys[0], default))
    second = float(fit.get(keys[1], first))
    return Interference(first, second, float(fit.get(keys[2], second)))


def interference_of(profile: Any) -> Interference:
    """The profile's fitted factors (``fitted.engine_fit[0]``: ``KEY`` for decode-only
    iterations, ``KEY_PREFILL`` for prompt-admitting ones (default ``KEY``'s), ``KEY_WAKE``
    for those after idle (default ``KEY_PREFILL``'s)); ``DEFAULT`` for all when absent."""
    return _triple(profile, KEYS, DEFAULT)


def overhead_of(profile: Any) -> Interference:
    """The profile's fixed seconds per streamed iteration (``fitted.engine_fit[0]``,
    :data:`H_KEYS`, defaulting like :func:`interference_of`'s); 0 when absent."""
    return _triple(profile, H_KEYS, 0.0)


def install(
    cluster: Any,
    s: float | tuple[float, ...],
    bandwidth: float,
    latency: float = 0.0,
    busy: KindBusy | None = None,
    overhead: float | tuple[float, ...] = 0.0,
) -> None:
    """Apply the factors ``s`` and the per-iteration ``overhead`` seconds (each anything
    :meth:`Interference.of` takes) to every node of ``cluster`` (call after ``build``,
    before ``run``); copy time ``X = latency + bytes / bandwidth`` of the bytes a layer's
    prefetch moves. ``busy``: also fill it (:class:`KindBusy`). All zero without ``busy``
    installs nothing."""
    factors, extra = Interference.of(s), Interference.of(overhead)
    if max(factors) <= 0 and max(extra) <= 0 and busy is None:
        return
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    if min(factors) < 0 or min(extra) < 0:
        raise ValueError(f"interference factors and overheads must be >= 0, got {factors}, {extra}")
    for node in cluster.ctx.nodes:
        _wrap(node, factors, extra, float(bandwidth), float(latency), busy)


def _kind(node: Any) -> int:
    """The running iteration's kind, an index into :class:`Interference`."""
    if node.admitted <= 0:
        return 0
    return 2 if node.woke else 1


def _wrap(
    node: Any,
    factors: Interference,
    extra: Interference,
    bandwidth: float,
    latency: float,
    busy: KindBusy | None,
) -> None:
    orig_layers = node._layers
    orig_prefetch = node._prefetch
    # the running iteration's compute time, factor, overhead still to charge, bytes moved so
    # far and overlap
    state: dict[str, Any] = {
        "t_total": 0.0,
        "s": 0.0,
        "h": 0.0,
        "moved": 0,
        "overlap": 0.0,
    }

    def layers(m: int, t_total: float, nb: int) -> Generator[simpy.Event, Any, None]:
        kind = _kind(node)
        state.update(t_total=t_total, s=factors[kind], h=extra[kind], moved=0, overlap=0.0)
        t0 = node.env.now
        yield from orig_layers(m, t_total, nb)
        if busy is not None and state["moved"] > 0:  # a streamed iteration
            busy.busy[kind] += node.env.now - t0
            busy.overlap[kind] += state["overlap"]
            busy.count[kind] += 1

    def prefetch(m: int, layer: int, charge: Callable[[int, int, int], None]) -> list[Any]:
        moved = [0]

        def counted(tier: int, count: int, nbytes: int) -> None:
            moved[0] += nbytes
            charge(tier, count, nbytes)

        issued: list[Any] = orig_prefetch(m, layer, counted)
        if issued and moved[0] > 0:
            state["moved"] += moved[0]
            c = state["t_total"] * float(node.ctx.models[m].layer_frac[layer])
            x = latency + moved[0] / bandwidth
            state["overlap"] += min(c, x)
            # the iteration's overhead rides on its first layer with a copy in flight, so
            # the node's own busy accounting (the layer loop's elapsed time) includes it
            h, state["h"] = state["h"], 0.0
            if state["s"] > 0 or h > 0:
                issued.append(node.env.timeout(layer_time(c, x, state["s"]) + h))
        return issued

    node._layers = layers
    node._prefetch = prefetch


#: the factor grid :func:`fit_terms` searches (0.01 steps over [0, S_MAX])
S_GRID = np.linspace(0.0, S_MAX, round(S_MAX * 100) + 1)


def _fit_linear(
    rows: list[list[tuple[float, float, float, float]]],
) -> tuple[float, list[float]]:
    """Least squares for one factor ``s`` shared by every kind and one overhead per kind:
    ``rows[k]`` holds kind ``k``'s equations ``(a, c, b, w)`` meaning ``a * s + c * h_k = b``
    with weight ``w``. For each ``s`` of :data:`S_GRID` every ``h_k`` has a closed form
    (a 1-D least squares, clipped to ``[0, H_MAX]``: exact for a convex 1-D problem); the
    grid point of smallest weighted squared error wins (a kind without rows gets 0)."""
    # each kind's equations as arrays (a, c, b, w), built once for the whole grid
    kinds = [np.array(eqs, dtype=float).T if eqs else None for eqs in rows]
    best: tuple[float, float, list[float]] | None = None
    for sv in S_GRID:
        err, hs = 0.0, []
        for eq in kinds:
            if eq is None:
                hs.append(0.0)
                continue
            a, c, b, w = eq
            r = b - a * sv
            den = float(np.sum(w * c * c))
            hk = min(max(float(np.sum(w * c * r)) / den, 0.0), H_MAX) if den > 0 else 0.0
            hs.append(hk)
            err += float(np.sum(w * (r - c * hk) ** 2))
        if best is None or err < best[0]:
            best = (err, float(sv), hs)
    assert best is not None
    return best[1], best[2]


def fit_terms(
    targets: Sequence[tuple[float, float, float]],
    sims: Sequence[Callable[[Interference, Interference], KindBusy]],
    *,
    start: tuple[float, Interference] = (1.0, Interference(0.0, 0.0, 0.0)),
    rounds: int = 3,
) -> tuple[Interference, Interference]:
    """One factor ``s`` in ``[0, S_MAX]`` (the same for every kind) and one overhead ``h``
    per kind in ``[0, H_MAX]`` s such that every run's simulated busy seconds per kind
    (``sims[r](s, h)``) match ``targets[r]`` in the least-squares sense over runs and kinds,
    relative to the targets.

    Each round simulates every run at the current terms and solves the linearised problem
    ``busy + (s' - s) * overlap + (h' - h) * count = target`` (:func:`_fit_linear`); kinds
    interact only through timing. Why one factor: ``s`` is told from ``h`` by how the cost
    grows with the copy (runs of LRU and LRU-K stream 20 and 30 MB per iteration), which
    only prompt-admitting iterations show (their compute is the longer part, so ``min(C,
    X) = X``); a decode step's ``min(C, X)`` is its compute, the same under every policy, so
    a decode factor of its own would trade off against its overhead on noise. Returns the
    evaluated terms (as :class:`Interference` triples) of smallest summed squared relative
    error (after ``rounds`` updates, the last one evaluated too). A kind with no streamed
    iterations keeps overhead 0."""
    if len(targets) != len(sims) or not sims:
        raise ValueError(f"need one target per run, got {len(targets)} and {len(sims)} runs")
    if any(min(t) < 0 for t in targets):
        raise ValueError(f"busy targets must be >= 0, got {list(targets)}")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    s, h = float(start[0]), [float(v) for v in start[1]]
    best: tuple[float, Interference, Interference] | None = None
    for rnd in range(rounds + 1):
        obs = [sim(Interference(s, s, s), Interference(*h)) for sim in sims]
        pairs = list(zip(obs, targets, strict=True))
        sse = sum(
            (o.busy[k] / t[k] - 1.0) ** 2
            for o, t in pairs
            for k in range(3)
            if t[k] > 0 and o.count[k] > 0
        )
        if best is None or sse < best[0]:
            best = (sse, Interference(s, s, s), Interference(*h))
        if rnd == rounds:
            break
        rows = [
            [
                (
                    o.overlap[k],
                    o.count[k],
                    t[k] - o.busy[k] + s * o.overlap[k] + h[k] * o.count[k],
                    1.0 / t[k] ** 2,
                )
                for o, t in pairs
                if t[k] > 0 and o.count[k] > 0
            ]
            for k in range(3)
        ]
        s, h = _fit_linear(rows)
    assert best is not None
    return best[1], best[2]
