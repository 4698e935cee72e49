"""Cache-access traces: one in-memory model and readers for CSV, oracleGeneral and Mooncake."""

from importlib.resources import files
from pathlib import Path

from engine.traces.csv_reader import read_csv
from engine.traces.detect import FORMATS, detect_format, read_trace
from engine.traces.mooncake import DEFAULT_BLOCK_TOKENS, DEFAULT_KV_BYTES_PER_TOKEN, read_mooncake
from engine.traces.oracle import next_access_indices, read_oracle, write_oracle
from engine.traces.trace import NO_COLOR, Trace, dense_ids


def example_trace() -> Path:
    """Path of the Mooncake trace slice shipped inside the package (works on a fresh clone)."""
    return Path(str(files("engine") / "data" / "traces" / "mooncake_slice.jsonl"))


__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "DEFAULT_KV_BYTES_PER_TOKEN",
    "FORMATS",
    "NO_COLOR",
    "Trace",
    "dense_ids",
    "detect_format",
    "example_trace",
    "next_access_indices",
    "read_csv",
    "read_mooncake",
    "read_oracle",
    "read_trace",
    "write_oracle",
]
