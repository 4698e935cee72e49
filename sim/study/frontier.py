"""The throughput / per-user speed frontier of a deployment: ``pdsim frontier``.

For every configuration of the grid (aggregated replicas: tensor-parallel degree ``cluster.tp``
x expert parallelism ``cluster.ep`` (mixture-of-experts models) x ``replica.max_num_seqs`` x ``replica.max_num_batched_tokens``; disaggregated deployments:
each :class:`DisaggShape` x the same batch knobs; all on the scenario's cluster), the highest
Poisson load that meets the SLOs is found by bisection
(:meth:`sim.study.plan.Planner.max_qpss`, all configurations in lockstep so each round's
probes run together on Dask or local processes). At that load the configuration's

* **tokens/s/GPU** is the output tokens per second of the steady window over the GPUs, and
* **tokens/s/user** the median per-user speed (``user_tokens_per_s.p50``: each request's
  decode-phase output tokens per second),

both means over the probe's seeds. The **Pareto frontier** (:func:`pareto_front`) keeps the
configurations no other beats on both; the **chosen** point is the frontier's highest
tokens/s/GPU among those at least ``min_user_tps`` fast for their users.

Cost: each configuration's bisection takes about ``2 + log2(range / tolerance)`` probes of
``seeds`` runs each (memoised and cached on disk under ``OUT/runs``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.study.planspec import PlanFile, SloCfg
from sim.study.sweep.execute import Progress, Runner
from sim.study.sweep.resultcache import RunCache, write_atomic
from sim.study.sweep.spec import seed_list

#: the grid keys of a frontier, in the order they are shown
GRID_KEYS: tuple[str, ...] = (
    "cluster.tp",
    "cluster.ep",
    "cluster.replica.max_num_seqs",
    "cluster.replica.max_num_batched_tokens",
)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices (ascending) of the points no other point dominates, both coordinates to be
    maximised: ``q`` dominates ``p`` when it is at least as large in both and larger in one.
    Equal points do not dominate each other (both are kept). NaN coordinates never make the
    front. O(n log n): sort by x descending (ties by y descending) and keep each point whose
    y beats every y seen at a strictly larger x, and matches the best y of its own x."""
    order = sorted(
        (i for i, (x, y) in enumerate(points) if x == x and y == y),
        key=lambda i: (-points[i][0], -points[i][1]),
    )
    keep: list[int] = []
    best_y = -math.inf  # best y among points with a strictly larger x
    for _, group in itertools.groupby(order, key=lambda i: points[i][0]):
        idx = list(group)
        top = points[idx[0]][1]  # the group's best y (sorted descending)
        if top > best_y:
            keep += [i for i in idx if points[i][1] == top]
            best_y = top
    return sorted(keep)


@dataclass
class FrontierResult:
    """Every configuration's row (``frame``), the chosen row's index (None: no
    configuration met the SLOs), and the folder of ``frontier.csv`` / ``frontier.png``."""

    frame: pd.DataFrame
    chosen: int | None
    folder: Path
    tpot_limit_s: float | None


def _plan_spec(
    scenario: Path,
    grid: dict[str, list[int]],
    slo: SloCfg,
    size: int,
    qps_range: tuple[float, float],
    tolerance: float,
    seeds: int,
    overrides: dict[str, Any],
) -> PlanFile:
    """The plan of a frontier: the highest load of each configuration at ``size``."""
    return PlanFile.model_validate(
        {
            "scenario": str(scenario),
            "set": overrides,
            "seeds": seeds,
            "slo": slo,
            "size_key": "cluster.servers",
            "size_range": (size, size),
            "sizes": [size],
            "qps_range": qps_range,
            "qps_tolerance": tolerance,
            "alternatives": {k: list(v) for k, v in grid.items()},
        }
    )


