"""Readable figures for the CLI: every summary key with a unit and fixed precision.

:func:`fmt_value` picks the unit from the key's dotted path (seconds as ``ms``/``s``,
throughputs as ``req/s``, shares as ``%``, bytes as ``MiB``/``GiB``, counts with thousands
separators) and never uses scientific notation. :func:`summary_rows` turns a whole run summary
into table rows, a dict of scalars (percentiles, hit rates per tier) on one row, keys it does
not know included, so new summary keys appear without edits here; missing keys are skipped.
"""

from __future__ import annotations

import math
from typing import Any

#: summary keys not shown as rows (printed elsewhere or not figures)
SKIP = frozenset(
    {"scenario", "seed", "trace_hash", "claims", "faults", "variants", "per_model_class"}
)
#: the order of the first rows (a dotted prefix); keys not listed follow in summary order
ORDER = (
    "requests", "completed", "shed", "rejected", "unfinished", "degraded", "overloaded",
    "stop_reason", "replicas", "gpus",
    "sim_time_s", "throughput", "throughput_rps", "goodput_rps", "tokens_per_s",
    "slo_attainment", "latency", "user_tokens_per_s", "e2e", "ttft", "tpot", "tbt", "hit_rate",
    "bytes_by_tier",
    "param_wait_share", "param_load_p99_s", "utilisation",
)  # fmt: skip
PERCENT_WORDS = ("hit_rate", "share", "utilisation", "utilization", "attainment", "fragmentation")
SECONDS_SECTIONS = ("latency", "ttft", "tpot", "tbt", "e2e", "time_to_elect")
BYTES_WORDS = ("bytes",)


def _unit(path: str) -> str:
    """``s``, ``rps``, ``tok/s``, ``%``, ``B``, ``tokens`` or ``""`` for dotted key ``path``."""
    parts = path.split(".")
    leaf = parts[-1]
    if any(p.endswith("tokens_per_s") for p in parts):
        return "tok/s"
    if leaf.endswith("_s") or any(p in SECONDS_SECTIONS for p in parts):
        return "s"
    if leaf.endswith("_rps") or parts[0] in ("throughput", "goodput"):
        return "rps"
    if any(w in p for p in parts for w in BYTES_WORDS):
        return "B"
    if any(w in p for p in parts for w in PERCENT_WORDS) or leaf.endswith("_saturation"):
        return "%"
    if any("tokens" in p or "context" in p for p in parts):
        return "tokens"
    return ""


def _num(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}"


def fmt_seconds(x: float) -> str:
    """``12.7 ms`` below one second, ``4.36 s`` above (fixed precision)."""
    if abs(x) < 1.0:
        ms = x * 1e3
        return f"{ms:.3f} ms" if abs(ms) < 1 else f"{ms:.1f} ms"
    return f"{x:,.2f} s"


def fmt_bytes(x: float) -> str:
    """Bytes in B, KiB, MiB, GiB or TiB with one decimal."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:,.1f} {unit}"
    return f"{x:,.0f} B"


def fmt_value(path: str, v: Any) -> str:
    """``v`` (the summary value at dotted key ``path``) with its unit; ``-`` for none/NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, int | float):
        return str(v)
    unit = _unit(path)
    if unit == "s":
        return fmt_seconds(float(v))
    if unit == "rps":
        return f"{_num(float(v), 2)} req/s"
    if unit == "tok/s":
        return f"{_num(float(v), 0)} tokens/s"
    if unit == "%":
        return f"{float(v) * 100:.2f} %"
    if unit == "B":
        return fmt_bytes(float(v))
    text = _num(float(v), 0) if isinstance(v, int) or float(v).is_integer() else _num(float(v), 3)
    return f"{text} tokens" if unit == "tokens" else text


def _label(path: str) -> str:
    """``per_class.high.latency`` -> ``class high latency``; a trailing ``_s`` (the unit is
    in the value) and underscores go; ``tokens_per_s`` reads ``tokens/s``."""
    parts = [
        p.replace("tokens_per_s", "tokens/s")
        if p.endswith("tokens_per_s")
        else (p[:-2] if p.endswith("_s") and len(p) > 2 else p)
        for p in path.split(".")
    ]
    if parts[0] == "per_class":
        parts[0] = "class"
    return " ".join(parts).replace("_", " ").replace("p999", "p99.9")


def _rows(path: str, v: Any) -> list[tuple[str, str]]:
    if isinstance(v, dict):
        if not v:
            return []
        if all(not isinstance(x, dict | list) for x in v.values()):
            keys = list(v)
            label = f"{_label(path)} ({' / '.join(_label(k) for k in keys)})"
            return [(label, " / ".join(fmt_value(f"{path}.{k}", v[k]) for k in keys))]
        out: list[tuple[str, str]] = []
        for k, x in v.items():
            out += _rows(f"{path}.{k}", x)
        return out
    if isinstance(v, list):
        return []
    return [(_label(path), fmt_value(path, v))]


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows for every figure in ``summary`` (see the module docstring)."""
    keys = [k for k in summary if k not in SKIP]
    rank = {k: i for i, k in enumerate(ORDER)}
    keys.sort(key=lambda k: rank.get(k, len(ORDER)))  # stable: unknown keys keep their order
    rows: list[tuple[str, str]] = []
    for k in keys:
        rows += _rows(k, summary[k])
    return rows
