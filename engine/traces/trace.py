"""The in-memory trace: one access per row, in time order, as parallel numpy arrays.

Every reader (:mod:`engine.traces.csv_reader`, :mod:`engine.traces.oracle`,
:mod:`engine.traces.mooncake`) returns a :class:`Trace`; :func:`engine.missratio.replay` consumes
one. Keys are dense ``int64`` ids ``0..n_objects-1`` numbered in first-seen order, so the same
file always gives the same ids and dict lookups in the replay loop stay cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: colour code of an access without a colour
NO_COLOR = -1


@dataclass(frozen=True)
class Trace:
    """A sequence of cache accesses.

    ``time``
        float64 seconds, non-decreasing (the ``now`` handed to the policies).
    ``key``
        int64 object ids (dense, first-seen order when a reader built them).
    ``size``
        int64 object sizes in bytes (>= 0).
    ``color``
        optional int32 colour codes (``NO_COLOR`` = none), indexing ``color_names``.
    ``next_access``
        optional int64 index of the next access to the same key (``-1`` = never), as stored in
        oracleGeneral files; informational, replay does not rely on it.
    ``source``
        where the trace came from (a path), for messages and output metadata.

    Invariant (checked on construction): all arrays are one-dimensional and equally long.
    """

    time: FloatArray
    key: IntArray
    size: IntArray
    source: str = "<memory>"
    color: npt.NDArray[np.int32] | None = None
    color_names: tuple[str, ...] = ()
    next_access: IntArray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.key)
        arrays: dict[str, npt.NDArray[Any]] = {"time": self.time, "size": self.size}
        if self.color is not None:
            arrays["color"] = self.color
        if self.next_access is not None:
            arrays["next_access"] = self.next_access
        for name, arr in arrays.items():
            if arr.ndim != 1 or len(arr) != n:
                raise ValueError(f"trace {self.source}: {name} has shape {arr.shape}, want ({n},)")

    def __len__(self) -> int:
        return len(self.key)

    @property
    def n_objects(self) -> int:
        """Number of distinct keys."""
        return len(np.unique(self.key))

    def unique_bytes(self) -> int:
        """Sum over distinct keys of the size at each key's first access (the working set)."""
        if len(self.key) == 0:
            return 0
        _, first = np.unique(self.key, return_index=True)
        return int(self.size[first].sum())

    def colors(self) -> list[str | None] | None:
        """Per-access colour names (``None`` where uncoloured), or ``None`` if no colours."""
        if self.color is None:
            return None
        names: list[str | None] = [*self.color_names, None]  # code -1 picks the last: None
        return [names[c] for c in self.color.tolist()]

    def unit_sized(self) -> Trace:
        """The same accesses with every size 1 (cache sizes then count objects)."""
        return Trace(
            time=self.time,
            key=self.key,
            size=np.ones(len(self.key), dtype=np.int64),
            source=self.source,
            color=self.color,
            color_names=self.color_names,
            next_access=self.next_access,
            meta={**self.meta, "unit": True},
        )

    def head(self, n: int) -> Trace:
        """The first ``n`` accesses (all of them if ``n >= len(self)``)."""
        if n >= len(self):
            return self
        return Trace(
            time=self.time[:n],
            key=self.key[:n],
            size=self.size[:n],
            source=self.source,
            color=None if self.color is None else self.color[:n],
            color_names=self.color_names,
            next_access=None if self.next_access is None else self.next_access[:n],
            meta=dict(self.meta),
        )


def dense_ids(raw: npt.NDArray[Any] | Sequence[Any]) -> IntArray:
    """Renumber ``raw`` keys as ``0, 1, 2, ...`` in order of first appearance.

    Works for integer arrays (vectorised) and for any sequence of hashable values.
    """
    arr = np.asarray(raw)
    if arr.dtype.kind in "iu":
        if len(arr) == 0:
            return np.zeros(0, dtype=np.int64)
        uniq, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
        # rank[j] = position of unique value j in first-seen order
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[order] = np.arange(len(uniq), dtype=np.int64)
        return rank[inverse.reshape(-1)]
    ids: dict[Any, int] = {}
    out = np.empty(len(arr), dtype=np.int64)
    for i, k in enumerate(arr.tolist()):
        out[i] = ids.setdefault(k, len(ids))
    return out


def first_decrease(time: FloatArray) -> int:
    """Index of the first access whose time is smaller than its predecessor's, or ``-1``."""
    if len(time) < 2:
        return -1
    bad = np.flatnonzero(np.diff(time) < 0)
    return int(bad[0]) + 1 if len(bad) else -1
