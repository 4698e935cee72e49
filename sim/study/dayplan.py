"""A plan for a day (``day:`` in a plan file): the autoscaler settings with the fewest
GPU-hours that keep the day's SLO attainment, against static provisioning for the peak.

The plan's scenario carries the day (its workload) and an ``autoscale`` section. Two
searches, every run through the sweep machinery (cached by config hash under ``OUT/runs``):

* **autoscaled**: every combination of ``min_replicas`` x ``max_replicas`` x ``target``
  (min <= max), the cluster starting at ``min_replicas`` replicas; one run per seed;
* **static**: autoscaling off, the smallest replica count in ``static_range`` that passes,
  by bisection (more replicas never lower attainment: the search assumes it, and the
  frontier shows every probe so a violation is visible).

A run **passes** when its SLO attainment (requests meeting their class's objectives over
the steady window's arrivals; ``metrics.warmup: 0`` makes that the whole day) is at least
``attainment``, no request is rejected or unfinished, and the plan's ``slo`` holds; a
setting passes when every seed passes. GPU-hours: the autoscaler's (per replica, GPUs x
time held) and, static, replicas x GPUs x the run's simulated time; means over seeds.

The answer is the passing autoscaled setting with the fewest GPU-hours (ties: smaller
``max_replicas``, then ``min_replicas``, then ``target``), with the GPU-hours it saves
against the smallest passing static count; ``choice: none`` when no setting passes.
Speed: each candidate is one simulated day per seed, played compressed by the largest
factor ``c`` that keeps the autoscaler quasi-static (:mod:`sim.study.daycompress`: rates
kept, durations divided by ``c``, GPU-hours multiplied back by ``c``); ``compress: false``
plays the day as given. The answer names ``c`` and why (``compression``), and a plan whose
runs measured a slower scale-out than the estimate behind ``c`` says so in one line. An
overload lasts ``c`` times less compressed (:data:`OVERLOAD_NOTE`, printed with a compressed
answer): the static count may be one short at the edge, the saving a lower bound.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pandas as pd
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from engine.errors import InputError
from engine.limits import CheckedModel
from engine.units import parse_duration
from sim.study.daycompress import Compression, GivenDay, bound_for, choose
from sim.study.sweep.resultcache import RunCache
from sim.study.sweep.spec import Point, build_points

if TYPE_CHECKING:
    from sim.study.planspec import PlanFile
    from sim.study.sweep.execute import Runner


#: the answer line of a compressed plan on what compression does not keep
#: (docs/design/autoscaling.md, "Compressing the day")
OVERLOAD_NOTE = (
    "note: an overload (the peak above a static count, or above an autoscaler at its max) "
    "lasts {c}x less and queues {c}x less deep compressed: the static count may be one short "
    "at the edge, the saving a lower bound"
)


class DayCfg(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """A plan for a day (sim/study/dayplan.py): the autoscaler settings tried, the static
    range, and the attainment both must keep."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    attainment: float = Field(0.99, gt=0, le=1)
    """Least SLO attainment of the day (share of requests meeting their class objectives)."""
    min_replicas: list[int] = Field([1], min_length=1)
    """`autoscale.min_replicas` values tried (each >= 1)."""
    max_replicas: list[int] = Field([8], min_length=1)
    """`autoscale.max_replicas` values tried (each >= 1)."""
    target: list[float] = Field([0.7], min_length=1)
    """`autoscale.target` values tried (each in (0, 1])."""
    static_range: tuple[int, int] = (1, 16)
    """Bounds [low, high] of the static replica count searched (1 <= low <= high)."""
    compress: bool = True
    """Play the day compressed by the largest factor that keeps the autoscaler
    quasi-static (sim/study/daycompress.py; GPU-hours scaled back); false: as given."""
    real_day: Annotated[float, BeforeValidator(parse_duration), Field(gt=0)] | None = None
    """Real length of the scenario's `workload.rate_profile.day` when the scenario plays its
    day faster (e.g. `24h` for a scenario whose day lasts `1h`): the plan stretches the day
    to it, then compresses; GPU-hours are real-time ones. null: the day as given is real."""


