"""Replay files: record a (faulty) run, re-run it bit for bit, stop it at a time and look.

A replay file is one JSON object::

    {"format": 1, "package_version": "...", "scenario": {resolved scenario}, "source": "...",
     "seed": 7, "faults_applied": [...], "trace_hash": "...", "findings": [...],
     "sim_time": 3.2}

``scenario`` is the fully resolved scenario (every default filled, units normalised), so a
replay does not depend on the scenario file still existing or on later default changes.
:func:`replay` re-runs it with the same seed and reports whether the event-trace hash (and the
applied fault schedule) match. With ``until`` the run stops at that simulated time and
:func:`run_checked` returns a state dump instead (:meth:`sim.control.faultinject.Control.state`).

:func:`run_checked` is the one entry point chaos runs and replays share: build, attach the
control plane, run, final checks; a checker violation does not raise out of it -- it is
returned as a finding together with the hash of the trace up to the violation (which a replay
reproduces exactly).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from engine.configfile import read_mapping
from engine.errors import InputError
from sim.cluster import build, check_feasible
from sim.control.autoscale import attach as attach_autoscaler
from sim.control.faultinject import attach
from sim.control.faults import check_faults
from sim.control.raft import SafetyViolation
from sim.control.runcheckers import CheckerViolation
from sim.scenario import Scenario, resolved_dict, validate
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.metrics import DEGRADED, DONE, SHED
from sim.serving.models import load_catalogue

FORMAT = 1


class StopAt(Exception):
    """Raised from an event callback to stop a run at a simulated time."""


@dataclass
class Outcome:
    """What :func:`run_checked` found for one (scenario, seed)."""

    seed: int
    trace_hash: str
    findings: list[str] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)
    sim_time: float = 0.0
    availability: float | None = None
    requests_lost: int = 0
    degraded: int = 0
    completed: int = 0
    faults: dict[str, Any] | None = None
    state: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.findings


def package_version() -> str:
    try:
        return version("pdsim")
    except PackageNotFoundError:
        return "unknown"


def run_checked(
    sc: Scenario,
    seed: int,
    until: float | None = None,
    catalogue: dict[str, Any] | None = None,
    profile: Any = None,
) -> Outcome:
    """Run ``sc`` (no variants) with root ``seed`` under the checkers; see the module doc."""
    if sc.variants:
        raise InputError(
            "chaos runs and replays take a scenario without variants",
            source=sc.source,
            where="variants",
        )
    cat = catalogue if catalogue is not None else load_catalogue(sc.catalogue)
    prof = profile if profile is not None else load_profile(sc.profile)
    check_feasible(sc, cat, prof)
    check_faults(sc)
    base = Path(sc.source).parent if Path(sc.source).is_file() else None
    cl = build(sc, seed, cat, prof, CostModel, base)
    ctl = attach(cl)
    attach_autoscaler(cl, prof)  # as sim.runner does, in the same order: the same trace
    env = cl.env
    if until is not None:

        def stop(_e: Any) -> None:
            # every event due at ``until`` runs first (a fault at exactly T is applied),
            # including those scheduled at T by events at T
            if env.peek() <= until:
                env.timeout(0).callbacks.append(stop)
                return
            raise StopAt(until)

        env.timeout(until).callbacks.append(stop)
    finding: str | None = None
    try:
        end = cl.run()
    except StopAt:
        return _stopped(seed, cl, ctl)
    except (CheckerViolation, SafetyViolation) as exc:
        finding = str(exc)
        end = float(env.now)
    met = cl.ctx.metrics
    out = Outcome(seed, "", sim_time=end)
    out.completed = int(np.sum(met.status == DONE))
    out.degraded = int(np.sum(met.status == DEGRADED))
    if ctl is None:
        out.trace_hash = cl.ctx.trace.hexdigest()
        out.state = {"time": end} if until is not None else None
        return out
    out.applied = ctl.applied
    if finding is None:
        try:
            res = ctl.finish(end, cl.ctx.trace.hexdigest())
            out.trace_hash = res["trace_hash"]
            out.faults = res["faults"]
            out.availability = out.faults["availability"]
            out.requests_lost = out.faults["requests_lost"]
            out.findings = list(out.faults["violations"])
            out.state = ctl.state() if until is not None else None
            return out
        except StopAt:  # ``until`` falls in the settling after the last request
            return _stopped(seed, cl, ctl)
        except (CheckerViolation, SafetyViolation) as exc:
            finding = str(exc)
    out.findings = [finding, *[str(x) for x in ctl.checkers.findings if str(x) != finding]]
    out.trace_hash = ctl.combined_hash(cl.ctx.trace.hexdigest())
    out.requests_lost = int(np.sum(met.status == SHED) + np.sum(met.status == 0))
    return out


def replay_record(sc: Scenario, seed: int, out: Outcome) -> dict[str, Any]:
    """The replay file's content for a run of ``sc`` with ``seed`` that gave ``out``."""
    return {
        "format": FORMAT,
        "package_version": package_version(),
        "scenario": resolved_dict(sc),
        "source": sc.source,
        "seed": seed,
        "faults_applied": out.applied,
        "trace_hash": out.trace_hash,
        "findings": out.findings,
        "sim_time": out.sim_time,
    }