@dataclass(frozen=True)
class DisaggShape:
    """A disaggregated deployment of the frontier: ``prefill`` x tp ``prefill_tp`` prompt
    replicas and ``decode`` x tp ``decode_tp`` decode replicas (``disaggregation``)."""

    prefill: int
    prefill_tp: int
    decode: int
    decode_tp: int

    @classmethod
    def parse(cls, text: str) -> DisaggShape:
        """``PxT+DxU`` (e.g. ``1x4+1x4``: one tp-4 prefill and one tp-4 decode replica);
        ValueError otherwise."""
        try:
            pre, dec = text.split("+")
            (pn, pt), (dn, dt) = (tuple(int(v) for v in part.split("x")) for part in (pre, dec))
        except ValueError:
            raise ValueError(f"{text!r} is not PxTP+DxTP (e.g. 1x4+1x4)") from None
        if min(pn, pt, dn, dt) < 1:
            raise ValueError(f"{text!r}: replicas and tp must be >= 1")
        return cls(pn, pt, dn, dt)

    def overrides(self) -> dict[str, Any]:
        """The scenario keys that make this deployment."""
        return {
            "disaggregation.enabled": True,
            "disaggregation.prefill.replicas": self.prefill,
            "disaggregation.prefill.tp": self.prefill_tp,
            "disaggregation.decode.replicas": self.decode,
            "disaggregation.decode.tp": self.decode_tp,
        }


def describe(alt: dict[str, Any]) -> dict[str, Any]:
    """A configuration's identifying columns: ``family`` (aggregated, disaggregated),
    ``deployment`` (``agg tp4``, ``agg tp1 ep8``, ``P 1xtp4 + D 1xtp4``), ``tp`` (aggregated:
    the replicas'; disaggregated: the decode pool's), ``ep`` when swept, ``max_num_seqs`` and, when swept,
    ``max_num_batched_tokens``."""
    row: dict[str, Any] = {}
    if alt.get("disaggregation.enabled"):
        pn, pt = alt["disaggregation.prefill.replicas"], alt["disaggregation.prefill.tp"]
        dn, dt = alt["disaggregation.decode.replicas"], alt["disaggregation.decode.tp"]
        row.update(family="disaggregated", deployment=f"P {pn}xtp{pt} + D {dn}xtp{dt}", tp=dt)
    else:
        tp, ep = alt["cluster.tp"], alt.get("cluster.ep", 1)
        name = f"agg tp{tp}" + (f" ep{ep}" if ep > 1 else "")
        row.update(family="aggregated", deployment=name, tp=tp)
        if "cluster.ep" in alt:
            row["ep"] = ep
    row["max_num_seqs"] = alt["cluster.replica.max_num_seqs"]
    if "cluster.replica.max_num_batched_tokens" in alt:
        row["max_num_batched_tokens"] = alt["cluster.replica.max_num_batched_tokens"]
    return row


def disagg_alternatives(
    shapes: Sequence[DisaggShape], grid: dict[str, list[int]]
) -> list[dict[str, Any]]:
    """Every disaggregated shape crossed with the grid's batch knobs (not ``cluster.tp``:
    each pool has its own; not ``cluster.ep``: expert parallelism is not modelled with
    disaggregation)."""
    knobs = {k: v for k, v in grid.items() if k not in ("cluster.tp", "cluster.ep")}
    keys = list(knobs)
    return [
        {**shape.overrides(), **dict(zip(keys, combo, strict=True))}
        for shape in shapes
        for combo in itertools.product(*(knobs[k] for k in keys))
    ]


