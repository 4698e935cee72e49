"""Engine vs simulator: run one workload on the real engine and in the simulator, compare.

:func:`validate_workload` runs a :class:`hwbench.workloads.ValidationWorkload` on both sides
with the same model, capacities and policies (:mod:`hwbench.validation_models`):

* **engine** -- :func:`hwbench.validation_engine.run_engine`: the weights as verified chunks
  in a local object store under a warm device -> host -> SSD tier stack, the requests served
  in real time;
* **simulator** -- :func:`run_simulator`: the scenario folder of
  :func:`hwbench.validation_scenario.write_scenario`, built exactly as ``pdsim run`` builds a
  scenario (the plain :class:`sim.serving.costmodel.CostModel`: op tables and engine terms), so
  ``pdsim run DIR/scenario.yaml`` reproduces the simulator's figures;

and compares them (:func:`hwbench.comparison.compare`). This module is the validation's
public interface: it also exports the names of those modules that its callers use.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

from hwbench.comparison import Comparison, compare, median_requests, plot_cdfs
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
    "Sizes",
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
    "run_engine",
    "run_simulator",
    "scenario_dict",
    "sim_catalogue",
    "sizes",
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
    """Run ``w`` on the engine and in the simulator and compare (scratch files in ``workdir``
    or a temporary directory). ``repeats``: serve ``w`` that many times on the engine (a
    fresh warm stack each time) and compare the simulator (deterministic, run once) with the
    engine's per-request medians (:func:`median_requests`; hits and bytes per tier: the
    medians over the runs). ``xp``: the engine's array backend (NumPy or CuPy).
    ``scenario_dir``: where the simulator's scenario folder goes (kept; default: scratch).
    Raises ``ValueError`` when ``repeats`` < 1."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    name = model_config(w).name
    with tempfile.TemporaryDirectory(prefix="pdsim-validate-") as tmp:
        base = Path(workdir) if workdir is not None else Path(tmp)
        wdir = base / w.name
        wdir.mkdir(parents=True, exist_ok=True)
        sdir = scenario_dir if scenario_dir is not None else wdir / "scenario"
        sim_df, sh, sb, _, _ = run_simulator(w, profile, sdir)
        frames: list[pd.DataFrame] = []
        hits: list[np.ndarray] = []
        nbytes: list[np.ndarray] = []
        for k in range(repeats):
            rdir = wdir / f"engine{k}"
            res, _ = run_engine(w, rdir, engine_parts(w, rdir, xp))
            frames.append(res.frame(name))
            hits.append(res.tier_hits)
            nbytes.append(res.tier_bytes)
    eng_hits, eng_bytes = np.median(hits, axis=0), np.median(nbytes, axis=0)
    return compare(w.name, median_requests(frames), eng_hits, eng_bytes, sim_df, sh, sb)
