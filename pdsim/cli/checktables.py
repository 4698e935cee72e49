"""The tables of ``pdsim validate``'s scheduling-model and cost-model checks.

:func:`print_scheduling` prints one row per workload: the largest error over the engine runs
of each replayed figure (TTFT, TPOT, end to end; P50 and P99) with its verdict against
:data:`hwbench.schedcheck.SCHED_LIMITS`, then any batch the replay formed differently.
:func:`print_cost` prints one row per workload and iteration group
(:mod:`hwbench.costcheck`). Each returns the lines that fail, for the exit status.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from pdsim.cli.common import console

if TYPE_CHECKING:
    from hwbench.costcheck import CostRow
    from hwbench.schedcheck import SchedCheck

__all__ = ["cost_dict", "print_cost", "print_scheduling"]


def print_scheduling(checks: list[SchedCheck]) -> list[str]:
    """Print the scheduling-model table; return its failures (one line each)."""
    from hwbench.schedcheck import METRICS, SCHED_LIMITS

    table = Table(
        title="scheduling model: engine runs replayed on their own iteration times "
        f"(largest error over the runs; P50 within {SCHED_LIMITS['p50']:.0%}, "
        f"P99 within {SCHED_LIMITS['p99']:.0%})",
        header_style="bold",
    )
    cols = [f"{m} {s}" for m in METRICS for s in ("p50", "p99")]
    for col in ("workload", "runs", *cols, ""):
        table.add_column(col, justify="left" if col == "workload" else "right")
    failed: list[str] = []
    for c in checks:
        worst = c.worst()
        lines = c.failures()
        failed.extend(lines)
        cells = [
            f"{worst[k] * 100:+.2f}%" if k in worst else "-"
            for k in (f"{m}_{s}" for m in METRICS for s in ("p50", "p99"))
        ]
        table.add_row(c.workload, str(len(c.runs)), *cells, "OVER" if lines else "ok")
    _print(table)
    for line in failed:
        console.print(f"  {line}")
    return failed


def print_cost(rows: list[CostRow]) -> list[str]:
    """Print the cost-model table; return the groups over their limit (one line each)."""
    from hwbench.costcheck import COST_LIMIT, MIN_ITERATIONS

    table = Table(
        title="cost model: the profile's price of each engine iteration against its time "
        f"(groups of {MIN_ITERATIONS}+ iterations within {COST_LIMIT:.0%})",
        header_style="bold",
    )
    for col in ("workload", "group", "iterations", "engine ms", "model ms", "error",
                "engine runs spread", "clock stalled", ""):  # fmt: skip
        table.add_column(col, justify="left" if col in ("workload", "group") else "right")
    failed: list[str] = []
    for r in rows:
        verdict = r.verdict
        if verdict == "OVER":
            failed.append(f"{r.workload}: cost {r.group} {r.error * 100:+.1f}% OVER")
        spread = f"{r.run_spread * 100:.1f}%" if math.isfinite(r.run_spread) else ""
        table.add_row(
            r.workload,
            r.group,
            str(r.iterations),
            f"{r.measured_ms:.3f}",
            f"{r.predicted_ms:.3f}",
            f"{r.error * 100:+.1f}%",
            spread,
            str(r.unmeasured) if r.unmeasured else "",
            verdict,
        )
    _print(table)
    return failed


def _print(table: Table) -> None:
    """Print ``table`` at the terminal's width, or 140 columns in a log or a pipe (where the
    console would take 80 and cut the workload and group names)."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(width=140, highlight=False, file=console.file).print(table)


def cost_dict(r: CostRow) -> dict[str, Any]:
    """One cost row as JSON (non-finite figures, e.g. the spread of one run, as None)."""

    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "workload": r.workload,
        "group": r.group,
        "iterations": r.iterations,
        "unmeasured": r.unmeasured,
        "measured_ms": num(r.measured_ms),
        "predicted_ms": num(r.predicted_ms),
        "rel_error": num(r.error),
        "engine_run_spread": num(r.run_spread),
        "verdict": r.verdict,
    }
