"""Capacity claims (R21): the highest offered load each variant sustains at the SLO, per GPU.

A claim with a ``capacity:`` section (:class:`sim.scenario.CapacityCfg`) is measured on a
ladder of offered loads instead of at the scenario's own load. For each variant the claim
compares and each seed, the runs climb the ladder in order; a rung **passes** when the run
serves every request (none rejected or unfinished) and every workload class's P99 end-to-end
latency (over the steady window's arrivals) is within the class's ``slo``
(:func:`rung_passes`). The run's ``overloaded`` flag (achieved < 95% of offered in the
steady window) is not used: at the low rungs a window holds ~30 requests and the flag fires on
their Poisson noise with the GPU a quarter busy. Over a bounded duration a backlog shows in
the tail instead: a load ``x`` above capacity ``c`` for ``D`` seconds of arrivals makes the
last ones wait about ``D (x / c - 1)``, so with 60 s of arrivals and a 10 s SLO an overload
of more than ~1.17x fails its rung (the ladder's steps are ~1.25x). The seed's capacity is
the highest load up to which every rung passed (0 when the first fails): a seed stops
climbing at its first failure, as :mod:`sim.study.plan`'s search assumes more load never helps.
Divided by the variant's GPUs (``cluster.gpus``) it is the goodput at the SLO per GPU: at a
passing rung every request finished and 99% of each class within its SLO.

The paired seeds' capacities then go through the same bootstrap and verdict as any claim
(:func:`sim.study.claims.effect`, :func:`sim.study.claims.verdict`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.scenario import CapacityCfg, Scenario
from sim.study.planspec import SloCfg, run_passes
from sim.study.sweep.execute import Runner
from sim.study.sweep.resultcache import RunCache
from sim.study.sweep.spec import Point, build_points


def climb(
    names: list[str],
    seeds: list[int],
    loads: list[float],
    passes: Callable[[list[tuple[str, int]], float], dict[tuple[str, int], bool]],
) -> dict[tuple[str, int], float]:
    """Per ``(name, seed)`` the highest of ``loads`` up to which every rung passed (0.0 when
    the first fails). ``passes(pairs, load)`` runs one rung for the pairs still climbing (one
    batch) and says which passed; a pair that fails stops climbing."""
    cap = {(n, s): 0.0 for n in names for s in seeds}
    climbing = list(cap)
    for load in loads:
        if not climbing:
            break
        ok = passes(climbing, load)
        for pair in climbing:
            if ok[pair]:
                cap[pair] = load
        climbing = [pair for pair in climbing if ok[pair]]
    return cap


def class_slo(sc: Scenario) -> SloCfg:
    """Each class's P99 end to end within its ``slo`` (the latency half of a rung's rule)."""
    limits = {c.name: c.slo for c in sc.workload.classes}
    return SloCfg(p99=limits, sustain=False, availability=None, degraded_rate=None)


def rung_passes(m: dict[str, Any] | None, slo: SloCfg) -> tuple[bool, list[str]]:
    """Whether one rung's run (flattened metrics; ``None``: it failed) passes, and why not:
    every request served (none rejected or unfinished) and ``slo`` met."""
    if m is None:
        return False, ["run failed"]
    why = run_passes(m, slo)[1]
    lost = int(m.get("requests.rejected") or 0) + int(m.get("requests.unfinished") or 0)
    if lost:
        why.append(f"{lost} requests rejected or unfinished")
    return not why, why


def rung_points(
    path: str | Path,
    cfg: CapacityCfg,
    name: str,
    seeds: list[int],
    load: float,
    base: list[str] | None = None,
) -> list[Point]:
    """The runs of one rung: variant ``name`` at ``load`` on ``seeds`` (validated)."""
    src = f"{path} ({name}, {cfg.key}={load:g})"
    return build_points(path, {cfg.key: [load]}, seeds, list(base or []), name, source=src)


def capacities(
    path: str | Path,
    sc: Scenario,
    cfg: CapacityCfg,
    names: list[str],
    seeds: list[int],
    cache: RunCache,
    runner: Runner,
    base: list[str] | None = None,
    counts: dict[str, int] | None = None,
) -> dict[str, dict[int, float]]:
    """Per variant name, per seed: its capacity in requests/s per GPU (module docstring).
    ``counts`` (if given) gets ``ran`` and ``cached`` added."""
    slo = class_slo(sc)
    gpus: dict[str, int] = {}

    def passes(pairs: list[tuple[str, int]], load: float) -> dict[tuple[str, int], bool]:
        pts: list[tuple[str, Point]] = []
        for n in names:
            mine = [s for m, s in pairs if m == n]
            if mine:
                ps = rung_points(path, cfg, n, mine, load, base)
                gpus.setdefault(n, ps[0].scenario.cluster.gpus)
                pts += [(n, p) for p in ps]
        batch = runner.run([p for _, p in pts], cache)
        if counts is not None:
            counts["ran"] = counts.get("ran", 0) + batch.ran
            counts["cached"] = counts.get("cached", 0) + batch.cached
        out: dict[tuple[str, int], bool] = {}
        for n, p in pts:
            rec: dict[str, Any] | None = batch.records.get(p.config_hash)
            m = rec["metrics"] if rec is not None and rec.get("status") == "ok" else None
            out[(n, p.seed)] = rung_passes(m, slo)[0]
        return out

    cap = climb(names, seeds, cfg.loads, passes)
    return {n: {s: cap[(n, s)] / max(gpus.get(n, 1), 1) for s in seeds} for n in names}