def frontier_rows(pl: Any, alts: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """One row per configuration: its capacity (highest passing load) and, at that load, the
    GPUs, tokens/s/GPU, tokens/s/user and latencies; ``reason`` when none passes."""
    rows: list[dict[str, Any]] = []
    for alt, (qmax, boundary) in zip(alts, pl.max_qpss(alts, size), strict=True):
        row = describe(alt)
        at = pl.answer_probe(alt, size, qmax) if qmax is not None else None
        fig = at.figures if at is not None else {}
        gpus = fig.get("gpus")
        out_tps = fig.get("throughput.output_tokens_per_s")
        row.update(
            capacity_rps=qmax,
            gpus=int(gpus) if gpus else None,
            tokens_per_s_per_gpu=out_tps / gpus if out_tps is not None and gpus else None,
            tokens_per_s_per_user=fig.get("user_tokens_per_s.p50"),
            user_tps_p10=fig.get("user_tokens_per_s.p10"),
            **{
                k.replace("latency.", "").replace(".", "_") + "_s": fig.get(k)
                for k in (
                    "latency.ttft.p50",
                    "latency.ttft.p99",
                    "latency.tpot.p50",
                    "latency.tpot.p99",
                    "latency.e2e.p50",
                    "latency.e2e.p99",
                )
            },
            reason=None if qmax is not None else "; ".join(boundary.reasons[:2]) or "infeasible",
        )
        rows.append(row)
    return rows


def choose(df: pd.DataFrame, min_user_tps: float = 0.0) -> int | None:
    """The row of the frontier with the highest tokens/s/GPU among those whose users get at
    least ``min_user_tps`` tokens/s (ties: the faster for users, then the first)."""
    ok = df[df["on_frontier"] & (df["tokens_per_s_per_user"] >= min_user_tps)]
    if ok.empty:
        return None
    best = ok.sort_values(
        ["tokens_per_s_per_gpu", "tokens_per_s_per_user"], ascending=False, kind="stable"
    )
    return int(best.index[0])


def run_frontier(
    scenario: Path,
    grid: dict[str, list[int]],
    slo: SloCfg,
    out: Path,
    *,
    size: int,
    qps_range: tuple[float, float],
    tolerance: float = 0.05,
    seeds: int = 1,
    overrides: dict[str, Any] | None = None,
    min_user_tps: float = 0.0,
    disagg: Sequence[DisaggShape] = (),
    record: dict[str, Any] | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    progress: Callable[[str], None] | None = None,
    run_progress: Progress | None = None,
) -> FrontierResult:
    """Sweep ``grid`` (keys of :data:`GRID_KEYS` -> values) on ``size`` servers of
    ``scenario``; write ``frontier.csv``, ``frontier.png`` and ``frontier.json`` (``record``,
    the grid, the objectives, every row and the chosen one) under ``out`` (runs cached under
    ``out/runs``). See the module docstring."""
    from sim.study.plan import Planner, alternatives, check_plan

    spec = _plan_spec(scenario, grid, slo, size, qps_range, tolerance, seeds, overrides or {})
    folder = Path(out)
    runner = Runner(workers, scheduler)
    pl = Planner(spec, scenario, runner, RunCache(folder), seed_list(spec.seeds, "frontier"),
                 progress, run_progress)  # fmt: skip
    check_plan(spec, pl, "frontier")
    extra = disagg_alternatives(disagg, grid)
    for alt in extra:  # validated like check_plan's: an unknown key or value is an input error
        pl.points(alt, size, qps_range[0])
    alts = alternatives(spec) + extra
    with runner:
        rows = frontier_rows(pl, alts, size)
    df = pd.DataFrame(rows)
    pts = [
        (
            float(r["tokens_per_s_per_user"] or math.nan),
            float(r["tokens_per_s_per_gpu"] or math.nan),
        )
        for r in rows
    ]
    front = set(pareto_front(pts))
    df["on_frontier"] = [i in front for i in range(len(df))]
    chosen = choose(df, min_user_tps)
    df["chosen"] = [i == chosen for i in range(len(df))]
    tpots = [v for kind, _, _, v in slo.limits() if kind == "tpot"]
    tpot = min(tpots) if tpots else None
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "frontier.csv", df.to_csv(index=False))
    from sim.study.plots import pareto_plot

    pareto_plot(df, folder / "frontier.png", tpot, f"frontier: {scenario.stem}")
    rows = json.loads(df.to_json(orient="records", double_precision=15))
    report = {
        **(record or {}),
        "grid": grid,
        "disaggregated": [dataclasses.asdict(d) for d in disagg],
        "slo": slo.model_dump(mode="json"),
        "size": size,
        "seeds": seeds,
        "chosen": rows[chosen] if chosen is not None else None,
        "frontier": rows,
    }
    write_atomic(folder / "frontier.json", json.dumps(report, indent=1) + "\n")
    return FrontierResult(df, chosen, folder, tpot)
