"""The Azure LLM inference trace format: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

The Azure public LLM inference traces (Azure/AzurePublicDataset; Patel et al., "Splitwise",
ISCA 2024; CC-BY 4.0) have one request a line after a header naming the three columns (any
order, any case; a leading UTF-8 byte-order mark is skipped)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

* ``TIMESTAMP`` -- a date and time ``YYYY-MM-DD HH:MM:SS[.fraction]`` (``T`` may separate
  them; up to 9 fraction digits, the 2023 trace has 7: 100 ns; an optional ``Z`` or ``+HH:MM``
  offset), non-decreasing down the file;
* ``ContextTokens`` / ``GeneratedTokens`` -- prompt and output tokens, whole numbers
  ``0..MAX_TOKENS``.

Times are read as integer nanoseconds and returned as seconds after the first record, so the
100 ns resolution survives the conversion to float (an absolute epoch time in float64 would
round it to about 240 ns). Blank lines are skipped. A bad record -- a wrong field count, a
field longer than the :mod:`csv` module's limit, a time that is not a date and time or is
earlier than the previous one, a token count that is negative, fractional, ``NaN`` or out of
range, whatever its length -- is an :class:`~engine.errors.InputError` naming the file, the
line and the field.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt

from engine.errors import InputError
from engine.limits import MAX_TOKENS, show
from sim.serving.traceformat import AZURE_COLUMNS, check_request

__all__ = ["read_azure_csv"]

_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|[+-]\d{2}:?\d{2})?"
)
_DIGITS = re.compile(r"[0-9]+")
_NAMES = {
    "timestamp": "TIMESTAMP",
    "contexttokens": "ContextTokens",
    "generatedtokens": "GeneratedTokens",
}
_EXPECT = "expected `TIMESTAMP,ContextTokens,GeneratedTokens` (a date and time, two token counts)"
_EPOCH = dt.date(1970, 1, 1).toordinal()
_NS = 1_000_000_000


def read_azure_csv(
    path: Path, limit: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """(arrival s after the first record, input tokens, output tokens) of the first ``limit``
    records of an Azure-format trace; see the module docstring for the format and errors."""
    src = str(path)
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    cols: dict[str, int] | None = None
    first_ns = 0
    prev_ns = 0
    with path.open(encoding="utf-8-sig", errors="strict", newline="") as fh:
        reader = csv.reader(fh)
        lineno = 0
        try:
            for row in reader:
                lineno = reader.line_num
                if not row or all(not f.strip() for f in row):
                    continue
                if cols is None:
                    cols = _header(row, src, lineno)
                    continue
                if len(ts) >= limit:
                    break
                if len(row) != 3:
                    raise InputError(
                        f"{len(row)} fields; {_EXPECT}", source=src, where=f"line {lineno}"
                    )
                ns = _time_ns(row[cols["timestamp"]], src, lineno)
                if not ts:
                    first_ns = prev_ns = ns
                if ns < prev_ns:
                    raise InputError(
                        f"{show(row[cols['timestamp']].strip())} is earlier than the previous "
                        "request's time; allowed: requests in time order",
                        source=src,
                        where=f"line {lineno}: TIMESTAMP",
                    )
                prev_ns = ns
                n_in = _tokens(row[cols["contexttokens"]], "contexttokens", src, lineno)
                n_out = _tokens(row[cols["generatedtokens"]], "generatedtokens", src, lineno)
                t = (ns - first_ns) / _NS  # exact integer ns, one rounding to float
                check_request(t, n_in, n_out, src, lineno)
                ts.append(t)
                ins.append(n_in)
                outs.append(n_out)
        except csv.Error as err:
            raise InputError(
                f"not a CSV record ({err}); allowed: fields of at most "
                f"{csv.field_size_limit():,} characters; {_EXPECT}",
                source=src,
                where=f"line {reader.line_num}",
            ) from None
        except UnicodeDecodeError:
            raise InputError(
                f"not UTF-8 text; {_EXPECT}", source=src, where=f"after line {lineno}"
            ) from None
    if cols is None:
        raise InputError(f"no header and no requests; {_EXPECT}", source=src)
    return (
        np.asarray(ts, dtype=np.float64),
        np.asarray(ins, dtype=np.int32),
        np.asarray(outs, dtype=np.int32),
    )


def _header(row: list[str], src: str, lineno: int) -> dict[str, int]:
    """Column index of each Azure column, from the header ``row``."""
    names = [f.strip().lower() for f in row]
    if sorted(names) != sorted(AZURE_COLUMNS):
        raise InputError(
            f"header {show(','.join(row))}: allowed: the columns TIMESTAMP, ContextTokens, "
            "GeneratedTokens (each once, any order)",
            source=src,
            where=f"line {lineno}",
        )
    return {n: i for i, n in enumerate(names)}


def _time_ns(text: str, src: str, lineno: int) -> int:
    """``text`` (a date and time) as integer nanoseconds since 1970-01-01 UTC."""
    m = _TIME.fullmatch(text.strip())
    where = f"line {lineno}: TIMESTAMP"
    if m is None:
        raise InputError(
            f"{show(text)} is not a date and time; allowed: YYYY-MM-DD HH:MM:SS[.fraction]",
            source=src,
            where=where,
        )
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    try:
        day = dt.date(y, mo, d).toordinal() - _EPOCH
    except ValueError as err:
        raise InputError(f"{show(text)}: {err}", source=src, where=where) from None
    if h > 23 or mi > 59 or s > 60:
        raise InputError(
            f"{show(text)}: hour, minute or second out of range", source=src, where=where
        )
    frac = (m.group(7) or "").ljust(9, "0")
    ns = ((day * 24 + h) * 60 + mi) * 60 + s
    ns = ns * _NS + int(frac)
    tz = m.group(8)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        off = tz[1:].replace(":", "")
        ns -= sign * (int(off[:2]) * 3600 + int(off[2:]) * 60) * _NS
    return ns


def _tokens(text: str, column: str, src: str, lineno: int) -> int:
    """``text`` as a whole number of tokens ``0..MAX_TOKENS`` (any length of text)."""
    s = text.strip()
    if not _DIGITS.fullmatch(s) or len(s) > len(str(MAX_TOKENS)) or int(s) > MAX_TOKENS:
        raise InputError(
            f"{show(s)} is not a whole number of tokens; allowed: 0..{MAX_TOKENS:,}",
            source=src,
            where=f"line {lineno}: {_NAMES[column]}",
        )
    return int(s)