def run_replay_record(sc: Scenario, seed: int, result: Any) -> dict[str, Any]:
    """The replay record of an ordinary run (a :class:`sim.runner.RunResult` without variants).

    Its ``trace_hash`` is the run's (the combined data-plane + control-plane hash when faults
    are on) and its schedule the unrounded one applied, so ``pdsim replay`` of it re-runs
    under the checkers and must match.
    """
    out = Outcome(
        seed,
        str(result.summary["trace_hash"]),
        applied=list(result.faults_applied[0]) if result.faults_applied else [],
        sim_time=float(result.summary.get("sim_time_s", 0.0)),
    )
    return replay_record(sc, seed, out)


def variant_replay_records(sc: Scenario, seed: int, result: Any) -> dict[str, dict[str, Any]]:
    """The replay record of each variant of a run of ``sc`` (a scenario with variants), by
    variant name: the variant's own scenario (:func:`sim.scenario.variant`), its trace hash
    and its applied fault schedule, so ``pdsim replay`` re-runs that variant alone."""
    from sim.scenario import variant

    out: dict[str, dict[str, Any]] = {}
    for i, v in enumerate(sc.variants):
        s = result.summary["variants"][v.name]
        applied = result.faults_applied[i] if i < len(result.faults_applied) else []
        o = Outcome(seed, str(s["trace_hash"]), applied=list(applied),
                    sim_time=float(s.get("sim_time_s", 0.0)))  # fmt: skip
        out[v.name] = replay_record(variant(sc, v), seed, o)
    return out


def write_replay(path: str | Path, sc: Scenario, seed: int, out: Outcome | dict[str, Any]) -> Path:
    """Write a replay file atomically (temp file + rename); returns its path. ``out`` is an
    :class:`Outcome` or an already-built record (:func:`run_replay_record`)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    rec = out if isinstance(out, dict) else replay_record(sc, seed, out)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1, default=str) + "\n")
    tmp.replace(p)
    return p


def load_replay(path: str | Path) -> tuple[dict[str, Any], Scenario]:
    """Read and validate a replay file: ``(record, scenario)``; InputError names the file."""
    rec = read_mapping(path, "replay", fmt="json")
    for key in ("format", "scenario", "seed", "trace_hash"):
        if key not in rec:
            raise InputError("required field is missing", source=str(path), where=key)
    if rec["format"] != FORMAT:
        raise InputError(
            f"format {rec['format']!r} is not supported; allowed: {FORMAT}",
            source=str(path),
            where="format",
        )
    if not isinstance(rec["seed"], int) or rec["seed"] < 0:
        raise InputError(f"{rec['seed']!r}: allowed: an int >= 0", source=str(path), where="seed")
    sc = validate(rec["scenario"], source=f"{path} (scenario)")
    return rec, sc


@dataclass
class ReplayReport:
    """Outcome of :func:`replay`."""

    expected: str
    got: str
    schedule_matches: bool
    outcome: Outcome

    @property
    def matches(self) -> bool:
        return self.expected == self.got and self.schedule_matches


def _stopped(seed: int, cl: Any, ctl: Any) -> Outcome:
    """The outcome of a run stopped by ``until``: the time, the state and the trace hash."""
    now = float(cl.env.now)
    out = Outcome(seed, "", sim_time=now)
    out.state = ctl.state() if ctl is not None else {"time": now}
    trace = cl.ctx.trace.hexdigest()
    out.trace_hash = ctl.combined_hash(trace) if ctl is not None else trace
    return out


def replay(path: str | Path, until: float | None = None) -> ReplayReport:
    """Re-run a replay file (see the module docstring)."""
    rec, sc = load_replay(path)
    if until is not None and until < 0:
        raise InputError(f"--until {until}: allowed: a time >= 0 s")
    out = run_checked(sc, int(rec["seed"]), until=until)
    if until is not None:
        applied = [a for a in rec.get("faults_applied", []) if a["at"] <= until]
        same = _norm(applied) == _norm(out.state["applied"] if out.state else [])
        return ReplayReport(str(rec["trace_hash"]), out.trace_hash, same, out)
    same = _norm(rec.get("faults_applied", [])) == _norm(out.applied)
    return ReplayReport(str(rec["trace_hash"]), out.trace_hash, same, out)


def _norm(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def violation_report(sc: Scenario, seed: int, exc: BaseException, out_dir: str | Path) -> str:
    """The message for a run stopped by a checker: the violation, and -- for a scenario
    without variants -- a replay file written under ``out_dir`` (the run is repeated under
    :func:`run_checked`, which reproduces it exactly)."""
    lines = [f"checker violation: {exc}"]
    if sc.variants:
        lines.append("(scenario has variants: run the failing variant alone for a replay file)")
        return "\n".join(lines)
    out = run_checked(sc, seed)
    name = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in sc.name)
    p = write_replay(Path(out_dir) / f"{name}-seed-{seed}.replay.json", sc, seed, out)
    lines.append(f"replay file: {p}  (pdsim replay {p} [--until T])")
    return "\n".join(lines)
