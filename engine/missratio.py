"""Trace replay: run eviction policies over cache sizes and tabulate their miss ratios.

:func:`replay` is a pure function (no printing, no files): one fresh
:class:`engine.cache.TierCache` per (policy, cache size), fed every access of the trace through
:meth:`engine.cache.TierCache.access_many` (its tight loop: the same policy objects, none of
the per-access bookkeeping for pins, colours and watermarks a replay does not use). The caches
use ``high_watermark = low_watermark = 1.0`` -- eviction only to make room for an admission,
no early watermark eviction -- so the table compares the policies' choices alone (R30's
watermarks are a deployment knob, not a policy).

The clock (``now`` handed to the policies) is the access's trace time in seconds
(``clock="time"``) or its 0-based position in the trace (``clock="references"``, the clock of
the LRU-K paper: times never tie). Time-based policy parameters (LRU-K's CRP and RIP, the
priority policy's staleness unit) are in the clock's units.

An access whose size exceeds the whole cache can never be cached: it is counted as a miss
without reaching the cache or its policy (so the offline ``opt`` policy sees exactly the
accesses that reach it). ``opt`` is built with ``future=`` the keys of those accesses.
The trace's arrays are turned into Python lists one batch of :data:`PROGRESS_EVERY` accesses
at a time, so memory beyond the trace itself stays bounded (except for ``opt``'s future).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from engine.cache import TierCache
from engine.errors import InputError
from engine.policy import make_policy
from engine.traces.trace import Trace

#: the clocks :func:`replay` accepts
CLOCKS = ("time", "references")

#: columns of the frame :func:`replay` returns, in order
COLUMNS = (
    "policy",
    "cache_bytes",
    "requests",
    "hits",
    "misses",
    "hit_ratio",
    "miss_ratio",
    "bytes_requested",
    "bytes_missed",
    "byte_miss_ratio",
    "evictions",
    "too_large_objects",
    "too_large_accesses",
)

#: how many accesses pass between two calls of the progress callback (and batch size)
PROGRESS_EVERY = 65_536

ProgressFn = Callable[[int], None]


def replay(
    trace: Trace,
    policies: Sequence[str],
    sizes: Sequence[int],
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
    progress: ProgressFn | None = None,
    clock: str = "time",
) -> pd.DataFrame:
    """Replay ``trace`` through every policy at every cache size (bytes).

    Returns one row per (policy, size), policies in the given order and sizes in the given
    order, with the columns :data:`COLUMNS`. ``policy_params[name]`` are keyword arguments for
    :func:`engine.policy.make_policy` (``future`` is supplied for ``opt``). ``clock`` is one of
    :data:`CLOCKS` (see the module docstring). ``progress(n)`` is called with the number of
    accesses just processed, about every :data:`PROGRESS_EVERY` accesses; the calls add up to
    ``len(trace) * len(policies) * len(sizes)``.

    Invariants of every row: ``hits + misses == requests == len(trace)``;
    ``too_large_accesses`` (of ``too_large_objects`` distinct keys) larger than the cache are
    among the misses.
    Raises :class:`InputError` for an empty policy or size list, a size < 1 byte, an unknown
    clock, policy or parameter.
    """
    if not policies:
        raise InputError("no policies to replay")
    if not sizes:
        raise InputError("no cache sizes to replay")
    if clock not in CLOCKS:
        raise InputError(f"unknown clock {clock!r}; allowed: {', '.join(CLOCKS)}")
    for s in sizes:
        if int(s) < 1:
            raise InputError(f"cache size {s} B is not >= 1 byte")
    params = dict(policy_params or {})
    unknown = sorted(set(params) - set(policies))
    if unknown:
        raise InputError(f"parameters given for policies not replayed: {', '.join(unknown)}")
    fixed = fixed_sizes(trace)
    rows: list[dict[str, Any]] = []
    for name in policies:
        for capacity in sizes:
            rows.append(
                _one(name, int(capacity), dict(params.get(name, {})), trace, clock, fixed, progress)
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def fixed_sizes(trace: Trace) -> bool:
    """Whether every key has one size throughout ``trace`` (vectorised, O(n log n))."""
    if len(trace) < 2 or trace.size.min() == trace.size.max():
        return True
    order = np.argsort(trace.key, kind="stable")
    keys = trace.key[order]
    sizes = trace.size[order]
    return not bool(np.any((keys[1:] == keys[:-1]) & (sizes[1:] != sizes[:-1])))


def _one(
    name: str,
    capacity: int,
    params: dict[str, Any],
    trace: Trace,
    clock: str,
    fixed: bool,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    """Replay one (policy, capacity) pair and return its result row."""
    n = len(trace)
    fits = trace.size <= capacity
    skipped_n = int(n - fits.sum())
    skipped_bytes = int(trace.size[~fits].sum()) if skipped_n else 0
    skipped_objects = len(np.unique(trace.key[~fits])) if skipped_n else 0
    # Accesses that can never be cached bypass the cache (see the module docstring).
    idx = np.flatnonzero(fits) if skipped_n else None
    if name == "opt":
        future = trace.key if idx is None else trace.key[idx]
        params = {**params, "future": future.tolist()}
    policy = make_policy(name, **params)
    cache = TierCache(
        capacity=capacity,
        policy=policy,
        high_watermark=1.0,
        low_watermark=1.0,
        name=f"{name}@{capacity}B",
    )
    names: list[str | None] | None = None
    if trace.color is not None:
        names = [*trace.color_names, None]  # code NO_COLOR (-1) picks the last: None
    m = n - skipped_n
    # One size for every access (unit sizes, block traces): build the batch lists by repetition.
    uniform = int(trace.size[0]) if n and fixed and trace.size.min() == trace.size.max() else None
    # The loop makes no reference cycles; the cyclic collector only re-scans the histories
    # policies keep (up to one per key seen), so it is paused while the loop runs, and the
    # cache (with those histories) is freed before it runs again.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        _batches(cache, trace, idx, m, uniform, clock, names, fixed, progress)
        st = cache.stats
        del cache, policy
    finally:
        if was_enabled:
            gc.enable()
    if progress is not None and skipped_n:
        progress(skipped_n)
    hits = st.hits
    misses = st.misses + skipped_n
    bytes_missed = st.bytes_missed + skipped_bytes
    bytes_req = st.bytes_hit + bytes_missed
    return {
        "policy": name,
        "cache_bytes": capacity,
        "requests": n,
        "hits": hits,
        "misses": misses,
        "hit_ratio": hits / n if n else 0.0,
        "miss_ratio": misses / n if n else 0.0,
        "bytes_requested": bytes_req,
        "bytes_missed": bytes_missed,
        "byte_miss_ratio": bytes_missed / bytes_req if bytes_req else 0.0,
        "evictions": st.evictions,
        "too_large_objects": skipped_objects,
        "too_large_accesses": skipped_n,
    }


def _batches(
    cache: TierCache,
    trace: Trace,
    idx: np.ndarray | None,
    m: int,
    uniform: int | None,
    clock: str,
    names: list[str | None] | None,
    fixed: bool,
    progress: ProgressFn | None,
) -> None:
    """Feed the ``m`` accesses that fit (``idx``, or all) to ``cache`` in batches."""
    for start in range(0, m, PROGRESS_EVERY):
        end = min(start + PROGRESS_EVERY, m)
        sel: slice | np.ndarray = slice(start, end) if idx is None else idx[start:end]
        # Memoryviews over the arrays yield Python numbers one at a time while the loop runs
        # (about 3x cheaper than building lists with tolist()).
        keys = _view(trace.key[sel])
        sizes: Sequence[int] = (
            [uniform] * (end - start) if uniform is not None else _view(trace.size[sel])
        )
        times: Sequence[float]
        if clock == "references":
            times = range(start, end) if idx is None else _view(idx[start:end])
        else:
            times = _view(trace.time[sel])
        colors = None
        if names is not None and trace.color is not None:
            colors = [names[c] for c in trace.color[sel].tolist()]
        cache.access_many(keys, sizes, times, colors, fixed_sizes=fixed)
        if progress is not None:
            progress(end - start)


def _view(arr: np.ndarray) -> memoryview:
    """A memoryview of ``arr`` (made contiguous): indexing and iterating give Python numbers."""
    return np.ascontiguousarray(arr).data