def _servers(base: Any, replicas: int) -> int:
    """``cluster.servers`` that gives ``replicas`` replicas of the scenario's shape."""
    c = base.cluster
    g, gps = int(c.gpus_per_replica), int(c.gpus_per_server)
    if g <= gps:
        return -(-replicas // (gps // g))
    return replicas * int(c.servers_per_replica)


class DayPlanner:
    """Runs the two searches of one day plan (see the module docstring)."""

    def __init__(
        self,
        spec: PlanFile,
        scenario: Path,
        runner: Runner,
        cache: RunCache,
        seeds: list[int],
        base: list[str],
    ) -> None:
        if spec.day is None:
            raise ValueError("DayPlanner needs a plan with a day section")
        self.spec, self.day = spec, spec.day
        self.scenario, self.runner, self.cache = scenario, runner, cache
        self.seeds, self.base = seeds, base
        self._compression: Compression | None = None
        self._played: list[str] = []  # the overrides that compress the day
        self.slowest_start_s = 0.0  # the longest decision-to-serving time the runs measured

    def compression(self) -> Compression:
        """The day's compression (computed once; factor 1 when ``compress`` is false)."""
        if self._compression is None:
            self._compression, self._played = self._measure()
        return self._compression

    def _measure(self) -> tuple[Compression, list[str]]:
        from sim.scenario import apply_overrides, load_raw
        from sim.serving.costmodel import load_profile

        raw = apply_overrides(load_raw(self.scenario), self.base, str(self.scenario))
        given = GivenDay.of(raw)
        if given is not None and self.day.real_day is not None:
            given = given.stretched(self.day.real_day / given.day_s)
        probe = 1.0 if given is None else given.probe_factor()
        more = [] if given is None else given.overrides(probe)
        sc = self._build({}, more)[0].scenario
        cold = load_profile(sc.profile).coldstart
        comp = choose(
            sc, probe, self.seeds, cold.provision_s, cold.warmup_s, bound_for(self.day.attainment)
        )
        if not self.day.compress:
            why = "day not compressed (compress: false)"
            comp = Compression(1, comp.reaction_s, comp.share, why)
        return comp, [] if given is None else given.overrides(comp.factor)

    def _build(self, grid: dict[str, list[Any]], more: list[str]) -> list[Point]:
        return build_points(
            self.scenario, grid, self.seeds, self.base + more, self.spec.variant, source="plan"
        )

    def base_points(self, grid: dict[str, list[Any]]) -> list[Point]:
        """The points of ``grid`` on the day as played (compressed), every seed."""
        self.compression()
        return self._build(grid, self._played)

    def _judge(self, pts: list[Point]) -> dict[str, Any]:
        """Run ``pts`` (one setting, every seed): passes, mean GPU-hours and attainment."""
        from sim.study.planspec import run_passes  # planspec imports this module

        batch = self.runner.run(pts, self.cache)
        ok, gpu_h, att, why = True, [], [], []
        for p in pts:
            rec = batch.records.get(p.config_hash)
            m = rec["metrics"] if rec is not None and rec.get("status") == "ok" else None
            if m is None:
                ok = False
                why.append(f"seed {p.seed}: run failed")
                continue
            a = m.get("slo_attainment")
            att.append(float(a) if a is not None else 0.0)
            lost = int(m.get("requests.rejected") or 0) + int(m.get("requests.unfinished") or 0)
            h = m.get("autoscale.gpu_hours")
            if h is None:
                sc = p.scenario
                h = sc.cluster.replicas * sc.cluster.gpus_per_replica * m["sim_time_s"] / 3600
            gpu_h.append(float(h) * self.compression().factor)
            start = m.get("autoscale.decision_to_serving_s.max")
            if start is not None:
                self.slowest_start_s = max(self.slowest_start_s, float(start))
            reasons = run_passes(m, self.spec.slo)[1]
            if att[-1] < self.day.attainment:
                reasons.append(f"attainment {att[-1]:.4f} < {self.day.attainment}")
            if lost:
                reasons.append(f"{lost} requests rejected or unfinished")
            if reasons:
                ok = False
                why.append(f"seed {p.seed}: {'; '.join(reasons)}")
        n = max(len(gpu_h), 1)
        return {
            "meets_slo": ok,
            "gpu_hours": sum(gpu_h) / n if gpu_h else None,
            "attainment": sum(att) / max(len(att), 1) if att else None,
            "reason": " | ".join(why),
        }

    def autoscaled(self) -> list[dict[str, Any]]:
        """One row per autoscaler setting tried."""
        rows = []
        base = self.base_points({})[0].scenario
        for lo, hi, tgt in itertools.product(
            self.day.min_replicas, self.day.max_replicas, self.day.target
        ):
            if lo > hi:
                continue
            grid: dict[str, list[Any]] = {
                "autoscale.enabled": [True],
                "autoscale.min_replicas": [lo],
                "autoscale.max_replicas": [hi],
                "autoscale.target": [tgt],
                "cluster.servers": [_servers(base, lo)],
            }
            res = self._judge(self.base_points(grid))
            rows.append(
                {
                    "kind": "autoscaled",
                    "min_replicas": lo,
                    "max_replicas": hi,
                    "target": tgt,
                    "replicas": None,
                    **res,
                }
            )
        return rows

    def static(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The smallest passing static replica count (None: none in range) and every probe."""
        base = self.base_points({})[0].scenario
        lo, hi = self.day.static_range
        rows: dict[int, dict[str, Any]] = {}

        def probe(n: int) -> bool:
            if n not in rows:
                grid: dict[str, list[Any]] = {
                    "autoscale.enabled": [False],
                    "cluster.servers": [_servers(base, n)],
                }
                rows[n] = {
                    "kind": "static",
                    "min_replicas": None,
                    "max_replicas": None,
                    "target": None,
                    "replicas": n,
                    **self._judge(self.base_points(grid)),
                }
            return bool(rows[n]["meets_slo"])

        if not probe(hi):
            return None, [rows[k] for k in sorted(rows)]
        while lo < hi:
            mid = (lo + hi) // 2
            if probe(mid):
                hi = mid
            else:
                lo = mid + 1
        return hi, [rows[k] for k in sorted(rows)]


def run_day(spec: PlanFile, planner: DayPlanner) -> tuple[pd.DataFrame, dict[str, Any], list[str]]:
    """Both searches: the frontier, the answer (``choice``: the best autoscaled setting or
    ``none``; ``static_replicas``; GPU-hours of both; ``saved``) and answer sentences."""
    day = spec.day
    if day is None or any(v < 1 for v in day.min_replicas + day.max_replicas):
        raise InputError("day: min_replicas and max_replicas need values >= 1", source="plan")
    auto = planner.autoscaled()
    n_static, static_rows = planner.static()
    df = pd.DataFrame(auto + static_rows)
    passing = [r for r in auto if r["meets_slo"]]
    best = min(
        passing,
        key=lambda r: (r["gpu_hours"], r["max_replicas"], r["min_replicas"], r["target"]),
        default=None,
    )
    static_h = next((r["gpu_hours"] for r in static_rows if r["replicas"] == n_static), None)
    answer: dict[str, Any] = {
        "choice": "none" if best is None else "autoscaled",
        "autoscale": None
        if best is None
        else {k: best[k] for k in ("min_replicas", "max_replicas", "target")},
        "gpu_hours": None if best is None else best["gpu_hours"],
        "attainment": None if best is None else best["attainment"],
        "static_replicas": n_static,
        "static_gpu_hours": static_h,
        "saved": None if best is None or static_h is None else 1.0 - best["gpu_hours"] / static_h,
    }
    comp = planner.compression()
    answer["compression"] = {
        "factor": comp.factor,
        "reaction_s": comp.reaction_s,
        "catch_up_share": None if comp.share != comp.share else comp.share,
        "reason": comp.reason,
    }
    lines = [comp.reason]
    if comp.factor > 1:
        lines.append(OVERLOAD_NOTE.format(c=comp.factor))
    late = _late_start_line(planner, comp)
    if late:
        lines.append(late)
    if best is None:
        lines.append(f"no autoscaler setting keeps attainment >= {day.attainment}")
    else:
        lines.append(
            f"autoscale min {best['min_replicas']} max {best['max_replicas']} target "
            f"{best['target']:g}: {best['gpu_hours']:.4g} GPU-hours at attainment "
            f"{best['attainment']:.4f}"
        )
    if n_static is None:
        lines.append(f"static: no count in {list(day.static_range)} keeps the attainment")
    else:
        lines.append(f"static peak provisioning: {n_static} replicas, {static_h:.4g} GPU-hours")
    if answer["saved"] is not None:
        lines.append(f"GPU-hours saved by autoscaling: {answer['saved'] * 100:.1f}%")
    return df, answer, lines


def _late_start_line(planner: DayPlanner, comp: Compression) -> str | None:
    """One warning line when the runs measured a scale-out slow enough (a coupled
    checkpoint load, a congested stream) that the catch-up share at the factor used
    exceeds the bound."""
    if comp.factor == 1 or comp.share != comp.share:
        return None
    a = planner.base_points({})[0].scenario.autoscale
    measured = a.interval + max(a.cooldown + planner.slowest_start_s, a.scale_in_delay)
    share = comp.share * measured / comp.reaction_s
    bound = bound_for(planner.day.attainment)
    if share <= bound:
        return None
    return (
        f"warning: a scale-out took {planner.slowest_start_s:.3g} s to serve, so R is "
        f"{measured:.3g} s and the catch-up share at c = {comp.factor} is {share:.3g} > "
        f"{bound:g}; rerun with compress: false to check"
    )


def day_png(df: pd.DataFrame, answer: dict[str, Any], path: Path) -> Path:
    """``frontier.png`` of a day plan: GPU-hours of every setting tried (autoscaled and
    static), passing ones solid, failing ones hatched, the answer and the static count
    outlined."""
    from sim.study.plots import _save, figure_with_axes

    fig, ax = figure_with_axes(figsize=(max(6.0, 0.5 * len(df) + 2), 4))
    labels, colours = [], []
    for r in df.to_dict("records"):
        if r["kind"] == "autoscaled":
            labels.append(f"{r['min_replicas']:.0f}-{r['max_replicas']:.0f} @{r['target']:g}")
            colours.append("tab:green")
        else:
            labels.append(f"static {r['replicas']:.0f}")
            colours.append("tab:gray")
    bars = ax.bar(range(len(df)), df["gpu_hours"].fillna(0.0), color=colours)
    best = answer.get("autoscale") or {}
    for bar, r in zip(bars, df.to_dict("records"), strict=True):
        if not r["meets_slo"]:
            bar.set_hatch("//")
            bar.set_alpha(0.5)
        chosen = r["kind"] == "autoscaled" and all(r[k] == v for k, v in best.items()) and best
        if chosen or (r["kind"] == "static" and r["replicas"] == answer.get("static_replicas")):
            bar.set_edgecolor("black")
            bar.set_linewidth(2)
    ax.set_xticks(range(len(df)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GPU-hours over the day")
    saved = answer.get("saved")
    tail = f": autoscaling saves {saved * 100:.1f}%" if saved is not None else ""
    ax.set_title(f"Day plan (min-max @target; hatched: misses the attainment){tail}")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _save(fig, path)
