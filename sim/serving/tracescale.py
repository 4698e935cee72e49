"""Time compression and rate scaling of a replayed request trace.

A trace workload replays arrivals ``a_i`` (seconds after the first record) at ``a_i x s``:
``s`` is ``workload.trace_time_scale``, or -- with ``workload.trace_peak_rate`` set -- the
scale that makes the trace's busiest window reach that rate::

    s = peak_rate(a, W) / trace_peak_rate           W = workload.trace_peak_window

:func:`peak_rate` is the most arrivals in any window ``[a_i, a_i + W)`` of the trace's own
clock, divided by ``W``. Scaling time by ``s`` maps that window onto ``[s a_i, s a_i + s W)``
holding the same requests, so the replay's busiest window of ``s W`` seconds averages
``peak_rate(a, W) / s = trace_peak_rate`` exactly (every inter-arrival time is multiplied by
``s``; the token counts and the order stay).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.sections import WorkloadCfg

__all__ = ["peak_rate", "time_scale"]


def peak_rate(arrival: npt.NDArray[np.float64], window: float) -> float:
    """Most arrivals in a window ``[t, t + window)`` over all ``t``, per second of ``window``;
    ``arrival`` sorted (the busiest window starts at an arrival)."""
    if arrival.size == 0:
        return 0.0
    ends = np.searchsorted(arrival, arrival + window, side="left")
    return float(np.max(ends - np.arange(arrival.size))) / window


def time_scale(cfg: WorkloadCfg, arrival: npt.NDArray[np.float64]) -> float:
    """The factor a trace workload multiplies ``arrival`` (sorted, seconds) by: see the module
    docstring."""
    if cfg.trace_peak_rate is None:
        return cfg.trace_time_scale
    return peak_rate(arrival, cfg.trace_peak_window) / cfg.trace_peak_rate
