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
EV_PREEMPT = 8
#: autoscaling (sim.control.autoscale): a decision (signed count, size after) and a replica's
#: state change (replica index, state code)
EV_SCALE, EV_REPLICA_STATE = 9, 10

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
        #: ``tier_hits[0]``: chunk accesses that found the chunk in HBM; ``tier_hits[i > 0]``:
        #: chunks fetched into HBM from tier ``i`` (demand and prefetch)
        self.tier_hits = np.zeros(len(TIERS))
        #: weight-chunk accesses: each chunk of a layer, once per iteration that computes it
        self.accesses = 0
        self.n_preempted = 0
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


#: achieved throughput below this share of the offered load in the steady window = overloaded
OVERLOAD_SHARE = 0.95
#: fewer requests than this in the steady window make its P99 a few requests' figure
MIN_P99_SAMPLES = 100


def _latency_arrays(
    arrival: np.ndarray, first: np.ndarray, end: np.ndarray, out: np.ndarray
) -> dict[str, dict[str, float | None]]:
    """E2E, TTFT and TPOT percentiles of done requests given as aligned arrays (TPOT: the
    mean gap between a request's tokens after the first, over requests of two or more
    tokens)."""
    multi = out > 1
    tpot = (end[multi] - first[multi]) / (out[multi] - 1)
    return {"e2e": _pct(end - arrival), "ttft": _pct(first - arrival), "tpot": _pct(tpot)}


