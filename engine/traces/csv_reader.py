"""CSV traces: ``time,key,size[,color]``, one access per line, header optional.

* ``time`` -- seconds (int or float), finite and non-decreasing down the file;
* ``key`` -- any text (numbers are read as text too); renumbered densely in first-seen order;
* ``size`` -- a whole number of bytes >= 0;
* ``color`` -- optional text (model / tenant); an empty or missing last field: no colour.

A header is detected when the first field of the first non-empty line is not a number. With a
header the columns are found by name (``time``, ``key``, ``size`` required, ``color``
optional, any order); without one they are positional (3 or 4 fields). Blank lines are skipped.

Reading uses pandas' C parser; when it meets anything unexpected a second, plain pass with the
:mod:`csv` module finds the first bad line and raises :class:`engine.errors.InputError` naming
the file, the 1-based line number and what was expected.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from engine.errors import InputError
from engine.traces.trace import NO_COLOR, Trace, first_decrease

REQUIRED = ("time", "key", "size")
ALLOWED = (*REQUIRED, "color")
_DIGITS = re.compile(r"[0-9]+")
#: the longest field the :mod:`csv` module reads (its default limit), characters
MAX_FIELD = csv.field_size_limit()
_EXPECT = "expected `time,key,size[,color]` (time in seconds, size a whole number of bytes)"


def read_csv(path: str | Path) -> Trace:
    """Read a CSV trace; see the module docstring for the format and the errors raised."""
    path = Path(path)
    src = str(path)
    header_line, columns = _layout(path)
    try:
        df = pd.read_csv(
            path,
            header=None,
            names=list(columns),
            skiprows=header_line,
            dtype={"key": str, "color": str},
            keep_default_na=False,
            skip_blank_lines=True,
            engine="c",
        )
    except (pd.errors.ParserError, ValueError, UnicodeDecodeError) as err:
        _diagnose(path, header_line, columns)
        raise InputError(f"could not parse: {err}; {_EXPECT}", source=src) from err
    if len(df) == 0:
        raise InputError(f"no accesses in the file; {_EXPECT}", source=src)
    time_s, size_s = df["time"], df["size"]
    ok = (
        time_s.dtype.kind in "if"
        and size_s.dtype.kind == "i"
        and bool(np.isfinite(time_s.to_numpy(dtype=np.float64)).all())
        and bool((size_s.to_numpy() >= 0).all())
    )
    key_s = df["key"]
    ok = ok and not bool((key_s.isna() | (key_s.astype(str).str.strip() == "")).any())
    time = time_s.to_numpy(dtype=np.float64) if ok else np.zeros(0)
    if not ok or first_decrease(time) >= 0:
        _diagnose(path, header_line, columns)
        raise InputError(f"unexpected content; {_EXPECT}", source=src)
    codes, _ = pd.factorize(key_s, sort=False)  # codes in first-seen order
    color = None
    names: tuple[str, ...] = ()
    if "color" in columns:
        col = df["color"]
        blank = col.isna() | (col.astype(str) == "")  # a missing last field: no colour
        ccodes, uniq = pd.factorize(col.astype(str).where(~blank, None), sort=False)
        color = np.where(ccodes < 0, NO_COLOR, ccodes).astype(np.int32)
        names = tuple(str(u) for u in uniq)
    return Trace(
        time=time,
        key=np.asarray(codes, dtype=np.int64),
        size=size_s.to_numpy(dtype=np.int64),
        source=src,
        color=color,
        color_names=names,
        meta={"format": "csv"},
    )


def _rows(fh: Iterable[str], src: str) -> Iterator[tuple[int, list[str]]]:
    """``(1-based line, fields)`` of each CSV record in ``fh``; a field longer than the
    :mod:`csv` module's limit (:data:`MAX_FIELD` characters) or malformed quoting is an
    :class:`InputError` naming the line."""
    reader = csv.reader(fh)
    lineno = 0
    try:
        for row in reader:
            lineno = reader.line_num
            yield lineno, row
    except csv.Error as err:
        raise InputError(
            f"not a CSV record ({err}); allowed: fields of at most {MAX_FIELD:,} characters; "
            f"{_EXPECT}",
            source=src,
            where=f"line {reader.line_num}",  # counts the line that failed
        ) from None


def _layout(path: Path) -> tuple[int, tuple[str, ...]]:
    """``(lines to skip, column names)`` from the first non-empty line."""
    src = str(path)
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        for lineno, row in _rows(fh, src):
            if not row or all(not f.strip() for f in row):
                continue
            if _is_number(row[0]):
                if len(row) not in (3, 4):
                    raise InputError(
                        f"{len(row)} fields; {_EXPECT}", source=src, where=f"line {lineno}"
                    )
                return lineno - 1, ALLOWED[: len(row)]
            names = tuple(f.strip().lower() for f in row)
            unknown = [n for n in names if n not in ALLOWED]
            missing = [n for n in REQUIRED if n not in names]
            if unknown or missing or len(set(names)) != len(names):
                raise InputError(
                    f"header {','.join(row)!r}: columns must be {', '.join(REQUIRED)} "
                    f"and optionally color (each once)",
                    source=src,
                    where=f"line {lineno}",
                )
            return lineno, names
    raise InputError(f"no accesses in the file; {_EXPECT}", source=src)


def _diagnose(path: Path, header_line: int, columns: tuple[str, ...]) -> None:
    """Scan the file line by line and raise ``InputError`` at the first bad record."""
    src = str(path)
    prev = -math.inf
    lineno = 0
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            for lineno, row in _rows(fh, src):
                if lineno <= header_line or not row or all(not f.strip() for f in row):
                    continue
                where = f"line {lineno}"
                if len(row) != len(columns) and not (
                    len(columns) == 4 and len(row) == 3 and columns[3] == "color"
                ):
                    raise InputError(
                        f"{len(row)} fields, expected {len(columns)} ({','.join(columns)})",
                        source=src,
                        where=where,
                    )
                rec = dict(zip(columns, row, strict=False))
                if not rec["key"].strip():
                    raise InputError("key is empty", source=src, where=where)
                t = _float(rec["time"])
                if t is None or not math.isfinite(t):
                    raise InputError(
                        f"time {rec['time']!r} is not a number of seconds", source=src, where=where
                    )
                if t < prev:
                    raise InputError(
                        f"time {t} is earlier than the previous access's {prev}; "
                        "accesses must be in time order",
                        source=src,
                        where=where,
                    )
                prev = t
                s = rec["size"].strip()
                if not _DIGITS.fullmatch(s):
                    raise InputError(
                        f"size {rec['size']!r} is not a whole number of bytes >= 0",
                        source=src,
                        where=where,
                    )
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text; {_EXPECT}", source=src, where=f"after line {lineno}"
        ) from err


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(text: str) -> bool:
    return _float(text.strip()) is not None
