"""Trace replay: run eviction policies over cache sizes and tabulate their miss ratios.

:func:`replay` is a pure function (no printing, no files): one fresh
:class:`engine.cache.TierCache` per (policy, cache size), fed every access of the trace with
``now`` = the access's trace time. The caches use ``high_watermark = low_watermark = 1.0`` --
eviction only to make room for an admission, no early watermark eviction -- so the table
compares the policies' choices alone (R30's watermarks are a deployment knob, not a policy).

An access whose size exceeds the whole cache can never be cached: it is counted as a miss
without reaching the cache or its policy (so the offline ``opt`` policy sees exactly the
accesses that reach it). ``opt`` is built with ``future=`` the keys of those accesses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from engine.cache import TierCache
from engine.errors import InputError
from engine.policy import make_policy
from engine.traces.model import Trace

#: columns of the frame :func:`replay` returns, in order
COLUMNS = (
    "policy",
    "cache_bytes",
    "requests",
    "hits",
    "misses",
    "miss_ratio",
    "bytes_requested",
    "bytes_missed",
    "byte_miss_ratio",
    "evictions",
)

#: how many accesses pass between two calls of the progress callback
PROGRESS_EVERY = 65_536

ProgressFn = Callable[[int], None]


def replay(
    trace: Trace,
    policies: Sequence[str],
    sizes: Sequence[int],
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
    progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Replay ``trace`` through every policy at every cache size (bytes).

    Returns one row per (policy, size), policies in the given order and sizes in the given
    order, with the columns :data:`COLUMNS`. ``policy_params[name]`` are keyword arguments for
    :func:`engine.policy.make_policy` (``future`` is supplied for ``opt``).
    ``progress(n)`` is called with the number of accesses just processed, about every
    :data:`PROGRESS_EVERY` accesses; the calls add up to ``len(trace) * len(policies) *
    len(sizes)``.

    Invariant of every row: ``hits + misses == requests == len(trace)``.
    Raises :class:`InputError` for an empty policy or size list, a size < 1 byte, an unknown
    policy or a bad parameter.
    """
    if not policies:
        raise InputError("no policies to replay")
    if not sizes:
        raise InputError("no cache sizes to replay")
    for s in sizes:
        if int(s) < 1:
            raise InputError(f"cache size {s} B is not >= 1 byte")
    params = dict(policy_params or {})
    unknown = sorted(set(params) - set(policies))
    if unknown:
        raise InputError(f"parameters given for policies not replayed: {', '.join(unknown)}")
    keys = trace.key.tolist()
    times = trace.time.tolist()
    sizes_l = trace.size.tolist()
    colors = trace.colors()
    rows: list[dict[str, Any]] = []
    for name in policies:
        for capacity in sizes:
            rows.append(
                _one(
                    name,
                    int(capacity),
                    dict(params.get(name, {})),
                    trace,
                    keys,
                    times,
                    sizes_l,
                    colors,
                    progress,
                )
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _one(
    name: str,
    capacity: int,
    params: dict[str, Any],
    trace: Trace,
    keys: list[int],
    times: list[float],
    sizes: list[int],
    colors: list[str | None] | None,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    """Replay one (policy, capacity) pair and return its result row."""
    n = len(keys)
    fits = trace.size <= capacity
    skipped_n = int(n - fits.sum())
    skipped_bytes = int(trace.size[~fits].sum()) if skipped_n else 0
    if skipped_n:  # accesses that can never be cached bypass the cache (see module doc)
        idx = np.flatnonzero(fits).tolist()
        keys = [keys[i] for i in idx]
        times = [times[i] for i in idx]
        sizes = [sizes[i] for i in idx]
        colors = None if colors is None else [colors[i] for i in idx]
    if name == "opt":
        params = {**params, "future": keys}
    policy = make_policy(name, **params)
    cache = TierCache(
        capacity=capacity,
        policy=policy,
        high_watermark=1.0,
        low_watermark=1.0,
        name=f"{name}@{capacity}B",
    )
    access = cache.access
    m = len(keys)
    step = PROGRESS_EVERY if progress is not None else max(m, 1)  # no callback: one pass
    done = 0
    # The hot loop: bound method, zip over plain lists, one slice of PROGRESS_EVERY at a time.
    while done < m:
        end = min(done + step, m)
        whole = done == 0 and end == m  # skip copying slices when there is only one
        ks = keys if whole else keys[done:end]
        ss = sizes if whole else sizes[done:end]
        ts = times if whole else times[done:end]
        if colors is None:
            for k, s, t in zip(ks, ss, ts, strict=True):
                access(k, s, t)
        else:
            cs = colors if whole else colors[done:end]
            for k, s, t, c in zip(ks, ss, ts, cs, strict=True):
                access(k, s, t, c)
        if progress is not None:
            progress(end - done)
        done = end
    if progress is not None and skipped_n:
        progress(skipped_n)
    st = cache.stats
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
        "miss_ratio": misses / n if n else 0.0,
        "bytes_requested": bytes_req,
        "bytes_missed": bytes_missed,
        "byte_miss_ratio": bytes_missed / bytes_req if bytes_req else 0.0,
        "evictions": st.evictions,
    }
