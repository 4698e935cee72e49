"""Mooncake-style JSONL request traces, expanded into KV-block accesses.

One JSON object per line (Mooncake FAST'25 trace release and traces of the same schema)::

    {"timestamp": 277, "input_length": 32140, "output_length": 92, "hash_ids": [198, 199, ...]}

* ``timestamp`` -- arrival in **milliseconds** (number >= 0, non-decreasing down the file);
* ``hash_ids`` -- list of ints: the request's prompt as prefix-hashed KV blocks of
  ``block_tokens`` tokens each (equal ids = the same reusable prefix block);
* ``input_length`` / ``output_length`` -- tokens; optional here, but whole numbers >= 0 when
  present. Other keys are ignored. Blank lines are skipped.

Each request becomes one access per hash id, in list order, all at ``time = timestamp / 1000``
seconds. Every access has the size of one *full* KV block (a paged KV cache allocates whole
blocks, so the partial last block of a prompt costs a full one)::

    size = block_tokens * kv_bytes_per_token          (or 1 with unit=True: count blocks)

:data:`DEFAULT_KV_BYTES_PER_TOKEN` is a LLaMA-2-7B-like decoder in fp16:
``2 (K and V) * 32 layers * 32 KV heads * 128 head_dim * 2 bytes = 524,288 B/token``, so a
512-token block is 256 MiB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.limits import MAX_TOKENS, show
from engine.traces.trace import Trace, dense_ids

#: K and V, 32 layers, 32 KV heads, head_dim 128, 2 bytes (fp16): LLaMA-2-7B.
DEFAULT_KV_BYTES_PER_TOKEN = 2 * 32 * 32 * 128 * 2
DEFAULT_BLOCK_TOKENS = 512

#: the latest timestamp accepted, ms (1e12 ms: about 31 years, the longest duration)
MAX_TIMESTAMP_MS = 1e12

_EXPECT = (
    'expected one JSON object a line like {"timestamp": <ms>, "input_length": <tokens>, '
    '"output_length": <tokens>, "hash_ids": [<int>, ...]}'
)


def read_mooncake(
    path: str | Path,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
    unit: bool = False,
    limit: int | None = None,
) -> Trace:
    """Read and expand a Mooncake JSONL trace (at most ``limit`` accesses if given).

    Raises :class:`InputError` naming the file and 1-based line of the first bad record, or a
    bad ``block_tokens`` / ``kv_bytes_per_token`` (both must be >= 1).
    """
    path = Path(path)
    src = str(path)
    if block_tokens < 1:
        raise InputError(f"block_tokens must be >= 1, got {block_tokens}", source=src)
    if kv_bytes_per_token < 1:
        raise InputError(f"kv_bytes_per_token must be >= 1, got {kv_bytes_per_token}", source=src)
    times: list[float] = []
    counts: list[int] = []
    ids: list[int] = []
    prev = -math.inf
    with path.open(encoding="utf-8", errors="strict") as fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                t, hids = _record(line, src, lineno)
                if t < prev:
                    raise InputError(
                        f"timestamp {t * 1000:g} ms is earlier than the previous request's "
                        f"{prev * 1000:g} ms; requests must be in time order",
                        source=src,
                        where=f"line {lineno}",
                    )
                prev = t
                times.append(t)
                counts.append(len(hids))
                ids.extend(hids)
                if limit is not None and len(ids) >= limit:
                    break
        except UnicodeDecodeError as err:
            raise InputError(
                f"not UTF-8 text; {_EXPECT}", source=src, where=f"after line {lineno}"
            ) from err
    if not ids:
        raise InputError(f"no KV-block accesses (no request with hash_ids); {_EXPECT}", source=src)
    n = len(ids) if limit is None else min(limit, len(ids))
    time = np.repeat(np.asarray(times, dtype=np.float64), counts)[:n]
    size = 1 if unit else block_tokens * kv_bytes_per_token
    return Trace(
        time=time,
        key=dense_ids(np.asarray(ids[:n], dtype=np.int64)),
        size=np.full(n, size, dtype=np.int64),
        source=src,
        meta={
            "format": "mooncake",
            "requests": len(times),
            "block_tokens": block_tokens,
            "kv_bytes_per_token": kv_bytes_per_token,
            "unit": unit,
        },
    )


def _record(line: str, src: str, lineno: int) -> tuple[float, list[int]]:
    """Validate one line; return ``(time in seconds, hash ids)``."""
    where = f"line {lineno}"
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON ({err.msg}); {_EXPECT}", source=src, where=where) from err
    except RecursionError:  # json's decoder recurses once per nested array/object
        raise InputError(f"JSON nested too deeply; {_EXPECT}", source=src, where=where) from None
    except ValueError:  # Python's limit on the digits of an int converted from text
        raise InputError(
            f"an integer of more than 4300 digits; {_EXPECT}", source=src, where=where
        ) from None
    if not isinstance(obj, dict):
        raise InputError(f"not a JSON object; {_EXPECT}", source=src, where=where)
    for field in ("timestamp", "hash_ids"):
        if field not in obj:
            raise InputError(f"missing field {field!r}; {_EXPECT}", source=src, where=where)
    ts = obj["timestamp"]
    if not _is_number(ts) or not 0 <= ts <= MAX_TIMESTAMP_MS:
        raise InputError(
            f"timestamp {show(ts)} is not a number of milliseconds in [0, 1e12]",
            source=src,
            where=where,
        )
    hids = obj["hash_ids"]
    if not isinstance(hids, list) or not all(_is_id(h) for h in hids):
        raise InputError(
            f"hash_ids {_short(hids)} is not a list of integers", source=src, where=where
        )
    for field in ("input_length", "output_length"):
        v = obj.get(field, 0)
        if not _is_int(v) or not 0 <= v <= MAX_TOKENS:
            raise InputError(
                f"{field} {show(v)} is not a whole number of tokens in [0, {MAX_TOKENS:.0e}]",
                source=src,
                where=where,
            )
    return float(ts) / 1000.0, hids


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_id(v: object) -> bool:
    return _is_int(v) and -(2**63) <= v < 2**63  # type: ignore[operator]


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