def user_speeds(first: np.ndarray, end: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Per-user speed of done requests given as aligned arrays: output tokens per second
    of each request's decode phase, ``(out - 1) / (end - first)`` (its tokens after the
    first over the time they took: 1 / the request's TPOT), for requests of two or more
    tokens that took time after their first (others have no decode phase)."""
    span = end - first
    keep = (out > 1) & (span > 0)
    speeds: np.ndarray = (out[keep] - 1) / span[keep]
    return speeds


#: the per-user speed percentiles a summary reports: the median and the slow tail (p10: the
#: speed 90% of users reach or beat; p1: 99%), then the mean
SPEED_PERCENTILES: tuple[str, ...] = ("p50", "p10", "p1", "mean")


def speed_summary(speeds: np.ndarray) -> dict[str, float | None]:
    """``{p50, p10, p1, mean}`` of per-user speeds (tokens/s; all None without any)."""
    if speeds.size == 0:
        return dict.fromkeys(SPEED_PERCENTILES)
    q = np.percentile(speeds, [50, 10, 1])
    return {"p50": float(q[0]), "p10": float(q[1]), "p1": float(q[2]), "mean": float(speeds.mean())}


def _limit(classes: dict[str, dict[str, float | None]], cls: str, key: str) -> float:
    """``cls``'s objective ``key``: inf when None; NaN (never met) when ``cls`` has no entry."""
    if cls not in classes:
        return float("nan")
    v = classes[cls][key]
    return float("inf") if v is None else float(v)


def _slo_ok(
    cls_codes: np.ndarray,
    class_names: list[str],
    arrival: np.ndarray,
    first: np.ndarray,
    end: np.ndarray,
    out: np.ndarray,
    classes: dict[str, dict[str, float | None]],
) -> np.ndarray:
    """Per request (aligned arrays of done requests): whether it met every objective of its
    class (``cls_codes`` index ``class_names``; a class missing from ``classes`` has none)."""
    ok = np.ones(len(end), dtype=bool)
    e2e = end - arrival
    ttft = first - arrival
    tpot = np.where(out > 1, (end - first) / np.maximum(out - 1, 1), 0.0)
    for key, val in (("e2e", e2e), ("ttft", ttft), ("tpot", tpot)):
        # a class without an entry (or code -1): NaN, never met; an objective of None: inf
        lim = np.array([_limit(classes, c, key) for c in class_names] + [np.nan], dtype=float)
        ok &= val <= lim[cls_codes]
    return ok


def meets_slo(g: pd.DataFrame, classes: dict[str, dict[str, float | None]]) -> np.ndarray:
    """Per done request of ``g``: whether it met every objective of its class (``e2e``,
    ``ttft``, ``tpot``; ``None`` = no objective)."""
    cat = g["cls"].astype("category").cat
    return _slo_ok(
        cat.codes.to_numpy(),
        [str(c) for c in cat.categories],
        g["arrival"].to_numpy(),
        g["first_token"].to_numpy(),
        g["end"].to_numpy(),
        g["output_tokens"].to_numpy(),
        classes,
    )


def summarize(
    df: pd.DataFrame,
    m: Metrics,
    sim_time: float,
    classes: dict[str, dict[str, float | None]],
    extra: dict[str, Any],
    window: tuple[float, float] | None = None,
    closed_loop: bool = False,
) -> dict[str, Any]:
    """The run's headline figures (JSON-ready; every float rounded to 9 significant digits).

    ``classes`` maps each class to its objectives ``{"e2e", "ttft", "tpot"}`` (seconds or
    ``None``). Latency percentiles, throughput and goodput are over the *steady window*
    ``window = (start, end)``: requests arriving in it; offered = those arrivals per second,
    achieved = requests finishing in the window shifted by its requests' median time in the
    system, per second (so time in the system is not lost throughput); ``overloaded`` when achieved <
    ``OVERLOAD_SHARE`` x offered. ``requests`` counts every request of the run;
    ``throughput.run_rps`` and ``tokens_per_s`` are over the whole run (completed / simulated
    time), warm-up and drain included. ``user_tokens_per_s`` is the per-user speed
    (:func:`user_speeds`) of the window's done requests: median, slow tail and mean.

    Memory: reads ``df``'s columns as arrays and selects with index arrays (a few bytes per
    request), never copying the frame."""
    w0, w1 = window if window is not None else (0.0, max(sim_time, 1e-12))
    span = max(w1 - w0, 1e-12)
    arr = df["arrival"].to_numpy()
    end = df["end"].to_numpy()
    first = df["first_token"].to_numpy()
    out_tok = df["output_tokens"].to_numpy()
    in_tok = df["input_tokens"].to_numpy()
    mcat = df["model"].astype("category").cat
    ccat = df["cls"].astype("category").cat
    mcode, ccode = mcat.codes.to_numpy(), ccat.codes.to_numpy()
    cnames = [str(c) for c in ccat.categories]
    st = df["status"]
    is_done = (st == "done").to_numpy()
    in_w = (arr >= w0) & (arr <= w1)
    win = np.flatnonzero(in_w)  # the window's requests, in frame order
    done_all = np.flatnonzero(is_done)
    done = np.flatnonzero(in_w & is_done)
    ends = end[done_all]
    # achieved: requests finishing in the window shifted by the median time in the system of
    # the window's requests (in steady state as many finish there as arrived in the window;
    # overloaded, the replicas finish only what their capacity allows, drain included)
    lag = float(np.median(end[done] - arr[done])) if len(done) else 0.0
    finished_in = int(((ends >= w0 + lag) & (ends <= w1 + lag)).sum())
    offered = None if closed_loop else len(win) / span
    achieved = finished_in / span
    overloaded = bool(offered is not None and offered > 0 and achieved < OVERLOAD_SHARE * offered)

    def lat(ix: np.ndarray) -> dict[str, dict[str, float | None]]:
        return _latency_arrays(arr[ix], first[ix], end[ix], out_tok[ix])

    def ok_of(ix: np.ndarray) -> np.ndarray:
        return _slo_ok(ccode[ix], cnames, arr[ix], first[ix], end[ix], out_tok[ix], classes)

    good = ok_of(done)
    per: dict[str, Any] = {}
    mnames = [str(c) for c in mcat.categories]
    for key, ix in _groups(mcode[done], ccode[done], len(cnames) + 1, done):
        mi, ci = divmod(key, len(cnames) + 1)
        per[f"{mnames[mi]}/{cnames[ci]}"] = {"n": len(ix), "latency": lat(ix)}
    by_class: dict[str, Any] = {}
    is_shed = (st == "shed").to_numpy()
    for code in np.unique(ccode[win]):
        sel = ccode[win] == code
        g = win[sel]
        gd = g[is_done[g]]
        ok = ok_of(gd)
        by_class[cnames[int(code)]] = {
            "n": len(g),
            "done": len(gd),
            "shed": int(is_shed[g].sum()),
            "latency": lat(gd),
            "user_tokens_per_s": speed_summary(user_speeds(first[gd], end[gd], out_tok[gd])),
            "goodput_rps": int(ok.sum()) / span,
            "slo_attainment": int(ok.sum()) / len(g) if len(g) else None,
        }
    counts = {
        "total": len(df),
        "completed": len(done_all),
        "shed": int((st == "shed").sum()),
        "rejected": int((st == "rejected").sum()),
        "unfinished": int((st == "pending").sum()),
        "degraded": int((st == "degraded").sum()),
        "in_window": len(win),
        "preemptions": int(m.n_preempted),
    }
    warnings = _warnings(counts["unfinished"], offered if overloaded else None, achieved, len(done))
    fl = np.asarray(m.fetch_lat)
    gen = out_tok[done]
    out = {
        "requests": counts,
        "sim_time_s": sim_time,
        "window_s": [w0, w1],
        "throughput": {
            "offered_rps": offered,
            "achieved_rps": achieved,
            "run_rps": len(done_all) / max(sim_time, 1e-12),
            "tokens_per_s": float(out_tok[done_all].sum()) / max(sim_time, 1e-12),
            "output_tokens_per_s": float(gen.sum()) / span,
        },
        "overloaded": overloaded,
        "goodput_rps": int(good.sum()) / span,
        "slo_attainment": int(good.sum()) / len(win) if len(win) else None,
        "latency": lat(done),
        "user_tokens_per_s": speed_summary(user_speeds(first[done], end[done], out_tok[done])),
        "per_model_class": per,
        "per_class": by_class,
        "param_wait_share": m.param_wait / m.busy if m.busy else 0.0,
        "param_load_p99_s": float(np.percentile(fl, 99)) if fl.size else None,
        "replicas_added": m.replicas_added,
        "fetch_retries": m.fetch_retries,
        "max_context_served": int((in_tok[done_all] + out_tok[done_all]).max())
        if len(done_all)
        else 0,
        "warnings": warnings,
    }
    out.update(extra)
    rounded: dict[str, Any] = _round(out)
    return rounded


def _groups(
    mcode: np.ndarray, ccode: np.ndarray, n_cls: int, ix: np.ndarray
) -> list[tuple[int, np.ndarray]]:
    """The observed (model, class) pairs of the requests ``ix`` (their codes ``mcode``,
    ``ccode``), in category order, as ``(model * n_cls + class, requests of the pair)``."""
    pair = mcode.astype(np.int64) * n_cls + ccode
    return [(int(key), ix[pair == key]) for key in np.unique(pair)]


def _warnings(
    unfinished: int, overloaded_offer: float | None, achieved: float, n_done: int
) -> list[str]:
    """The summary's warnings: unfinished requests; overload (``overloaded_offer`` is the
    offered rate when overloaded, else None); a P99 from fewer than ``MIN_P99_SAMPLES``
    requests in the steady window (``n_done``)."""
    warnings: list[str] = []
    if unfinished:
        warnings.append(f"{unfinished} requests unfinished")
    if overloaded_offer is not None:
        warnings.append(
            f"overloaded: achieved {achieved:.4g} req/s < {OVERLOAD_SHARE:g} x offered "
            f"{overloaded_offer:.4g} req/s in the steady window"
        )
    if 0 < n_done < MIN_P99_SAMPLES:
        warnings.append(f"P99 from {n_done} requests in the steady window: a few requests' figure")
    return warnings


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
