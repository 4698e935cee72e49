"""Engine vs simulator: run one workload on the real engine and in the simulator, compare.

:func:`validate_workload` runs a :class:`hwbench.workloads.ValidationWorkload` twice:

* **engine** -- the model's weights are written as verified chunks to a local object store
  (fsspec directory) under ``workdir``; a tier stack device -> host -> SSD over it (capacities
  and policies from the workload) is warmed by reading every chunk once; then the requests
  arrive in real time (:class:`engine.runtime.engine.Engine`, holding a layer's pins until
  the prefetches planned at its start have landed, so cache decisions do not depend on
  thread timing).
* **simulator** -- a scenario folder written by :func:`write_scenario` (``scenario.yaml``,
  ``trace.csv``, ``catalogue.yaml``, ``profile.json``): one node, one (unused) parameter
  server, the same chunking, HBM weight cache, host and NVMe sizes, policies, prefetch
  window and order (``prefetch.order: after-pin``), KV budget, batching limits and HBM
  warm-up, built exactly as ``pdsim run`` builds a scenario (the plain
  :class:`sim.serving.costmodel.CostModel`: op tables and engine terms), so ``pdsim run
  DIR/scenario.yaml`` reproduces the simulator's figures.

:func:`compare` turns both request tables into one table of figures: latency and TTFT (P50,
P99, mean) and throughput with the relative error ``(sim - engine) / engine`` (accuracy),
and hit rate and bytes per chunk access per tier (consistency: the same cache code on the
same accesses, so these must be equal; totals are not compared). The engine's clock:
:func:`excludes_cpu_wait`.
"""

from __future__ import annotations

import csv
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import yaml

from engine import backend
from engine.cache import TierCache
from engine.chunkstore import ChunkStore, write_model
from engine.runtime.engine import Engine, EngineResult, EngineWorkload
from engine.runtime.model import DecoderConfig, DecoderModel, DenseConfig, DenseModel
from engine.runtime.scheduler import BatchScheduler
from engine.runtime.weights import TIER_NAMES, TieredWeights
from engine.tiers import DeviceTier, HostTier, Level, ObjectStoreTier, SsdTier, TierStack
from hwbench.workloads import ValidationWorkload, arrivals
from sim.cluster import build
from sim.scenario import load_scenario
from sim.serving.costmodel import CostModel, Profile, load_profile
from sim.serving.metrics import requests_frame
from sim.serving.models import ModelSpec, load_catalogue, parse_catalogue

__all__ = [
    "CHUNK_BYTES",
    "Comparison",
    "compare",
    "decoder_config",
    "dense_config",
    "excludes_cpu_wait",
    "median_requests",
    "model_config",
    "run_engine",
    "run_simulator",
    "sim_catalogue",
    "validate_workload",
    "write_scenario",
]

CHUNK_BYTES = 4 * 1024 * 1024  # R30's default: every layer of the tiny models is one chunk
BASE_MODEL = "llama-2-7b"
SHRINK = 16  # hidden, ffn and vocab / SHRINK; heads / (SHRINK // 2); 4 blocks (17 MB)
#: the large decoder's shrink: 67 MB of weights, more than a 32 MiB last-level cache
SHRINK_LARGE = 8
N_BLOCKS = 4
SEED = 7
#: a layer stays pinned until the prefetches planned at its start have landed, in the engine
#: (and in the simulator: scenario field ``prefetch.order: after-pin``)
HOLD_PINS = True
EXCLUDE_CPU_WAIT = {"cpu": True, "gpu": False}  #: by backend; see excludes_cpu_wait


def excludes_cpu_wait(xp: ModuleType) -> bool:
    """The engine's clock on ``xp`` (:class:`engine.runtime.clock.RunClock`). NumPy: wall time
    less the engine thread's run-queue waits -- its CPU time while it computes (one BLAS
    thread), as the op tables are timed (:func:`hwbench.opprobe.op_clock`), yet advancing
    while it sleeps or waits for its copy thread: preemption leaves both sides. GPU: wall."""
    return EXCLUDE_CPU_WAIT["gpu" if backend.is_gpu(xp) else "cpu"]


