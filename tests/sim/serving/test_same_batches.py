"""One trace, the engine and the simulator: the same sequence of batches, and the same KV
admissions, blocks, preemptions and completions, item by item.

Both sides run the one replica scheduler, :class:`engine.sched.scheduler.Scheduler`, and log
every batch it forms (``batch_log``: step, admitted, preempted, prefill chunks, decodes; the
simulator's multi-step decode segment as one decode-only batch per step) and every KV event of
the admission object, :class:`engine.kv.admission.KvAdmission` (``(step, event, request,
value)``).

* Engine: :class:`engine.runtime.engine.Engine` serving a small decoder (real arrays, NumPy)
  on a :class:`engine.runtime.clock.VirtualClock` (work takes no time, it sleeps exactly to
  each arrival), its scheduler's blocks in the model's own block allocator.
* Simulator: ``sim.cluster.build`` of a one-replica scenario with the same model, token and
  sequence limits, block size and KV capacity (the engine is given the simulator's), unchunked
  prefill, recompute preemption.

Arrivals come in bursts far apart (every request of a burst at the same instant), so both
sides see the same queue at the same iterations whatever their iteration times. The
simulator takes a decode segment's blocks together when it ends; its KV log is in step order
once sorted by step (a stable sort keeps each step's own order), the order the engine logs in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.kv.admission import LogEntry
from engine.sched.scheduler import BatchRecord

BT = 16
CAP_BLOCKS = 14
MAX_SEQS = 6
MAX_TOKENS = 128


def _arrivals(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 20
    t = np.where(np.arange(n) < 10, 0.0, 30.0)  # two bursts, 30 s apart
    return t, rng.integers(8, 40, n), rng.integers(8, 50, n)


def _simulator(
    tmp: Path, cfg: Any, arrivals: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[Any, list[LogEntry], list[BatchRecord]]:
    from hwbench.validate import sim_catalogue
    from sim.cluster import build
    from sim.scenario import validate
    from sim.serving.costmodel import CostModel, load_profile

    t, inp, out = arrivals
    trace = tmp / "trace.csv"
    rows = "".join(f"{a},{i},{o}\n" for a, i, o in zip(t, inp, out, strict=True))
    trace.write_text("time,input_tokens,output_tokens\n" + rows, encoding="utf-8")
    model = sum(cfg.layer_bytes())
    hbm = 4 * model
    kv = CAP_BLOCKS * BT * cfg.kv_bytes_per_token
    sc = validate(
        {
            "name": "kv-differential",
            "deployments": [{"model": cfg.name}],
            "cluster": {
                "servers": 1,
                "param_servers": 1,
                "gpu": {
                    "hbm": hbm,
                    "memory_utilization": 1.0,
                    "workspace": 0,
                    "weight_cache_fraction": (hbm - kv) / hbm,
                },
                "server": {"host": 2 * model, "nvme": 4 * model},
                "replica": {
                    "max_num_seqs": MAX_SEQS,
                    "max_num_batched_tokens": MAX_TOKENS,
                    "chunked_prefill": False,
                },
                "ps": {"dram": model, "ssd": 4 * model},
            },
            "warmup": {"enabled": True, "ps_fraction": 1.0, "node_hbm": True},
            "kv": {"block_tokens": BT, "preemption": "recompute"},
            "workload": {
                "kind": "trace",
                "trace": str(trace),
                "trace_format": "csv",
                "requests": len(t),
            },
        }
    )
    cl = build(sc, 0, sim_catalogue(cfg), load_profile("a100-80gb"), CostModel)
    (node,) = cl.ctx.nodes
    log: list[LogEntry] = []
    batches: list[BatchRecord] = []
    node.kv.log = log
    node.sched.batch_log = batches
    cl.run()
    return cl, log, batches


def _engine(
    cfg: Any, capacity: int, arrivals: tuple[np.ndarray, np.ndarray, np.ndarray], mp: Any
) -> tuple[Any, list[LogEntry], list[BatchRecord], Any]:
    import engine.runtime.engine as rt
    from engine.runtime.clock import VirtualClock
    from engine.runtime.model import DecoderModel
    from engine.runtime.weights import ResidentWeights
    from engine.sched.scheduler import Scheduler

    t, inp, out = arrivals
    vclock = VirtualClock()
    mp.setattr(rt, "RunClock", lambda exclude_cpu_wait=False: vclock)
    log: list[LogEntry] = []
    kvb = cfg.kv_bytes_per_token
    sched = Scheduler.single(MAX_SEQS, MAX_TOKENS, capacity, kvb, BT, log=log)
    batches: list[BatchRecord] = []
    sched.batch_log = batches
    weights = ResidentWeights(7, cfg.layer_bytes())
    weights.load()
    model = DecoderModel(cfg, capacity // kvb)
    eng = rt.Engine(model, weights, sched, sleep=vclock.sleep)
    res = eng.run(rt.EngineWorkload(t, inp, out, seed=3))
    return res, log, batches, sched


@pytest.mark.parametrize("seed", [1, 2])
def test_engine_and_simulator_form_the_same_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    from engine.runtime.model import DecoderConfig

    # small enough that the engine's real arrays cost little (two blocks, 2 KiB KV per token)
    cfg = DecoderConfig("kv-tiny", n_blocks=2, hidden=128, heads=4, kv_heads=4, ffn=128, vocab=256)
    arrivals = _arrivals(seed)
    cl, sim_log, sim_batches = _simulator(tmp_path, cfg, arrivals)
    (node,) = cl.ctx.nodes
    capacity = node.kv.capacity
    assert capacity // (BT * cfg.kv_bytes_per_token) == CAP_BLOCKS
    assert not cl.rejected_mask().any(), "every request fits the model's context"
    res, eng_log, eng_batches, sched = _engine(cfg, capacity, arrivals, monkeypatch)

    # the same batches, step by step
    assert len(eng_batches) == res.iterations > 40
    for i, (a, b) in enumerate(zip(eng_batches, sim_batches, strict=False)):
        assert a == b, f"first difference at batch {i}: engine {a} vs simulator {b}"
    assert len(eng_batches) == len(sim_batches) == node.iterations
    assert [b[0] for b in eng_batches] == list(range(len(eng_batches)))
    assert any(b[2] for b in eng_batches), "some batch preempts"
    assert any(b[3] and b[4] for b in eng_batches), "some batch mixes prefill and decodes"
    # the engine's iteration log says what each batch ran
    assert [r.new for r in res.iteration_log] == [len(b[3]) for b in eng_batches]
    assert [r.prompt_tokens for r in res.iteration_log] == [
        sum(c for _, c in b[3]) for b in eng_batches
    ]
    assert [r.decode_batch for r in res.iteration_log] == [b[4] for b in eng_batches]

    # the same KV events

    sim_sorted = sorted(sim_log, key=lambda e: e[0])
    assert len(eng_log) > 60
    for i, (a, b) in enumerate(zip(eng_log, sim_sorted, strict=False)):
        assert a == b, f"first difference at event {i}: engine {a} vs simulator {b}"
    assert len(eng_log) == len(sim_sorted)
    assert res.iterations == node.iterations  # the same number of steps on both sides

    n = len(arrivals[0])
    kinds = [e[1] for e in eng_log]
    assert kinds.count("preempt") > 0, "the pool must be small enough to preempt"
    assert res.preemptions == node.kv.preemptions == node.preemptions > 0
    assert kinds.count("block") > 0
    # nothing lost: every request completes exactly once on both sides, with all its tokens
    done = sorted(e[2] for e in eng_log if e[1] == "done")
    assert done == list(range(n))
    assert (res.status == 1).all()
    assert [len(t) for t in res.tokens] == arrivals[2].tolist()
    assert int((cl.ctx.metrics.status == 1).sum()) == n
    # the shared classifier: a burst starts with a prefill-only iteration; re-admissions
    # after preemptions run alongside decodes
    kinds_e = [r.kind for r in res.iteration_log]
    assert kinds_e[0] == "prefill" and "mixed" in kinds_e and "decode" in kinds_e
    # both pools end empty
    assert sched.kv.reserved == 0 and node.kv.reserved == 0
