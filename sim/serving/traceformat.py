"""Which request-trace format a file holds, and the range check of every record's fields.

Serving workloads replay three formats (``workload.trace_format``):

* ``mooncake`` -- JSONL, ``timestamp`` in ms, ``input_length``, ``output_length``,
  optional ``hash_ids`` (:func:`sim.serving.workload.read_mooncake_records`);
* ``csv`` -- ``time,input_tokens,output_tokens``, time in seconds
  (:func:`sim.serving.workload.read_request_csv`);
* ``azure`` -- the Azure LLM inference trace, ``TIMESTAMP,ContextTokens,GeneratedTokens``
  with a date and time (:func:`sim.serving.azuretrace.read_azure_csv`).

``auto`` detects the format as :func:`engine.traces.detect_format` does for cache traces:
the extension first (``.jsonl``/``.json`` is Mooncake), then the content -- a first
non-blank line starting with ``{`` is Mooncake, a CSV header naming the three Azure columns
is Azure, any other text is ``csv``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from engine.errors import InputError
from engine.limits import MAX_TOKENS, show
from engine.units import MAX_DURATION

__all__ = ["AZURE_COLUMNS", "FORMATS", "check_request", "detect_request_format", "trace_format"]

#: the concrete formats ``auto`` resolves to
FORMATS = ("mooncake", "csv", "azure")
#: the Azure trace's columns, lower-cased (matched without regard to case)
AZURE_COLUMNS = ("timestamp", "contexttokens", "generatedtokens")
#: bytes read to find the first non-blank line
_HEAD = 1 << 16


def detect_request_format(path: Path) -> str:
    """The concrete format (one of :data:`FORMATS`) of the request trace at ``path``;
    :class:`InputError` for an empty or non-UTF-8 file."""
    if path.suffix.lower() in (".jsonl", ".json"):
        return "mooncake"
    with path.open("rb") as fh:
        head = fh.read(_HEAD)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not just a multi-byte character cut at the end
            raise InputError(
                "not UTF-8 text; allowed trace formats: " + ", ".join(FORMATS), source=str(path)
            ) from None
        text = head[: err.start].decode("utf-8")
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark
    first = next((ln for ln in text.splitlines() if ln.strip()), None)
    if first is None:
        raise InputError("empty file: cannot tell its trace format", source=str(path))
    if first.lstrip().startswith("{"):
        return "mooncake"
    fields = next(csv.reader(io.StringIO(first)), [])
    if sorted(f.strip().lower() for f in fields) == sorted(AZURE_COLUMNS):
        return "azure"
    return "csv"


def trace_format(fmt: str, path: Path) -> str:
    """``fmt`` itself, or for ``auto`` the format detected in ``path``."""
    return detect_request_format(path) if fmt == "auto" else fmt


def check_request(t: float, n_in: int, n_out: int, source: str, lineno: int) -> None:
    """One trace record's arrival ``t`` (s) and token counts, or :class:`InputError` naming
    ``source`` and the line: ``t`` finite in ``[0, MAX_DURATION]``, counts ``0..MAX_TOKENS``."""
    where = f"line {lineno}"
    if not 0 <= t <= MAX_DURATION:
        raise InputError(
            f"time {show(t)} s is not in [0, {MAX_DURATION:g}] s", source=source, where=where
        )
    for name, n in (("input", n_in), ("output", n_out)):
        if not 0 <= n <= MAX_TOKENS:
            raise InputError(
                f"{name} tokens {show(n)}: allowed: 0..{MAX_TOKENS:,}", source=source, where=where
            )
