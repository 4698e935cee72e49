"""The scheduling-model check: an engine run replayed through the simulator on its own times.

One engine run of a validation workload records every iteration (its batch shape and, on the
run clock, when it became due and when the engine next checked for arrivals:
:class:`engine.runtime.engine.IterationRecord`). :func:`replay` simulates the same workload
(the scenario of :func:`hwbench.validation_scenario.write_scenario`) with each iteration
priced by that recording (:class:`sim.serving.recordedcost.RecordedCost`: iteration ``i``
costs ``settled - due`` of the engine's iteration ``i``) and every copy instant (the profile's
links at :data:`INSTANT_BANDWIDTH`, no serving-loop terms), so all simulated time comes from
the engine. What is left to differ is the scheduling model: which batches form, who waits,
KV blocks and preemption, when each token comes out. Machine speed cannot move it: a slow
run is replayed with its own slow iterations.

:func:`check_run` compares the replay with the run request by request: TTFT, TPOT (time per
output token after the first) and end-to-end latency, P50 and P99 (:data:`SCHED_LIMITS`), and
the scheduler's batch log on both sides (step, admitted, preempted, prefill chunks, decodes).
A replay whose batch differs from the engine's stops at that step
(:class:`sim.serving.recordedcost.ReplayMismatch`); the check then reports the mismatch, a
finding about the scheduling model, instead of latencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.runtime.engine import EngineResult, IterationRecord
from hwbench.validation_scenario import write_scenario
from hwbench.workloads import ValidationWorkload
from sim.cluster import build
from sim.scenario import load_scenario
from sim.serving.costmodel import LINK_NAMES, CostModel, LinkProfile, Profile, load_profile
from sim.serving.metrics import requests_frame
from sim.serving.models import ModelSpec, load_catalogue
from sim.serving.recordedcost import RecordedCost, RecordedIteration, ReplayMismatch

__all__ = [
    "INSTANT_BANDWIDTH",
    "METRICS",
    "SCHED_LIMITS",
    "RunCheck",
    "SchedCheck",
    "check_run",
    "check_workload",
    "instant_profile",
    "recorded_iterations",
    "replay",
    "request_metrics",
]

#: the largest relative error of each replayed figure against the engine run's
SCHED_LIMITS = {"p50": 0.02, "p99": 0.05}
#: the per-request figures compared: TTFT, TPOT, end-to-end latency
METRICS = ("ttft", "tpot", "e2e")
#: bytes/s of every link in the replay's profile: a 4 MiB chunk moves in ~4e-12 s
INSTANT_BANDWIDTH = 1e18


def recorded_iterations(log: Sequence[IterationRecord]) -> list[RecordedIteration]:
    """The engine run's iterations as the replay charges them: ``settled - due`` seconds and
    the batch's shape (both sides count a decoding request's context as its prompt plus the
    tokens sampled before the step)."""
    return [
        RecordedIteration(
            r.settled - r.due,
            int(r.prompt_tokens),
            float(r.prompt_sq_tokens),
            int(r.new),
            int(r.decode_batch),
            float(r.decode_context),
        )
        for r in log
    ]


def instant_profile(profile: Profile) -> Profile:
    """``profile`` with every link (and host DRAM) at :data:`INSTANT_BANDWIDTH` and zero
    latency: weight copies take no simulated time, so a replay's time is the recording's."""
    fast = LinkProfile(bandwidth=INSTANT_BANDWIDTH, latency=0.0)
    links = profile.links.model_copy(update={name: fast for name in LINK_NAMES})
    host = profile.host.model_copy(update={"dram_bandwidth": INSTANT_BANDWIDTH})
    return profile.model_copy(update={"links": links, "host": host})


class _ReplayCost(CostModel):
    """A :class:`CostModel` whose iteration price is a recording and that charges no
    serving-loop terms (the recording's seconds hold them)."""

    records: Sequence[RecordedIteration] = ()

    def __init__(
        self, profile: Profile, model: ModelSpec, tp: int = 1, pp: int = 1, gpus_per_server: int = 1
    ) -> None:
        super().__init__(profile, model, tp, pp, gpus_per_server)
        self.iteration = RecordedCost(self.records, counts=self.iteration, tp=tp, pp=pp)
        self.engine_terms = None
        self.wake_s = self.iter_gap_s = 0.0
        self.prefetch_compute_s_per_byte = self.prefetch_handoff_s = 0.0


@dataclass
class Replay:
    """A replay's outcome: the simulator's request table and batch log, and the mismatch
    that stopped it (None: it ran the whole recording)."""

    frame: pd.DataFrame | None
    batches: list[Any]
    mismatch: ReplayMismatch | None
    param_wait_s: float = 0.0


def replay(w: ValidationWorkload, profile: Profile, result: EngineResult, workdir: Path) -> Replay:
    """Simulate ``w`` with each iteration costing the engine run ``result``'s (module
    docstring), from a scenario folder written to ``workdir``."""
    records = recorded_iterations(result.iteration_log)
    cost_cls = type("_Recorded", (_ReplayCost,), {"records": records})
    path = write_scenario(w, instant_profile(profile), workdir)
    sc = load_scenario(path)
    cat = load_catalogue(sc.catalogue)
    cl = build(sc, 0, cat, load_profile(sc.profile), cost_cls, path.parent)
    node = cl.ctx.nodes[0]
    node.sched.batch_log = []
    try:
        cl.run()
    except ReplayMismatch as exc:
        return Replay(None, list(node.sched.batch_log), exc)
    cost = cl.ctx.models[0].cost.iteration
    if isinstance(cost, RecordedCost) and not cost.exhausted:
        got = (0, 0.0, 0, 0, 0.0)
        return Replay(None, list(node.sched.batch_log), ReplayMismatch(cost.cursor, None, got))
    met = cl.ctx.metrics
    names = [d.model for d in sc.deployments]
    df = requests_frame(met, cl.wl, names, [c.name for c in sc.workload.classes])
    return Replay(df, list(node.sched.batch_log), None, float(met.param_wait))


def request_metrics(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per request done, in request order: ``ttft`` (first token - arrival), ``tpot``
    ((end - first token) / (output tokens - 1), requests of two or more tokens) and ``e2e``
    (end - arrival), seconds."""
    d = df[df["status"] == "done"]
    if "request_id" in d:
        d = d.sort_values("request_id")
    arrival = d["arrival"].to_numpy(float)
    first = d["first_token"].to_numpy(float)
    end = d["end"].to_numpy(float)
    out_tok = d["output_tokens"].to_numpy(float)
    multi = out_tok > 1
    return {
        "ttft": first - arrival,
        "tpot": (end[multi] - first[multi]) / (out_tok[multi] - 1),
        "e2e": end - arrival,
    }


def _rel(engine: float, sim: float) -> float:
    if engine == 0:
        return 0.0 if sim == 0 else math.inf
    return sim / engine - 1.0


@dataclass
class RunCheck:
    """One engine run against its replay: ``errors[metric_stat]`` (``ttft_p50`` ...,
    relative, replay vs engine), the engine's figures, the first differing batch (None:
    the logs agree) and the replay's mismatch message (None: it ran to the end)."""

    errors: dict[str, float]
    engine: dict[str, float]
    batch_diff: str | None
    mismatch: str | None
    iterations: int


def _first_batch_diff(engine: Sequence[Any], sim: Sequence[Any]) -> str | None:
    for i, (a, b) in enumerate(zip(engine, sim, strict=False)):
        if tuple(a) != tuple(b):
            return f"batch {i}: engine {tuple(a)}, simulator {tuple(b)}"
    if len(engine) != len(sim):
        return f"{len(engine)} batches on the engine, {len(sim)} in the simulator"
    return None


def check_run(
    w: ValidationWorkload, profile: Profile, result: EngineResult, workdir: Path
) -> RunCheck:
    """Replay engine run ``result`` of ``w`` (:func:`replay`) and compare (module docstring)."""
    rep = replay(w, profile, result, workdir)
    eng = request_metrics(result.frame("engine"))
    figures = {
        f"{m}_{s}": float(np.percentile(v, q)) if v.size else math.nan
        for m, v in eng.items()
        for s, q in (("p50", 50), ("p99", 99))
    }
    n = len(result.iteration_log)
    if rep.frame is None:
        msg = str(rep.mismatch)
        return RunCheck({}, figures, None, msg, n)
    sim = request_metrics(rep.frame)
    errors: dict[str, float] = {}
    for m in METRICS:
        for s, q in (("p50", 50), ("p99", 99)):
            a, b = eng[m], sim[m]
            if a.size and b.size:
                errors[f"{m}_{s}"] = _rel(float(np.percentile(a, q)), float(np.percentile(b, q)))
    diff = _first_batch_diff(result.batch_log or [], rep.batches)
    return RunCheck(errors, figures, diff, None, n)


@dataclass
class SchedCheck:
    """The scheduling-model check of one workload over its engine runs."""

    workload: str
    runs: list[RunCheck] = field(default_factory=list)

    def worst(self) -> dict[str, float]:
        """Per figure, the run error of the largest magnitude (signed)."""
        out: dict[str, float] = {}
        for r in self.runs:
            for k, v in r.errors.items():
                if k not in out or abs(v) > abs(out[k]):
                    out[k] = v
        return out

    def failures(self) -> list[str]:
        """One line per figure over its limit, per batch that differs and per replay that
        stopped on a mismatch."""
        lines: list[str] = []
        for k, v in self.worst().items():
            lim = SCHED_LIMITS[k.rsplit("_", 1)[1]]
            if not abs(v) <= lim:
                lines.append(f"{self.workload}: scheduling {k} {v * 100:+.2f}% OVER {lim:.0%}")
        for i, r in enumerate(self.runs):
            if r.mismatch is not None:
                lines.append(f"{self.workload} run {i + 1}: {r.mismatch}")
            elif r.batch_diff is not None:
                lines.append(f"{self.workload} run {i + 1}: batches differ: {r.batch_diff}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: worst errors, per-run errors and findings."""
        return {
            "workload": self.workload,
            "worst_rel_error": self.worst(),
            "runs": [
                {
                    "errors": r.errors,
                    "engine": r.engine,
                    "iterations": r.iterations,
                    "batch_diff": r.batch_diff,
                    "mismatch": r.mismatch,
                }
                for r in self.runs
            ],
            "failed": self.failures(),
        }


def check_workload(
    w: ValidationWorkload, profile: Profile, results: Sequence[EngineResult], workdir: Path
) -> SchedCheck:
    """:func:`check_run` of every engine run of ``w`` (replay folders under ``workdir``)."""
    out = SchedCheck(w.name)
    for i, res in enumerate(results):
        out.runs.append(check_run(w, profile, res, workdir / f"replay{i}"))
    return out
