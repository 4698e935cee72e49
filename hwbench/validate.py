"""Engine vs simulator: run workloads on the real engine and in the simulator, compare.

:func:`validate_suite` runs :class:`hwbench.workloads.ValidationWorkload` s on both sides
(:func:`validate_workload`: one of them)
with the same model, capacities and policies (:mod:`hwbench.validation_models`):

* **engine** -- :func:`hwbench.validation_engine.run_engine`: the weights as verified chunks
  in a local object store under a warm device -> host -> SSD tier stack, the requests served
  in real time;
* **simulator** -- :func:`run_simulator`: the scenario folder of
  :func:`hwbench.validation_scenario.write_scenario`, built exactly as ``pdsim run`` builds a
  scenario (the plain :class:`sim.serving.costmodel.CostModel`: op tables and engine terms), so
  ``pdsim run DIR/scenario.yaml`` reproduces the simulator's figures;

and compares them (:func:`hwbench.comparison.compare`); :func:`run_suite` also replays each
engine run on its own iteration times (:mod:`hwbench.schedcheck`, the scheduling model alone)
and prices each engine iteration (:mod:`hwbench.costcheck`, the cost model alone). This module is the validation's
public interface: it also exports the names of those modules that its callers use.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

from engine.runtime.engine import EngineResult
from hwbench.comparison import Comparison, compare, median_requests, plot_cdfs, run_cv
from hwbench.costcheck import CostRow, cost_rows
from hwbench.schedcheck import SchedCheck, check_workload
from hwbench.validation_engine import (
    engine_for,
    engine_parts,
    excludes_cpu_wait,
    run_engine,
    workload_for,
)
from hwbench.validation_models import (
    CHUNK_BYTES,
    HOLD_PINS,
    Sizes,
    catalogue_text,
    decoder_config,
    dense_config,
    model_config,
    sim_catalogue,
    sizes,
)
from hwbench.validation_scenario import scenario_dict, write_scenario
from hwbench.workloads import ValidationWorkload
from sim.cluster import Cluster, build
from sim.scenario import load_scenario
from sim.serving.costmodel import CostModel, Profile, load_profile
from sim.serving.metrics import requests_frame
from sim.serving.models import load_catalogue

__all__ = [
    "CHUNK_BYTES",
    "HOLD_PINS",
    "Comparison",
    "CostRow",
    "SchedCheck",
    "Sizes",
    "SuiteRun",
    "catalogue_text",
    "compare",
    "decoder_config",
    "dense_config",
    "engine_for",
    "engine_parts",
    "excludes_cpu_wait",
    "median_requests",
    "model_config",
    "plot_cdfs",
    "run_cv",
    "run_engine",
    "run_simulator",
    "run_suite",
    "scenario_dict",
    "sim_catalogue",
    "sizes",
    "validate_suite",
    "validate_workload",
    "workload_for",
    "write_scenario",
]


def run_simulator(
    w: ValidationWorkload, profile: Profile, workdir: Path
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, float, Cluster]:
    """Simulate ``w`` from the scenario folder :func:`write_scenario` writes into
    ``workdir``, built as ``pdsim run`` builds it (seed 0): (requests frame, tier hits,
    tier bytes, end time, the cluster)."""
    path = write_scenario(w, profile, workdir)
    sc = load_scenario(path)
    cat = load_catalogue(sc.catalogue)
    cl = build(sc, 0, cat, load_profile(sc.profile), CostModel, path.parent)
    end = cl.run()
    met = cl.ctx.metrics
    names = [d.model for d in sc.deployments]
    df = requests_frame(met, cl.wl, names, [c.name for c in sc.workload.classes])
    return df, met.tier_hits.copy(), met.tier_bytes.copy(), end, cl


def validate_workload(
    w: ValidationWorkload,
    profile: Profile,
    workdir: Path | None = None,
    *,
    repeats: int = 1,
    xp: ModuleType = np,
    scenario_dir: Path | None = None,
) -> Comparison:
    """:func:`validate_suite` of ``w`` alone (its simulator scenario folder in
    ``scenario_dir``, kept; default: scratch)."""
    dirs = None if scenario_dir is None else {w.name: Path(scenario_dir)}
    return validate_suite([w], profile, workdir, repeats=repeats, xp=xp, scenario_dirs=dirs)[0]


def validate_suite(
    workloads: Sequence[ValidationWorkload],
    profile: Profile,
    workdir: Path | None = None,
    *,
    repeats: int = 1,
    xp: ModuleType = np,
    scenario_dirs: Mapping[str, Path] | None = None,
    on_run: Callable[[ValidationWorkload, int], None] | None = None,
) -> list[Comparison]:
    """The end-to-end comparisons of :func:`run_suite` (same arguments)."""
    return run_suite(
        workloads,
        profile,
        workdir,
        repeats=repeats,
        xp=xp,
        scenario_dirs=scenario_dirs,
        on_run=on_run,
    ).comparisons


@dataclass
class SuiteRun:
    """What :func:`run_suite` measured: per workload (in order) the end-to-end comparison,
    the scheduling-model check and the cost-model rows, and the reference workload's
    seconds timed before the first engine run and after each (empty without a
    ``reference``)."""

    comparisons: list[Comparison]
    scheduling: list[SchedCheck]
    cost: list[CostRow]
    reference_s: list[float] = field(default_factory=list)


def run_suite(
    workloads: Sequence[ValidationWorkload],
    profile: Profile,
    workdir: Path | None = None,
    *,
    repeats: int = 1,
    xp: ModuleType = np,
    scenario_dirs: Mapping[str, Path] | None = None,
    on_run: Callable[[ValidationWorkload, int], None] | None = None,
    reference: Callable[[], float] | None = None,
) -> SuiteRun:
    """Run each of ``workloads`` on the engine and in the simulator and check them three
    ways (scratch files in ``workdir`` or a temporary directory):

    * **end to end** -- the simulator with ``profile`` against the engine, one
      :class:`Comparison` per workload;
    * **scheduling model** -- each engine run replayed through the simulator on its own
      iteration times (:mod:`hwbench.schedcheck`);
    * **cost model** -- the profile's price of every engine iteration against its measured
      time (:mod:`hwbench.costcheck`).

    The simulator (deterministic) runs each workload once, from the scenario folder
    ``scenario_dirs[NAME]`` (kept; a workload not in it, or no ``scenario_dirs``: scratch).
    The engine serves each workload ``repeats`` times (a fresh warm stack each time),
    **interleaved**: pass ``k`` serves every workload once, in order, before pass ``k + 1``
    starts, so a workload's runs are spread over the whole validation and a spell of the
    machine running slow or fast for a minute or two falls on one or two of them, which the
    per-request median (:func:`median_requests`) then leaves out. Back to back, such a spell
    could take every run of one workload. Hits and bytes per tier: the medians over the
    runs. ``xp``: the engine's array backend (NumPy or CuPy). ``on_run(w, k)`` is called
    before each engine run; ``reference()`` (the machine's speed: seconds of a fixed
    workload) before the first engine run and after each. Raises ``ValueError`` when
    ``repeats`` < 1 or two workloads share a name."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise ValueError(f"workload names must differ, got {names}")
    runs: dict[str, list[EngineResult]] = {n: [] for n in names}
    refs: list[float] = []
    sched: list[SchedCheck] = []
    with tempfile.TemporaryDirectory(prefix="pdsim-validate-") as tmp:
        base = Path(workdir) if workdir is not None else Path(tmp)
        sims = {}
        for w in workloads:
            sdir = (scenario_dirs or {}).get(w.name, base / w.name / "scenario")
            sims[w.name] = run_simulator(w, profile, sdir)
        if reference is not None:
            refs.append(reference())
        for k in range(repeats):
            for w in workloads:
                if on_run is not None:
                    on_run(w, k)
                rdir = base / w.name / f"engine{k}"
                runs[w.name].append(run_engine(w, rdir, engine_parts(w, rdir, xp))[0])
                if reference is not None:
                    refs.append(reference())
        for w in workloads:
            sched.append(check_workload(w, profile, runs[w.name], base / w.name))
    out = []
    cost: list[CostRow] = []
    for w in workloads:
        sim_df, sh, sb, _, _ = sims[w.name]
        res = runs[w.name]
        frames = [r.frame(model_config(w).name) for r in res]
        eng_hits = np.median([r.tier_hits for r in res], axis=0)
        eng_bytes = np.median([r.tier_bytes for r in res], axis=0)
        eng = median_requests(frames)
        out.append(compare(w.name, eng, eng_hits, eng_bytes, sim_df, sh, sb, runs=frames))
        cost.extend(cost_rows(w, profile, res))
    return SuiteRun(out, sched, cost, refs)
