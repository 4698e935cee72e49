"""Copy/compute interference: a streamed layer costs more than "copy overlapped with compute".

On a CPU the engine's prefetch thread (copying a layer host -> device) and its compute thread
share the cores, the memory bus and Python's GIL: on such a machine "host" and "device" memory
are the same DRAM, so the copy and the layer's weight reads compete for one bus. The
simulator's node charges a layer ``max(C, X)`` when a prefetch of ``X`` seconds (bytes /
``links.pcie.bandwidth``) is issued as a layer starts computing for ``C`` seconds
(``hold_pins``, the engine's order: the layer's own missing chunks are fetched and pinned
first, then the next layers' prefetch is planned; the layer ends when compute and prefetch
are both done). The engine measurably takes longer. This
module models the difference with calibrated factors ``s``, one for decode-only iterations
(``fitted.engine_fit[0]["copy_interference"]``) and one for iterations that admit prompts
(``"copy_interference_prefill"``; absent = the decode one); absent or 0 = no interference, so
datasheet GPU profiles and every ordinary scenario are unchanged:

    a layer with compute ``C`` and a copy of ``X`` issued as it starts computing ends after
    ``max(C, X) + s * min(C, X)``  (s = 0: fully parallel; s = 1: the overlapped part
    serialises, ``C + X``; s > 1: contention costs more than taking turns).

The form is symmetric in ``C`` and ``X``: on the 2-core VM the streamed validation runs take
about ``C + bytes / bandwidth`` per iteration whether the copy or the compute is the longer
part (an earlier form, ``max(C + s * min(C, X), X)``, could not exceed ``X`` when the copy
dominated; with the prefetch planned before the layer's own demand fetch, the slowed compute
also hid that fetch, and LRU-K's heavier streaming -- 30 MB per iteration against LRU's 20 --
was under-predicted by ~20%).

Why two factors: the engine's per-layer timings on that VM show a batch-1 decode layer
(C ~0.35 ms, X ~0.35 ms) taking ~0.69 ms, s ~1.0 (copy and compute take turns), but a prefill
layer taking ~0.5 ms more than its resident compute, s ~1.4 on X (the prefill's large
matmuls and the copy fight over the memory bus). One factor fitted to whole runs lands in
between and over-charges light load, whose iterations are mostly batch-1 decodes, by ~10%.

:func:`install` applies this to a built cluster's nodes (simulator side, used by
:func:`hwbench.validate.run_simulator`) without touching :mod:`sim.node`'s logic: each node's
``_layers`` is wrapped to learn the iteration's compute time and kind (``node.admitted``) and
``_prefetch`` to add one timeout event, ending at the formula's time, to the events the
(held) layer waits for (the copy's own transfer events still gate it too: a copy queued
behind others ends later). Given a :class:`KindBusy`, the wrapper also adds each streamed
iteration's seconds to it by kind. :func:`fit_pair` finds both factors so that the
simulator's busy seconds per kind on probe streaming runs match the engine's
(:func:`hwbench.engine_probe.fit_stream`).

Invariant: with both factors 0 (or no prefetch issued) the wrapped node behaves exactly as
the plain node (no event is added); without a :class:`KindBusy` and with both factors 0
nothing is wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import simpy

__all__ = [
    "DEFAULT",
    "KEY",
    "KEY_PREFILL",
    "Interference",
    "KindBusy",
    "fit_pair",
    "install",
    "interference_of",
    "layer_time",
]

KEY = "copy_interference"  # decode-only iterations (every iteration if KEY_PREFILL is absent)
KEY_PREFILL = "copy_interference_prefill"  # iterations that admit prompts
DEFAULT = 0.0  # no interference
S_MAX = 4.0  # the factors' upper end (4: the overlapped part costs 5x its length)


class Interference(NamedTuple):
    """The factors ``s`` of decode-only iterations and of iterations that admit prompts."""

    decode: float
    prefill: float

    @classmethod
    def of(cls, s: float | tuple[float, float]) -> Interference:
        """``s`` as a pair: a single number serves both kinds."""
        if isinstance(s, tuple):
            return cls(float(s[0]), float(s[1]))
        return cls(float(s), float(s))


@dataclass
class KindBusy:
    """Seconds the simulator's nodes spent on streamed iterations, by kind (summed over
    nodes; iterations with every weight resident do not pass the hook and are not counted)."""

    decode: float = 0.0
    prefill: float = 0.0


def layer_time(compute_s: float, copy_s: float, s: float) -> float:
    """Seconds a layer computing ``compute_s`` takes while a copy of ``copy_s`` seconds
    issued at its start is in flight: ``max(C, X) + s * min(C, X)`` (module docstring)."""
    return max(compute_s, copy_s) + s * min(compute_s, copy_s)


def interference_of(profile: Any) -> Interference:
    """The profile's fitted factors (``fitted.engine_fit[0]``: ``KEY`` for decode-only
    iterations, ``KEY_PREFILL`` for the others, defaulting to ``KEY``); ``DEFAULT`` for both
    when absent."""
    fit = (profile.fitted.get("engine_fit") or [{}])[0]
    decode = float(fit.get(KEY, DEFAULT))
    return Interference(decode, float(fit.get(KEY_PREFILL, decode)))


def install(
    cluster: Any,
    s: float | tuple[float, float],
    bandwidth: float,
    latency: float = 0.0,
    busy: KindBusy | None = None,
) -> None:
    """Apply the factors ``s`` (one number: both kinds) to every node of ``cluster`` (call
    after ``build``, before ``run``); copy time ``X = latency + bytes / bandwidth`` of the
    bytes a layer's prefetch moves. ``busy``: also add each streamed iteration's seconds to it
    by kind. Factors ``<= 0`` without ``busy`` install nothing."""
    pair = Interference.of(s)
    if max(pair) <= 0 and busy is None:
        return
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    if min(pair) < 0:
        raise ValueError(f"interference factors must be >= 0, got {pair}")
    for node in cluster.ctx.nodes:
        _wrap(node, pair, float(bandwidth), float(latency), busy)


def _wrap(
    node: Any, pair: Interference, bandwidth: float, latency: float, busy: KindBusy | None
) -> None:
    orig_layers = node._layers
    orig_prefetch = node._prefetch
    # the running iteration's compute time and factor (set by _layers before any prefetch)
    state = {"t_total": 0.0, "s": 0.0}

    def layers(m: int, t_total: float, nb: int) -> Generator[simpy.Event, Any, None]:
        prefill = node.admitted > 0
        state["t_total"] = t_total
        state["s"] = pair.prefill if prefill else pair.decode
        t0 = node.env.now
        yield from orig_layers(m, t_total, nb)
        if busy is not None:
            if prefill:
                busy.prefill += node.env.now - t0
            else:
                busy.decode += node.env.now - t0

    def prefetch(m: int, layer: int, charge: Callable[[int, int, int], None]) -> list[Any]:
        moved = [0]

        def counted(tier: int, count: int, nbytes: int) -> None:
            moved[0] += nbytes
            charge(tier, count, nbytes)

        issued: list[Any] = orig_prefetch(m, layer, counted)
        if issued and moved[0] > 0 and state["s"] > 0:
            c = state["t_total"] * float(node.ctx.models[m].layer_frac[layer])
            x = latency + moved[0] / bandwidth
            issued.append(node.env.timeout(layer_time(c, x, state["s"])))
        return issued

    node._layers = layers
    node._prefetch = prefetch


def fit_pair(
    target: tuple[float, float],
    sim: Callable[[Interference], tuple[float, float]],
    *,
    start: tuple[float, float] = (1.0, 1.0),
    rtol: float = 0.005,
    max_evals: int = 8,
) -> Interference:
    """Factors in ``[0, S_MAX]`` with ``sim(s) ~ target``, where ``sim`` returns the
    simulator's (decode, prefill) busy seconds and each is non-decreasing in its own factor
    (and moves little with the other: a prefill's factor changes the decodes' batches only
    through timing).

    Per kind, secant steps on the last two evaluations that differ in that factor (a fixed
    +-0.5 step when there are none or their slope is not positive), clipped to the range; it
    stops when every kind is within ``rtol`` of its target, no factor moves, or after
    ``max_evals`` calls of ``sim``, and returns the evaluated pair of smallest worst relative
    error. A kind whose target is 0 (no such iterations) keeps ``start``'s factor."""
    if min(target) < 0:
        raise ValueError(f"busy targets must be >= 0, got {target}")
    if max_evals < 1:
        raise ValueError(f"max_evals must be >= 1, got {max_evals}")
    active = [t > 0 for t in target]
    cur = [min(max(float(v), 0.0), S_MAX) for v in start]
    hist: list[tuple[list[float], tuple[float, float]]] = []

    def worst(f: tuple[float, float]) -> float:
        return max(abs(f[i] / target[i] - 1.0) if active[i] else 0.0 for i in range(2))

    for _ in range(max_evals):
        f = sim(Interference(cur[0], cur[1]))
        hist.append((list(cur), f))
        if worst(f) <= rtol:
            break
        nxt = list(cur)
        for i in range(2):
            if not active[i] or abs(f[i] / target[i] - 1.0) <= rtol:
                continue
            prev = next((h for h in reversed(hist[:-1]) if h[0][i] != cur[i]), None)
            slope = (f[i] - prev[1][i]) / (cur[i] - prev[0][i]) if prev else 0.0
            # a secant step; with no usable slope yet (or noise) a fixed step towards the target
            fixed = 0.5 if f[i] < target[i] else -0.5
            step = (target[i] - f[i]) / slope if slope > 0 else fixed
            nxt[i] = min(max(cur[i] + step, 0.0), S_MAX)
        if nxt == cur:  # pinned at a range end
            break
        cur = nxt
    best = min(hist, key=lambda h: worst(h[1]))[0]
    return Interference(best[0], best[1])
