"""How much each engine term moves between calibrations of the same machine (issue 15).

Reads two or more profiles written by ``pdsim calibrate`` (the same machine, calibrated one
after another) and prints, per engine term, its value in each profile and the spread:
minimum, median, maximum and ``(max - min) / median``. The terms are those ``pdsim validate``
prices with: ``ops.roofline.iteration_overhead_s`` and every number of ``ops.engine``; for
comparison, the least-squares overhead each calibration keeps as evidence
(``fitted.engine_fit_report.raw_iteration_overhead_s``), the engine fit's RMS error, and
how busy and how steady the machine was (``fitted.calibration_load``). Last line: one JSON
object ``{"profiles": N, "terms": {name: {"values": [...], "min": ..., "median": ...,
"max": ..., "rel_spread": ...}}}``.

Usage: ``python benchmarks/calibration_spread.py runs/r1.json runs/r2.json runs/r3.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from engine.errors import InputError
from sim.serving.costmodel import Profile, load_profile

#: (row label, unit scale, unit) per term, in print order
UNITS: dict[str, tuple[float, str]] = {
    "iteration_overhead_s": (1e6, "us"),
    "raw_iteration_overhead_s": (1e6, "us"),
    "prompt_overhead_s_per_token": (1e6, "us"),
    "iter_gap_s": (1e6, "us"),
    "wake_s": (1e6, "us"),
    "layer_overhead_s": (1e6, "us"),
    "copy_contention": (1.0, ""),
    "prefetch_compute_s_per_byte": (1e12, "us/MB"),
    "prefetch_handoff_s": (1e6, "us"),
    "rms_rel_error": (100.0, "%"),
    "others": (100.0, "% CPU"),
    "steal": (100.0, "% CPU"),
    "reference_s": (1e3, "ms"),
}


def terms(profile: Profile, source: str) -> dict[str, float]:
    """The engine terms of ``profile`` and the calibration's evidence (module docstring);
    :class:`InputError` naming ``source`` when it carries no engine terms."""
    if profile.ops is None or profile.ops.engine is None:
        raise InputError(
            f"{source}: no ops.engine section; give profiles written by `pdsim calibrate`"
        )
    out: dict[str, float] = {"iteration_overhead_s": profile.ops.roofline.iteration_overhead_s}
    for key, value in profile.ops.engine.model_dump().items():
        if isinstance(value, float):
            out[key] = value
    for table, keys in (
        ("engine_fit_report", ("raw_iteration_overhead_s", "rms_rel_error")),
        ("calibration_load", ("others", "steal", "reference_s")),
    ):
        rows: list[Any] = list(profile.fitted.get(table, []))
        for key in keys:
            if rows and key in rows[0]:
                out[key] = float(rows[0][key])
    return out


def spread(values: list[float]) -> dict[str, Any]:
    """Minimum, median, maximum and ``(max - min) / median`` (0 when the median is 0)."""
    mid = statistics.median(values)
    lo, hi = min(values), max(values)
    return {
        "values": values,
        "min": lo,
        "median": mid,
        "max": hi,
        "rel_spread": (hi - lo) / mid if mid else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", help="profiles written by `pdsim calibrate`")
    args = ap.parse_args()
    if len(args.profiles) < 2:
        print("error: give at least two profiles to compare", file=sys.stderr)
        raise SystemExit(2)
    try:
        per = [terms(load_profile(p), p) for p in args.profiles]
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    names = [k for k in UNITS if all(k in t for t in per)]
    names += sorted({k for t in per for k in t if k not in UNITS and all(k in u for u in per)})
    table = Table(title=f"engine terms over {len(per)} calibrations")
    table.add_column("term")
    for p in args.profiles:
        table.add_column(Path(p).stem, justify="right")
    table.add_column("min / median / max", justify="right")
    table.add_column("(max-min)/median", justify="right")
    out: dict[str, Any] = {}
    for name in names:
        scale, unit = UNITS.get(name, (1.0, ""))
        s = spread([t[name] for t in per])
        out[name] = s
        row = [f"{v * scale:.4g}" for v in s["values"]]
        mmm = f"{s['min'] * scale:.4g} / {s['median'] * scale:.4g} / {s['max'] * scale:.4g}"
        table.add_row(f"{name} ({unit})" if unit else name, *row, mmm, f"{s['rel_spread']:.1%}")
    Console().print(table)
    print(json.dumps({"profiles": len(per), "terms": out}))


if __name__ == "__main__":
    main()
