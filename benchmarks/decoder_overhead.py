"""Where a decode iteration's time goes, on the small and the large validation decoder.

``python benchmarks/decoder_overhead.py PROFILE [--rounds N]`` serves closed decode runs
(two requests of 64 prompt and 24 output tokens, every weight resident, as ``pdsim
validate`` serves) of the 17 MB decoder and the 67 MB one, alternating, each op timed in
place (:class:`hwbench.insitu_probe.OpTimer`), and prints per model the decode iterations'
median seconds, their ops' seconds, the overhead outside the ops, the weight wait the
engine books (``param_wait``: pins and lookups of resident weights) and the profile's
prices of the same iterations: its op tables and its ``iteration_overhead_s``, which
``pdsim calibrate`` measures on the small decoder only. The last line is one JSON object:
``{"<model>": {"seconds_ms", "ops_ms", "overhead_ms", "param_wait_ms", "table_ops_ms",
"profile_overhead_ms", "priced_ms"}}``. Run with ``OPENBLAS_NUM_THREADS=1`` as calibration
does. ``docs/design/large-resident-tail.md`` reads these figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.runtime.engine import IterationRecord
from hwbench.engine_probe import hook_cost
from hwbench.insitu_probe import OpTimer
from hwbench.opprobe import op_clock
from hwbench.probes import syncer
from hwbench.validation_engine import engine_for, engine_parts, workload_for
from hwbench.validation_models import model_config, sim_catalogue
from hwbench.workloads import ValidationWorkload
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.itercost import iteration_seconds
from sim.serving.opcost import OpCostModel

MODELS = ("decoder", "decoder-large")
#: the profile's own terms among the op names: the overheads, not ops timed in place
_OVERHEADS = ("iteration_overhead", "layer_overhead", "prompt_overhead")


def _decode_run(w: ValidationWorkload, parts: object, timer: OpTimer, outside: float) -> list:
    """``(record, ops seconds)`` of each decode iteration of ``w``, the timer's own cost
    (``outside`` per op call) taken out of the record's seconds."""
    eng = engine_for(w, parts)  # type: ignore[arg-type]
    eng.model.op = timer  # type: ignore[union-attr]
    timer.take()
    timer.calls = 0
    out: list[tuple[IterationRecord, float]] = []

    def on_iteration(rec: IterationRecord) -> None:
        ops = timer.take()
        calls, timer.calls = timer.calls, 0
        if rec.kind == "decode":
            secs = float(rec.seconds) - calls * outside
            out.append((rec._replace(seconds=secs), sum(ops.values())))

    eng.on_iteration = on_iteration
    eng.run(workload_for(w))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="a profile with ops.engine (pdsim calibrate)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two models")
    args = ap.parse_args()
    prof = load_profile(args.profile)
    assert prof.ops is not None and prof.ops.engine is not None, "profile needs ops.engine"
    timer = OpTimer(op_clock(np), syncer(np))
    outside, _ = hook_cost(timer)
    rows: dict[str, list[tuple[IterationRecord, float]]] = {m: [] for m in MODELS}
    with tempfile.TemporaryDirectory(prefix="pdsim-decoder-overhead-") as tmp:
        parts = {}
        for m in MODELS:
            w0 = ValidationWorkload("p", "probe", model=m, requests=2, hbm_fraction=1.5)
            parts[m] = (w0, engine_parts(w0, Path(tmp) / m))
        for k in range(args.rounds + 1):  # round 0 warms caches and allocator; not kept
            for m in MODELS:
                w0, pm = parts[m]
                w = replace(
                    w0, rate=1e9, input_low=64, input_high=64, output_low=24, output_high=24,
                    max_batch=2, seed=700 + k,
                )  # fmt: skip
                got = _decode_run(w, pm, timer, outside)
                if k:
                    rows[m].extend(got)
    doc: dict[str, dict[str, float]] = {}
    print(f"{'model':24s} {'step ms':>8s} {'ops ms':>8s} {'outside':>8s} {'wait':>8s} "
          f"{'tables':>8s} {'prof ovh':>8s} {'priced':>8s}")  # fmt: skip
    for m in MODELS:
        w0, _ = parts[m]
        cfg = model_config(w0)
        cost = CostModel(prof, sim_catalogue(cfg)[cfg.name])
        ops_model = cost.iteration
        assert isinstance(ops_model, OpCostModel)
        recs = rows[m]
        shapes = [(0, 0.0, 0, int(r.decode_batch), float(r.decode_context)) for r, _ in recs]
        secs = np.array([r.seconds for r, _ in recs])
        ops = np.array([o for _, o in recs])
        tables = np.array(
            [
                sum(v for k, v in ops_model.iteration_ops(*s).items() if k not in _OVERHEADS)
                for s in shapes
            ]
        )
        priced = np.array([iteration_seconds(ops_model, *s) for s in shapes])
        fig = {
            "seconds_ms": float(np.median(secs)) * 1e3,
            "ops_ms": float(np.median(ops)) * 1e3,
            "overhead_ms": float(np.median(secs - ops)) * 1e3,
            "param_wait_ms": float(np.median([r.param_wait for r, _ in recs])) * 1e3,
            "table_ops_ms": float(np.median(tables)) * 1e3,
            "profile_overhead_ms": prof.ops.roofline.iteration_overhead_s * 1e3,
            "priced_ms": float(np.median(priced)) * 1e3,
        }
        doc[cfg.name] = fig
        print(f"{cfg.name:24s} " + " ".join(f"{v:8.3f}" for v in fig.values()))
    print(json.dumps(doc, sort_keys=True))


if __name__ == "__main__":
    main()