def decoder_config(spec: ModelSpec | None = None, shrink: int = SHRINK) -> DecoderConfig:
    """The catalogue's LLaMA-2-7B shape scaled down by ``shrink`` (hidden/ffn/vocab) with
    ``N_BLOCKS`` blocks; ffn and vocab are read back from the catalogue's layer sizes.
    The name says the shrink when it is not :data:`SHRINK`."""
    spec = spec if spec is not None else load_catalogue()[BASE_MODEL]
    h, heads, kvh, hd = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    attn = 2 * h * heads * hd + 2 * h * kvh * hd
    block = spec.layers[1]
    ffn = round((block.flops_per_token / 2 - attn) / (3 * h))
    vocab = spec.layers[0].param_bytes // (h * spec.dtype_bytes)
    return DecoderConfig(
        name=f"{spec.name}-tiny" if shrink == SHRINK else f"{spec.name}-div{shrink}",
        n_blocks=N_BLOCKS,
        hidden=h // shrink,
        heads=max(1, heads // (shrink // 2)),
        kv_heads=max(1, kvh // (shrink // 2)),
        ffn=ffn // shrink,
        vocab=vocab // shrink,
    )


def model_config(w: ValidationWorkload) -> DecoderConfig | DenseConfig:
    """The engine model of ``w``: the small or the large decoder, or the dense network."""
    if w.model == "dense":
        return dense_config()
    return decoder_config(shrink=SHRINK_LARGE if w.model == "decoder-large" else SHRINK)


def dense_config() -> DenseConfig:
    """The dense no-KV model (CNN-like): five fully connected layers."""
    return DenseConfig("dense-tiny", (512, 1024, 1000, 1000, 1000, 256))


def sim_catalogue(cfg: DecoderConfig | DenseConfig) -> dict[str, ModelSpec]:
    """A one-model catalogue whose layers have exactly the engine model's bytes and FLOPs."""
    return parse_catalogue(catalogue_text(cfg), "<validate>")


def catalogue_text(cfg: DecoderConfig | DenseConfig) -> str:
    """The YAML of :func:`sim_catalogue` (checked: bytes per layer equal the engine's)."""
    if isinstance(cfg, DecoderConfig):
        text = (
            f"models:\n  - name: {cfg.name}\n    kind: decoder\n    dtype_bytes: 4\n"
            f"    shape: {{family: llama, n_layers: {cfg.n_blocks}, hidden: {cfg.hidden}, "
            f"heads: {cfg.heads}, kv_heads: {cfg.kv_heads}, ffn: {cfg.ffn}, "
            f"vocab: {cfg.vocab}}}\n"
        )
    else:
        rows = [
            f"      - {{name: fc{i}, param_bytes: {b}, flops_per_sample: {2.0 * a * o}}}"
            for i, (a, o, b) in enumerate(
                zip(cfg.widths, cfg.widths[1:], cfg.layer_bytes(), strict=False)
            )
        ]
        text = f"models:\n  - name: {cfg.name}\n    kind: cnn\n    dtype_bytes: 4\n    layers:\n"
        text += "\n".join(rows) + "\n"
    cat = parse_catalogue(text, "<validate>")
    assert cat[cfg.name].layer_bytes() == cfg.layer_bytes(), "catalogue and engine disagree"
    return text


@dataclass(frozen=True)
class Sizes:
    """Capacities (bytes) both sides use."""

    model: int
    hbm_weights: int
    kv: int
    host: int
    ssd: int


def sizes(w: ValidationWorkload, cfg: DecoderConfig | DenseConfig) -> Sizes:
    total = sum(cfg.layer_bytes())
    hbm_weights = int(total * w.hbm_fraction)
    # KV budget = 3x the weight cache (the simulator's HBM is 4x it, a quarter for weights).
    return Sizes(total, hbm_weights, 3 * hbm_weights, 2 * total, 4 * total)


# -- engine ------------------------------------------------------------------------------------
def _stack(
    backing: ObjectStoreTier, w: ValidationWorkload, sz: Sizes, workdir: Path, xp: ModuleType
) -> TierStack:
    params = dict(w.policy_params)

    def cache(cap: int, policy: str, name: str, p: dict[str, Any]) -> TierCache:
        return TierCache(cap, policy, p, high_watermark=1.0, low_watermark=1.0, name=name)

    levels = [
        Level(DeviceTier(xp=xp), cache(sz.hbm_weights, w.policy, "device", params)),
        Level(HostTier(xp=xp), cache(sz.host, "lru", "host", {})),
        Level(SsdTier(workdir / "ssd"), cache(sz.ssd, "lru", "ssd", {}), verify=True),
    ]
    return TierStack(levels, backing)


def engine_parts(
    w: ValidationWorkload, workdir: Path, xp: ModuleType = np
) -> tuple[DecoderConfig | DenseConfig, TieredWeights, Sizes]:
    """Write the model, build and warm the tier stack (device cache = the HBM weight cache)
    on backend ``xp`` (NumPy; CuPy: device memory on the GPU, pinned host memory)."""
    cfg = model_config(w)
    sz = sizes(w, cfg)
    backing = ObjectStoreTier(workdir / "objects")
    manifest = write_model(
        backing, cfg.name, cfg.layer_bytes(), SEED, dtype="float32", chunk_bytes=CHUNK_BYTES
    )
    weights = TieredWeights(ChunkStore(manifest, _stack(backing, w, sz, workdir, xp)), xp)
    weights.warm(0.0)
    return cfg, weights, sz


def run_engine(
    w: ValidationWorkload,
    workdir: Path,
    parts: tuple[DecoderConfig | DenseConfig, TieredWeights, Sizes] | None = None,
) -> tuple[EngineResult, TieredWeights]:
    """Serve ``w`` on the engine; see the module docstring. ``parts``: what
    :func:`engine_parts` returned, to reuse a warm stack (else it is built here on NumPy);
    the model runs on the backend of ``parts``' weights."""
    parts = parts if parts is not None else engine_parts(w, workdir)
    eng = engine_for(w, parts)
    return eng.run(workload_for(w)), parts[1]


def engine_for(
    w: ValidationWorkload, parts: tuple[DecoderConfig | DenseConfig, TieredWeights, Sizes]
) -> Engine:
    """The engine that serves ``w`` over the warm stack ``parts`` (see :func:`run_engine`)."""
    cfg, weights, sz = parts
    xp = weights.xp
    if isinstance(cfg, DecoderConfig):
        model: DecoderModel | DenseModel = DecoderModel(cfg, sz.kv // cfg.kv_bytes_per_token, xp)
        kvb = cfg.kv_bytes_per_token
    else:
        model, kvb = DenseModel(cfg, xp), 0
    sched = BatchScheduler(w.max_batch, w.max_batch_tokens, sz.kv, kvb, 16)
    return Engine(
        model,
        weights,
        sched,
        window=w.window,
        hold_pins=HOLD_PINS,
        exclude_cpu_wait=excludes_cpu_wait(xp),
    )


def workload_for(w: ValidationWorkload) -> EngineWorkload:
    """``w``'s requests as the engine takes them."""
    t, inp, out = arrivals(w)
    return EngineWorkload(t, inp, out, seed=w.seed)


# -- simulator ---------------------------------------------------------------------------------
def scenario_dict(w: ValidationWorkload, sz: Sizes, model: str, trace: Path) -> dict[str, Any]:
    """The simulator scenario that matches the engine's setup for ``w``."""
    return {
        "name": f"validate-{w.name}",
        "deployments": [{"model": model}],
        "cluster": {
            "servers": 1,
            "param_servers": 1,
            "gpu": {
                "hbm": 4 * sz.hbm_weights,  # weight cache = hbm / 4 exactly, KV = the rest
                "memory_utilization": 1.0,
                "workspace": 0,
                "weight_cache_fraction": 0.25,
            },
            "server": {"host": sz.host, "nvme": sz.ssd},
            # the engine's batch scheduler: whole prompts, the first always admitted
            "replica": {
                "max_num_seqs": w.max_batch,
                "max_num_batched_tokens": w.max_batch_tokens,
                "chunked_prefill": False,
            },
            "ps": {"dram": sz.model, "ssd": 4 * sz.model},
        },
        "chunks": {"size": CHUNK_BYTES, "sharding": "layer"},
        "cache": {
            "hbm_policy": w.policy,
            "host_policy": "lru",
            "nvme_policy": "lru",
            "params": dict(w.policy_params),
            "high_watermark": 1.0,
            "low_watermark": 1.0,
        },
        "prefetch": {
            "enabled": w.window > 0,
            "window_batches": max(w.window, 1),
            "order": "after-pin" if HOLD_PINS else "before-demand",  # the engine's rule
        },
        "warmup": {"enabled": True, "ps_fraction": 1.0, "node_hbm": True},
        "kv": {"block_tokens": 16},
        "workload": {
            "kind": "trace",
            "trace": str(trace),
            "trace_format": "csv",
            "requests": w.requests,
        },
    }


def write_scenario(w: ValidationWorkload, profile: Profile, folder: Path) -> Path:
    """Write ``w``'s simulator scenario folder (module docstring) and return the path of its
    ``scenario.yaml``: ``pdsim run`` of it is the simulator side of the validation."""
    cfg = model_config(w)
    sz = sizes(w, cfg)
    folder.mkdir(parents=True, exist_ok=True)
    t, inp, out = arrivals(w)
    with (folder / "trace.csv").open("w", newline="", encoding="utf-8") as fh:
        wr = csv.writer(fh)
        wr.writerow(["time", "input_tokens", "output_tokens"])
        for row in zip(t.tolist(), inp.tolist(), out.tolist(), strict=True):
            wr.writerow([repr(row[0]), row[1], row[2]])
    (folder / "catalogue.yaml").write_text(catalogue_text(cfg), encoding="utf-8")
    (folder / "profile.json").write_text(profile.model_dump_json(indent=2) + "\n", "utf-8")
    doc = scenario_dict(w, sz, cfg.name, Path("trace.csv"))
    doc["profile"] = str((folder / "profile.json").resolve())
    doc["catalogue"] = str((folder / "catalogue.yaml").resolve())
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def run_simulator(
    w: ValidationWorkload, profile: Profile, workdir: Path
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, float, Any]:
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


# -- comparison --------------------------------------------------------------------------------
@dataclass
class Comparison:
    """Figures of one workload: ``rows`` of (metric, engine, sim, error, kind)."""

    workload: str
    rows: list[tuple[str, float, float, float, str]]
    engine_latency: np.ndarray
    sim_latency: np.ndarray

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workload": self.workload}
        for name, e, s, err, kind in self.rows:
            out[name] = {"engine": _num(e), "sim": _num(s)}
            out[name]["abs_error" if kind == "abs" else "rel_error"] = _num(err)
        return out

    def errors(self) -> dict[str, float]:
        """``{metric_error: value}``: relative errors and hit-rate absolute differences."""
        return {
            f"{n}_{'abs_error' if k == 'abs' else 'rel_error'}": e for n, _, _, e, k in self.rows
        }


def _num(x: float) -> float | None:
    return float(f"{x:.6g}") if math.isfinite(x) else None


def _rel(e: float, s: float) -> float:
    if e == 0:
        return 0.0 if s == 0 else math.inf
    return (s - e) / e


def compare(
    name: str,
    eng: pd.DataFrame,
    eng_hits: np.ndarray,
    eng_bytes: np.ndarray,
    sim: pd.DataFrame,
    sim_hits: np.ndarray,
    sim_bytes: np.ndarray,
) -> Comparison:
    """The comparison table of one workload (see the module docstring)."""
    rows: list[tuple[str, float, float, float, str]] = []

    def lat(df: pd.DataFrame, col: str) -> np.ndarray:
        d = df[df["status"] == "done"]
        out: np.ndarray = (d[col] - d["arrival"]).to_numpy(dtype=float)
        return out

    stats: tuple[tuple[str, Callable[[np.ndarray], float]], ...] = (
        ("p50", lambda x: float(np.percentile(x, 50))),
        ("p99", lambda x: float(np.percentile(x, 99))),
        ("mean", lambda x: float(np.mean(x))),
    )

    le, ls = lat(eng, "end"), lat(sim, "end")
    te, ts = lat(eng, "first_token"), lat(sim, "first_token")
    for label, a, b in (("latency", le, ls), ("ttft", te, ts)):
        for stat, f in stats:
            ve, vs = (f(a) if a.size else math.nan), (f(b) if b.size else math.nan)
            rows.append((f"{label}_{stat}", ve, vs, _rel(ve, vs), "rel"))

    def thr(df: pd.DataFrame) -> float:
        d = df[df["status"] == "done"]
        return len(d) / float(d["end"].max()) if len(d) else 0.0

    te_, ts_ = thr(eng), thr(sim)
    rows.append(("throughput_rps", te_, ts_, _rel(te_, ts_), "rel"))
    he = eng_hits / max(eng_hits.sum(), 1.0)
    hs = sim_hits / max(sim_hits.sum(), 1.0)
    for i, t in enumerate(TIER_NAMES):
        if eng_hits[i] or sim_hits[i]:
            rows.append((f"hit_rate_{t}", float(he[i]), float(hs[i]), float(hs[i] - he[i]), "abs"))
    # bytes per chunk access (HBM hits plus fetches): the totals grow with the iteration
    # count, which timing sets; per access, both sides run the same cache decisions
    for i, t in enumerate(TIER_NAMES):
        if i and (eng_bytes[i] or sim_bytes[i]):
            be = float(eng_bytes[i]) / max(float(eng_hits.sum()), 1.0)
            bs = float(sim_bytes[i]) / max(float(sim_hits.sum()), 1.0)
            rows.append((f"bytes_per_access_{t}", be, bs, _rel(be, bs), "rel"))
    return Comparison(name, rows, le, ls)


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
    ``scenario_dir``: where the simulator's scenario folder goes (kept; default: scratch)."""
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


def median_requests(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One engine request table from several runs of the same arrivals: each request's start,
    first-token and end times are the arrival plus the median over the runs of its own delay
    to them. A request not done in every run keeps the first run's row.

    The runs serve the very same requests, so a request's median is its typical latency: a
    slow spell of the machine in one run (on the 2-core VM, 1-2 s at 1.3-1.6x now and then)
    moves it only if it hits the same request in most runs, while what the arrivals cause --
    requests that meet and batch -- is there in every run. Percentiles of a single run, or
    the median of the runs' percentiles, let such a spell become the workload's P99."""
    if not frames:
        raise ValueError("no engine runs to combine")
    out = frames[0].copy()
    if len(frames) == 1:
        return out
    done = np.logical_and.reduce([f["status"].to_numpy() == "done" for f in frames])
    arrival = out["arrival"].to_numpy(dtype=float)
    for col in ("start", "first_token", "end"):
        delay = np.median([f[col].to_numpy(dtype=float) - arrival for f in frames], axis=0)
        out.loc[done, col] = arrival[done] + delay[done]
    return out


def plot_cdfs(comps: list[Comparison], path: Path) -> Path:
    """A PNG with the engine's and the simulator's latency CDF for each workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(comps)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
    for ax, c in zip(axes.ravel(), comps, strict=False):
        for data, label, style in ((c.engine_latency, "engine", "-"), (c.sim_latency, "sim", "--")):
            x = np.sort(data)
            ax.plot(x, np.arange(1, x.size + 1) / max(x.size, 1), style, label=label)
        ax.set_title(c.workload, fontsize=9)
        ax.set_xlabel("latency (s)")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=8)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
