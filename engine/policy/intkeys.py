"""Batches of keys that are plain non-negative ints (trace keys), for policies whose state
is indexed by key.

Trace readers number objects densely (``0..n_objects-1``, :mod:`engine.traces.trace`), so a
policy can keep per-key state in flat arrays indexed by the key itself;
:func:`int_key_range` tells whether a batch qualifies and hands it back in a form whose
iteration yields Python ``int`` objects (list indices must not be numpy scalars).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

#: memoryview formats of integer items (iterating such a view yields Python ints)
_INT_FORMATS = frozenset("bBhHiIlLqQnN")


def int_key_range(keys: Iterable[Any]) -> tuple[Sequence[int], int, int] | None:
    """``(seq, lo, hi)`` when every key is a plain ``int`` (or ``keys`` is a 1-D memoryview
    or array of an integer type): ``seq`` iterates the same keys as Python ints, ``lo`` and
    ``hi`` are the smallest and largest (``0, -1`` when empty). ``None`` otherwise (any
    other type, bools included). O(n) in C; a memoryview of a native integer format is
    handed back as is."""
    seq: Any = keys
    if isinstance(seq, np.ndarray | memoryview):
        arr = np.asarray(seq)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            return None
        if isinstance(seq, np.ndarray) or seq.format not in _INT_FORMATS:
            seq = np.ascontiguousarray(arr, dtype=np.int64).data
        if not len(arr):
            return seq, 0, -1
        return seq, int(arr.min()), int(arr.max())
    if not isinstance(seq, Sequence):
        seq = list(seq)
    if not seq:
        return seq, 0, -1
    if set(map(type, seq)) != {int}:
        return None
    return seq, min(seq), max(seq)
