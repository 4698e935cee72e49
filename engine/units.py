"""Human units for sizes, rates and durations, normalised to bytes, bytes/s and seconds.

Sizes: ``"4MiB"``, ``"256 KB"``, ``"1.5GiB"``, ``4096`` (plain numbers are bytes). Decimal
prefixes (k, M, G, T) are powers of 1000, binary ones (Ki, Mi, Gi, Ti) powers of 1024.
Rates: ``"100Gbit/s"``, ``"25 GB/s"``, ``"12GiB/s"`` -> bytes per second (bits are divided by 8).
Durations: ``"5ms"``, ``"20us"``, ``"1.5s"``, ``"2min"`` -> seconds; plain numbers are seconds.
"""

from __future__ import annotations

import math
import re

MAX_SIZE = 2**60
"""Largest size accepted, bytes (1 EiB): anything larger is a typo, not a machine."""
MAX_RATE = 1e18
"""Largest rate accepted, bytes per second (1 EB/s: above any link or memory, and above a
fitted rate of a cache-resident probe)."""
MAX_DURATION = 1e9
"""Largest duration accepted, seconds (about 31 years of simulated time)."""


def _show(value: object) -> str:
    """``repr(value)`` cut to 40 characters (a 400-digit number stays a short message)."""
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def _number(value: object, text: str, what: str) -> float:
    """``text`` as a finite float; ``ValueError`` naming ``value`` for inf, NaN and overflow."""
    try:
        number = float(text)
    except (OverflowError, ValueError):
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{_show(value)} is not a finite {what}")
    return number


def _bounded(value: object, number: float, limit: float, what: str, unit: str) -> float:
    if number > limit:
        raise ValueError(
            f"{_show(value)} is too large for a {what}; allowed: at most {limit:g} {unit}"
        )
    return number


_PREFIX = {
    "": 1,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}
_SIZE_RE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKMGTP]i?)?\s*(B|bytes?)?\s*$"
)
_RATE_RE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKMGTP]i?)?\s*(B|bit|bits|b)\s*(/s|ps)\s*$"
)
_TIME_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|µs|ms|s|sec|min|h)?\s*$")
_TIME_SCALE = {
    None: 1.0,
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "h": 3600.0,
}


def parse_size(value: str | int | float) -> int:
    """Return ``value`` as a whole number of bytes; raise ``ValueError`` if it is not a size."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int) and 0 <= value <= MAX_SIZE:
        return value  # exact (a float would round integers above 2**53)
    if isinstance(value, int | float):
        number = _number(value, repr(value) if isinstance(value, float) else str(value), "size")
    else:
        m = _SIZE_RE.match(str(value)[:200])
        if not m:
            raise ValueError(
                f'"{str(value)[:60]}" is not a size (e.g. 4096, "256KiB", "4MiB", "1.5GB")'
            )
        digits, scale = m.group(1), _PREFIX[m.group(2) or ""]
        if digits.isdigit() and len(digits) <= 20 and int(digits) * scale <= MAX_SIZE:
            return int(digits) * scale  # exact whole bytes
        number = _number(value, digits, "size") * scale
    if number < 0:
        raise ValueError(f"{_show(value)} is negative; a size must be >= 0")
    return round(_bounded(value, number, MAX_SIZE, "size", "bytes (1 EiB)"))


def parse_rate(value: str | int | float) -> float:
    """Return ``value`` as bytes per second; plain numbers are already bytes per second."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a rate")
    if isinstance(value, int | float):
        number = _number(value, repr(value) if isinstance(value, float) else str(value), "rate")
    else:
        m = _RATE_RE.match(str(value)[:200])
        if not m:
            raise ValueError(
                f'"{str(value)[:60]}" is not a rate (e.g. "100Gbit/s", "25GB/s", "12GiB/s", '
                "or bytes/s)"
            )
        number = _number(value, m.group(1), "rate") * _PREFIX[m.group(2) or ""]
        if m.group(3) != "B":
            number /= 8.0
    if number <= 0:
        raise ValueError(f"{_show(value)}: a rate must be > 0")
    return _bounded(value, number, MAX_RATE, "rate", "bytes/s (1 EB/s)")


def parse_duration(value: str | int | float) -> float:
    """Return ``value`` as seconds; plain numbers are already seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        number = _number(value, repr(value) if isinstance(value, float) else str(value), "duration")
    else:
        m = _TIME_RE.match(str(value)[:200])
        if not m:
            raise ValueError(f'"{str(value)[:60]}" is not a duration (e.g. "5ms", "20us", "1.5s")')
        number = _number(value, m.group(1), "duration") * _TIME_SCALE[m.group(2)]
    if number < 0:
        raise ValueError(f"{_show(value)} is negative; a duration must be >= 0")
    return _bounded(value, number, MAX_DURATION, "duration", "s")


def format_bytes(n: float) -> str:
    """Format a byte count with a binary prefix, e.g. ``4.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
