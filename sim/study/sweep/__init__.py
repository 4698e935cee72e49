"""Sweeps: many independent runs of one scenario over a grid of overrides and seeds.

``spec`` builds and validates the points, ``cache`` keeps one record per finished run so a
sweep resumes, ``execute`` runs them in-process or on Dask and gathers one DataFrame.
"""

from sim.study.sweep.execute import Runner, SweepOutcome, execute, results_frame, run_point
from sim.study.sweep.flatten import direction, flatten, headline
from sim.study.sweep.resultcache import RunCache
from sim.study.sweep.spec import (
    Point,
    SweepFile,
    build_points,
    load_sweep_file,
    parse_grid,
    points_from_file,
    seed_list,
)

__all__ = [
    "Point",
    "RunCache",
    "Runner",
    "SweepFile",
    "SweepOutcome",
    "build_points",
    "direction",
    "execute",
    "flatten",
    "headline",
    "load_sweep_file",
    "parse_grid",
    "points_from_file",
    "results_frame",
    "run_point",
    "seed_list",
]
