"""libCacheSim's *oracleGeneral* binary traces.

A file is a plain array of packed little-endian 24-byte records::

    u32 time          seconds
    u64 obj_id        object id
    u32 obj_size      bytes
    i64 next_access   virtual time (record index) of the next access to obj_id; -1 = never

A file whose size is not a multiple of 24 is corrupt: the error names the byte offset of the
truncated last record. Records whose time goes backwards, or whose ``next_access`` is below -1,
are reported by their byte offset too. ``INT64_MAX`` in ``next_access`` is also read as never.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from engine.errors import InputError
from engine.traces.trace import IntArray, Trace, dense_ids, first_decrease

RECORD = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
assert RECORD.itemsize == 24  # packed: no padding between fields

_NEVER_MAX = np.iinfo(np.int64).max


def read_oracle(path: str | Path, limit: int | None = None) -> Trace:
    """Read an oracleGeneral file (the first ``limit`` records if given) into a :class:`Trace`."""
    path = Path(path)
    src = str(path)
    nbytes = path.stat().st_size
    whole, rest = divmod(nbytes, RECORD.itemsize)
    if rest and (limit is None or limit > whole):
        raise InputError(
            f"truncated record: {rest} of {RECORD.itemsize} bytes (file size {nbytes} is not a "
            f"multiple of the {RECORD.itemsize}-byte oracleGeneral record: u32 time, u64 id, "
            "u32 size, i64 next access)",
            source=src,
            where=f"byte offset {whole * RECORD.itemsize}",
        )
    count = whole if limit is None else min(limit, whole)
    if count == 0:
        raise InputError("no records (empty file)", source=src)
    rec = np.fromfile(path, dtype=RECORD, count=count)
    time = rec["time"].astype(np.float64)
    bad = first_decrease(time)
    if bad >= 0:
        raise InputError(
            f"time {int(rec['time'][bad])} s is earlier than the previous record's "
            f"{int(rec['time'][bad - 1])} s; records must be in time order",
            source=src,
            where=f"byte offset {bad * RECORD.itemsize} (record {bad})",
        )
    nxt = rec["next"].astype(np.int64)
    nxt[nxt == _NEVER_MAX] = -1
    below = np.flatnonzero(nxt < -1)
    if len(below):
        i = int(below[0])
        raise InputError(
            f"next access {int(nxt[i])} is invalid (expected -1 for never, or a record index)",
            source=src,
            where=f"byte offset {i * RECORD.itemsize} (record {i})",
        )
    return Trace(
        time=time,
        key=dense_ids(rec["id"]),
        size=rec["size"].astype(np.int64),
        source=src,
        next_access=nxt,
        meta={"format": "oracle"},
    )


def next_access_indices(keys: Sequence[int] | npt.NDArray[np.int64]) -> IntArray:
    """For each position, the index of the next access to the same key (``-1`` = never)."""
    arr = np.asarray(keys)
    out = np.full(len(arr), -1, dtype=np.int64)
    seen: dict[int, int] = {}
    for i in range(len(arr) - 1, -1, -1):
        k = int(arr[i])
        out[i] = seen.get(k, -1)
        seen[k] = i
    return out


def write_oracle(
    path: str | Path,
    time: Sequence[int] | npt.NDArray[np.integer],
    obj_id: Sequence[int] | npt.NDArray[np.integer],
    size: Sequence[int] | npt.NDArray[np.integer],
    next_access: Sequence[int] | npt.NDArray[np.integer] | None = None,
) -> None:
    """Write records in the oracleGeneral layout (``next_access`` computed when omitted)."""
    n = len(obj_id)
    rec = np.zeros(n, dtype=RECORD)
    rec["time"] = np.asarray(time, dtype=np.uint32)
    rec["id"] = np.asarray(obj_id, dtype=np.uint64)
    rec["size"] = np.asarray(size, dtype=np.uint32)
    rec["next"] = (
        next_access_indices(np.asarray(obj_id))
        if next_access is None
        else np.asarray(next_access, dtype=np.int64)
    )
    rec.tofile(Path(path))
