"""One entry point for every trace format: :func:`read_trace` with ``format="auto"``.

Detection order for ``auto``: the file extension (``.csv``; ``.jsonl``/``.json``;
``.bin``/``.oracleGeneral``), then the content: text starting with ``{`` is Mooncake JSONL,
other UTF-8 text is CSV, anything else is oracleGeneral binary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from engine.errors import InputError
from engine.traces.csv_reader import read_csv
from engine.traces.mooncake import DEFAULT_BLOCK_TOKENS, DEFAULT_KV_BYTES_PER_TOKEN, read_mooncake
from engine.traces.oracle import read_oracle
from engine.traces.trace import Trace

TraceFormat = Literal["auto", "csv", "oracle", "mooncake"]
FORMATS: tuple[str, ...] = get_args(TraceFormat)

_BY_SUFFIX = {
    ".csv": "csv",
    ".jsonl": "mooncake",
    ".json": "mooncake",
    ".bin": "oracle",
    ".oraclegeneral": "oracle",
}
_COMPRESSED = (".zst", ".gz", ".bz2", ".xz", ".lz4")


def detect_format(path: str | Path) -> str:
    """The concrete format of ``path`` (``csv``, ``oracle`` or ``mooncake``)."""
    path = Path(path)
    if path.suffix.lower() in _COMPRESSED:
        raise InputError(
            f"compressed traces ({path.suffix}) are not read directly; decompress first "
            "(e.g. zstd -d / gunzip)",
            source=str(path),
        )
    fmt = _BY_SUFFIX.get(path.suffix.lower())
    if fmt is not None:
        return fmt
    with path.open("rb") as fh:
        head = fh.read(4096)
    if not head:
        raise InputError("empty file: cannot tell its trace format", source=str(path))
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not just a multi-byte character cut at the end
            return "oracle"
        text = head[: err.start].decode("utf-8")
    if "\x00" in text:
        return "oracle"
    return "mooncake" if text.lstrip().startswith("{") else "csv"


def read_trace(
    path: str | Path,
    format: str = "auto",
    *,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
    unit: bool = False,
    limit: int | None = None,
) -> Trace:
    """Read ``path`` as ``format`` (see :data:`FORMATS`); the first ``limit`` accesses if given.

    ``block_tokens`` and ``kv_bytes_per_token`` only matter for Mooncake traces (see
    :mod:`engine.traces.mooncake`); ``unit=True`` gives every access size 1 in every format
    (cache sizes then count objects; ``meta["unit"]`` is set). Raises :class:`InputError` for a missing file, an unknown
    format or a bad record.
    """
    path = Path(path)
    if format not in FORMATS:
        raise InputError(f"unknown trace format {format!r}; allowed: {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise InputError(f"limit must be >= 1 access, got {limit}")
    if not path.is_file():
        raise InputError("no such file", source=str(path))
    fmt = detect_format(path) if format == "auto" else format
    if fmt == "csv":
        trace = read_csv(path)
    elif fmt == "oracle":
        trace = read_oracle(path, limit=limit)
    else:
        trace = read_mooncake(
            path,
            block_tokens=block_tokens,
            kv_bytes_per_token=kv_bytes_per_token,
            unit=unit,
            limit=limit,
        )
    if limit is not None:
        trace = trace.head(limit)
    return trace.unit_sized() if unit and fmt != "mooncake" else trace
