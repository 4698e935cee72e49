"""Run-time counters, per-request records, the event-trace hash, and the summary.

Per-request accounting is O(1) per request: each node keeps, per model, cumulative counters
(param wait, chunk accesses and fetched bytes per tier per batch member); a request stores
``-counters`` when admitted and adds ``counters`` when it completes, so it ends with exactly the
sum over the iterations it took part in. Bytes fetched in an iteration are split evenly over
the batch; hits and param wait are what each member of the batch saw.

Tiers (R14): ``hbm`` (local GPU), ``host`` (pinned host memory), ``nvme`` (local SSD),
``remote`` (cross-node: a parameter server's DRAM or SSD over RDMA) and ``object`` (object
store = the "disk fallback").
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import pandas as pd

TIERS: tuple[str, ...] = ("hbm", "host", "nvme", "remote", "object")
N_ACC = 1 + 2 * len(TIERS)  # param_wait, hits per tier, bytes per tier

# request status codes
# DEGRADED: answered with an explicit degraded result (parameters not had in time; issue 5)
PENDING, DONE, SHED, REJECTED, DEGRADED = 0, 1, 2, 3, 4

# event kinds written to the trace hash
EV_ARRIVE, EV_ADMIT, EV_FIRST, EV_DONE, EV_SHED, EV_FETCH, EV_REPLICA, EV_REJECT = range(8)

_PACK = struct.Struct("<dBqq").pack


_FLUSH_RECORDS = 4096  # packed records buffered before they are fed to the hash


class TraceRecorder:
    """Incremental blake2b of compact event records ``(time, kind, a, b)``.

    The digest is that of the concatenation of every record packed as ``<dBqq`` (25 bytes),
    in ``rec`` order; ``hexdigest`` may be called at any point and recording may go on.
    Records are buffered as a list of ``bytes`` and hashed in batches (cheaper per record
    than growing a ``bytearray``; blake2b does not care how its input is split).
    """

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=16)
        self._parts: list[bytes] = []
        self.count = 0

    def rec(self, t: float, kind: int, a: int, b: int = 0) -> None:
        parts = self._parts
        parts.append(_PACK(t, kind, a, b))
        self.count += 1
        if len(parts) >= _FLUSH_RECORDS:
            self._flush()

    def _flush(self) -> None:
        self._h.update(b"".join(self._parts))
        self._parts.clear()

    def hexdigest(self) -> str:
        self._flush()
        return self._h.hexdigest()


class Metrics:
    """Counters of one run; arrays are indexed by request id."""

    def __init__(self, n: int) -> None:
        self.node = np.full(n, -1, dtype=np.int32)
        self.start = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.arrival = np.full(n, np.nan)
        self.status = np.zeros(n, dtype=np.int8)
        self.acc = np.zeros((n, N_ACC))
        self.tier_hits = np.zeros(len(TIERS))
        self.tier_bytes = np.zeros(len(TIERS))
        self.busy = 0.0
        self.param_wait = 0.0
        self.fetch_lat: list[float] = []
        self.layer_log: list[tuple[float, int, int, int, float]] | None = None
        self.n_arrived = 0
        self.n_final = 0
        self.shed_order: list[int] = []  # class index of each shed request, in shed order
        self.replicas_added = 0
        self.fetch_retries = 0
        self.peak_hbm = 0
        self.samples: list[tuple[float, ...]] = []

    def finish(self, rid: int, status: int) -> None:
        self.status[rid] = status
        self.n_final += 1


def _pct(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return {"p50": None, "p90": None, "p99": None, "p999": None, "mean": None}
    q = np.percentile(x, [50, 90, 99, 99.9])
    return {
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "p999": float(q[3]),
        "mean": float(x.mean()),
    }


def requests_frame(
    m: Metrics, wl: Any, model_names: list[str], class_names: list[str]
) -> pd.DataFrame:
    """Per-request records (the schema the real engine emits too)."""
    df = pd.DataFrame(
        {
            "request_id": np.arange(wl.n, dtype=np.int64),
            "model": pd.Categorical.from_codes(wl.model, categories=model_names),
            "cls": pd.Categorical.from_codes(wl.cls, categories=class_names),
            "arrival": m.arrival,
            "start": m.start,
            "first_token": m.first,
            "end": m.end,
            "input_tokens": wl.inp,
            "output_tokens": wl.out,
            "status": pd.Categorical.from_codes(
                m.status.astype(np.int64),
                categories=["pending", "done", "shed", "rejected", "degraded"],
            ),
            "node": m.node,
            "param_wait_s": m.acc[:, 0],
        }
    )
    for i, t in enumerate(TIERS):
        df[f"hits_{t}"] = m.acc[:, 1 + i]
    for i, t in enumerate(TIERS):
        df[f"bytes_{t}"] = m.acc[:, 1 + len(TIERS) + i]
    return df


def summarize(
    df: pd.DataFrame, m: Metrics, sim_time: float, slos: dict[str, float], extra: dict[str, Any]
) -> dict[str, Any]:
    """The run's headline figures (JSON-ready; every float rounded to 9 significant digits)."""
    done = df[df["status"] == "done"]
    lat = (done["end"] - done["arrival"]).to_numpy()
    ttft = (done["first_token"] - done["arrival"]).to_numpy()
    gen = done["output_tokens"].to_numpy()
    multi = gen > 1
    tbt = ((done["end"] - done["first_token"]).to_numpy()[multi]) / (gen[multi] - 1)
    per: dict[str, Any] = {}
    for (model, cls), g in done.groupby(["model", "cls"], observed=True, sort=True):
        lt = (g["end"] - g["arrival"]).to_numpy()
        per[f"{model}/{cls}"] = {
            "n": len(g),
            "latency": _pct(lt),
            "ttft": _pct((g["first_token"] - g["arrival"]).to_numpy()),
        }
    by_class: dict[str, Any] = {}
    for cls, g in df.groupby("cls", observed=True, sort=True):
        gd = g[g["status"] == "done"]
        by_class[str(cls)] = {
            "n": len(g),
            "done": len(gd),
            "shed": int((g["status"] == "shed").sum()),
            "latency": _pct((gd["end"] - gd["arrival"]).to_numpy()),
        }
    slo = done["cls"].astype(str).map(slos).to_numpy(dtype=float)
    good = int((lat <= slo).sum()) if lat.size else 0
    span = max(sim_time, 1e-12)
    hits = m.tier_hits
    total_hits = float(hits.sum())
    hit_rate = {
        t: (float(hits[i] / total_hits) if total_hits else None) for i, t in enumerate(TIERS)
    }
    hit_rate["local"] = float(hits[:3].sum() / total_hits) if total_hits else None
    hit_rate["cross_node"] = hit_rate["remote"]
    hit_rate["disk_fallback"] = hit_rate["object"]
    fl = np.asarray(m.fetch_lat)
    out = {
        "requests": len(df),
        "completed": len(done),
        "shed": int((df["status"] == "shed").sum()),
        "rejected": int((df["status"] == "rejected").sum()),
        "unfinished": int((df["status"] == "pending").sum()),
        "degraded": int((df["status"] == "degraded").sum()),
        "sim_time_s": sim_time,
        "throughput_rps": len(done) / span,
        "tokens_per_s": float(gen.sum()) / span,
        "goodput_rps": good / span,
        "slo_attainment": good / len(done) if len(done) else None,
        "latency": _pct(lat),
        "ttft": _pct(ttft),
        "tbt": _pct(tbt),
        "per_model_class": per,
        "per_class": by_class,
        "hit_rate": hit_rate,
        "bytes_by_tier": {t: float(m.tier_bytes[i]) for i, t in enumerate(TIERS) if i > 0},
        "param_wait_share": m.param_wait / m.busy if m.busy else 0.0,
        "param_load_p99_s": float(np.percentile(fl, 99)) if fl.size else None,
        "replicas_added": m.replicas_added,
        "fetch_retries": m.fetch_retries,
        "max_context_served": int((done["input_tokens"] + done["output_tokens"]).max())
        if len(done)
        else 0,
    }
    out.update(extra)
    return _round(out)


def _round(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, float | np.floating):
        v = float(x)
        return float(f"{v:.9g}") if np.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    return x
