"""Copy/compute interference: a streamed layer costs more than "copy overlapped with compute".

On a CPU the engine's prefetch thread (copying a layer host -> device) and its compute thread
share the cores, the memory bus and Python's GIL: on such a machine "host" and "device" memory
are the same DRAM, so the copy and the layer's weight reads compete for one bus. The
simulator's node charges a layer ``max(C, X)`` when a prefetch of ``X`` seconds (bytes /
``links.pcie.bandwidth``) is issued as a layer starts computing for ``C`` seconds
(``hold_pins``, the engine's order: the layer's own missing chunks are fetched and pinned
first, then the next layers' prefetch is planned; the layer ends when compute and prefetch
are both done). The engine measurably takes longer. This
module models the difference with one calibrated factor ``s``
(``fitted.engine_fit[0]["copy_interference"]``; absent or 0 = no interference, so datasheet
GPU profiles and every ordinary scenario are unchanged):

    a layer with compute ``C`` and a copy of ``X`` issued as it starts computing ends after
    ``max(C, X) + s * min(C, X)``  (s = 0: fully parallel; s = 1: the overlapped part
    serialises, ``C + X``; s > 1: contention costs more than taking turns).

The form is symmetric in ``C`` and ``X``: on the 2-core VM the streamed validation runs take
about ``C + bytes / bandwidth`` per iteration whether the copy or the compute is the longer
part, and the fitted ``s`` comes out near 1 for LRU and LRU-K runs alike (an earlier form,
``max(C + s * min(C, X), X)``, could not exceed ``X`` when the copy dominated; with the
prefetch planned before the layer's own demand fetch, the slowed compute also hid that fetch,
and LRU-K's heavier streaming -- 30 MB per iteration against LRU's 20 -- was under-predicted
by ~20%).

:func:`install` applies this to a built cluster's nodes (simulator side, used by
:func:`hwbench.validate.run_simulator`) without touching :mod:`sim.node`: each node's
``_layers`` is wrapped to learn the iteration's compute time and ``_prefetch`` to add one
timeout event, ending at the formula's time, to the events the (held) layer waits for (the
copy's own transfer events still gate it too: a copy queued behind others ends later).
:func:`fit_interference` finds ``s`` by bisection so that the simulator's busy time on probe
streaming runs matches the engine's, after dividing out the compute model's own error measured
on the same runs with every weight resident.

Invariant: with ``s == 0`` (or no prefetch issued) the wrapped node behaves exactly as the
plain node (no event is added).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

__all__ = ["DEFAULT", "KEY", "fit_interference", "install", "interference_of", "layer_time"]

KEY = "copy_interference"
DEFAULT = 0.0  # no interference
S_MAX = 4.0  # the bisection's upper end (4: the overlapped part costs 5x its length)


def layer_time(compute_s: float, copy_s: float, s: float) -> float:
    """Seconds a layer computing ``compute_s`` takes while a copy of ``copy_s`` seconds
    issued at its start is in flight: ``max(C, X) + s * min(C, X)`` (module docstring)."""
    return max(compute_s, copy_s) + s * min(compute_s, copy_s)


def interference_of(profile: Any) -> float:
    """The profile's fitted ``s`` (``fitted.engine_fit[0][KEY]``), ``DEFAULT`` if absent."""
    fit = (profile.fitted.get("engine_fit") or [{}])[0]
    return float(fit.get(KEY, DEFAULT))


def install(cluster: Any, s: float, bandwidth: float, latency: float = 0.0) -> None:
    """Apply interference ``s`` to every node of ``cluster`` (call after ``build``, before
    ``run``); copy time ``X = latency + bytes / bandwidth`` of the bytes a layer's prefetch
    moves. ``s <= 0`` installs nothing."""
    if s <= 0:
        return
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    for node in cluster.ctx.nodes:
        _wrap(node, float(s), float(bandwidth), float(latency))


def _wrap(node: Any, s: float, bandwidth: float, latency: float) -> None:
    orig_layers = node._layers
    orig_prefetch = node._prefetch
    state = {"t_total": 0.0}  # the running iteration's compute time (set by _layers)

    def layers(m: int, t_total: float, nb: int) -> Generator[simpy.Event, Any, None]:
        state["t_total"] = t_total
        return orig_layers(m, t_total, nb)  # type: ignore[no-any-return]

    def prefetch(m: int, layer: int, charge: Callable[[int, int, int], None]) -> list[Any]:
        moved = [0]

        def counted(tier: int, count: int, nbytes: int) -> None:
            moved[0] += nbytes
            charge(tier, count, nbytes)

        issued: list[Any] = orig_prefetch(m, layer, counted)
        if issued and moved[0] > 0:
            c = state["t_total"] * float(node.ctx.models[m].layer_frac[layer])
            x = latency + moved[0] / bandwidth
            issued.append(node.env.timeout(layer_time(c, x, s)))
        return issued

    node._layers = layers
    node._prefetch = prefetch


def fit_interference(
    engine_stream_s: float,
    engine_resident_s: float,
    sim_stream: Callable[[float], float],
    sim_resident_s: float,
    *,
    tol: float = 1e-3,
) -> float:
    """``s`` in ``[0, S_MAX]`` with ``sim_stream(s) * r == engine_stream_s``, where ``r =
    engine_resident_s / sim_resident_s`` is the compute model's own bias on the same
    requests with every weight resident (so ``s`` absorbs only what streaming adds).
    ``sim_stream`` is non-decreasing in ``s``; the bisection stops at width ``tol``; the ends
    are returned when the target is outside the range."""
    if min(engine_stream_s, engine_resident_s, sim_resident_s) <= 0:
        raise ValueError("busy times must be > 0")
    target = engine_stream_s * sim_resident_s / engine_resident_s
    lo, hi = 0.0, S_MAX
    if sim_stream(lo) >= target:
        return 0.0
    if sim_stream(hi) <= target:
        return S_MAX
    while hi - lo > tol:  # invariant: sim_stream(lo) < target < sim_stream(hi)
        mid = 0.5 * (lo + hi)
        if sim_stream(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
