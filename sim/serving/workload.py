"""Request workloads: arrival times and per-request attributes, generated vectorised.

A :class:`Workload` is a set of numpy arrays indexed by request id (ids are arrival order):
``arrival`` (s), ``model`` (deployment index), ``cls`` (class index), ``inp``/``out`` (tokens),
and, for traces that name their prompt blocks (Mooncake ``hash_ids``, one id per block of
``hash_block_tokens`` = 512 tokens), those ids in CSR form (:meth:`Workload.block_hash_ids`).
Open-loop kinds (poisson, step, diurnal, profile, trace) fix every arrival up front;
``closed-loop`` fixes only the attributes and the think times: the cluster issues request
``i + clients`` when a client's previous request completes (see :mod:`sim.cluster`).

Non-homogeneous arrivals (step, diurnal, profile: :mod:`sim.serving.rateprofile`) invert the
cumulative intensity Lambda(t) of a unit-rate Poisson process: t_i = Lambda^-1(E_1 + ... + E_i),
exact for piecewise-constant rates. Trace files: :mod:`sim.serving.traceformat` (formats),
:mod:`sim.serving.azuretrace` (the Azure CSV), :mod:`sim.serving.tracescale` (time scaling).
All draws come from the generator passed in (the runner gives the ``workload`` stream).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from engine.errors import InputError
from engine.limits import MAX_REQUESTS, show
from engine.units import MAX_DURATION
from sim.scenario import TokenDist, WorkloadCfg
from sim.serving.azuretrace import read_azure_csv
from sim.serving.rateprofile import invert_cumulative, profile_arrivals
from sim.serving.traceformat import check_request, trace_format
from sim.serving.tracescale import time_scale

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]

#: tokens per hash id in the Mooncake trace format
MOONCAKE_BLOCK_TOKENS = 512


@dataclass
class Workload:
    """Per-request arrays (length ``n``); ``arrival`` is non-decreasing for open loops."""

    arrival: F64
    model: I32
    cls: I32
    inp: I32
    out: I32
    closed_loop: bool = False
    clients: int = 0
    think: F64 | None = None
    #: all requests' prompt block hash ids, concatenated in request order (None: no ids)
    hash_flat: I64 | None = None
    #: request ``i``'s ids are ``hash_flat[hash_start[i]:hash_start[i + 1]]`` (length n + 1)
    hash_start: I64 | None = None
    #: prompt tokens named by one hash id
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @property
    def n(self) -> int:
        return int(self.arrival.shape[0])

    @property
    def has_block_hashes(self) -> bool:
        """Whether any request carries block hash ids."""
        return self.hash_flat is not None and self.hash_flat.size > 0

    def block_hash_ids(self, i: int) -> I64:
        """Request ``i``'s prompt block hash ids (empty when the workload has none)."""
        if self.hash_flat is None or self.hash_start is None:
            return np.zeros(0, dtype=np.int64)
        return self.hash_flat[self.hash_start[i] : self.hash_start[i + 1]]


def draw_tokens(dist: TokenDist, n: int, rng: np.random.Generator) -> I32:
    """``n`` token counts from ``dist``, clipped to ``[max(low, 1), high]``."""
    lo = max(dist.low, 1)
    if dist.dist == "fixed":
        vals = np.full(n, dist.mean)
    elif dist.dist == "uniform":
        vals = rng.integers(lo, dist.high + 1, size=n)
    elif dist.dist == "geometric":
        vals = rng.geometric(1.0 / max(dist.mean, 1.0), size=n)
    else:
        mu = np.log(dist.mean) - dist.sigma**2 / 2.0  # so that E[X] = mean before clipping
        vals = rng.lognormal(mu, dist.sigma, size=n)
    clipped: np.ndarray = np.clip(np.rint(vals), lo, max(dist.high, lo))
    return clipped.astype(np.int32)


def step_arrivals(cfg: WorkloadCfg, n: int, rng: np.random.Generator) -> F64:
    """Arrivals of a piecewise-constant rate: ``cfg.rate`` until the first step, then each
    step's rate from its ``at`` time on."""
    steps = sorted(cfg.steps, key=lambda s: s.at)
    ts = [0.0] + [s.at for s in steps if s.at > 0]
    rates = [cfg.rate] + [s.rate for s in steps if s.at > 0]
    if steps and steps[0].at == 0:
        rates[0] = steps[0].rate
    t = np.asarray(ts, dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(np.diff(t) * np.asarray(rates[:-1]))])
    targets = np.cumsum(rng.exponential(1.0, size=n))
    return invert_cumulative(t, cum, float(rates[-1]), targets)


def diurnal_arrivals(cfg: WorkloadCfg, n: int, rng: np.random.Generator) -> F64:
    """Arrivals of rate ``rate * (1 + amplitude * sin(2 pi t / period))``."""
    targets = np.cumsum(rng.exponential(1.0, size=n))
    horizon = targets[-1] / (cfg.rate * (1 - cfg.amplitude)) + cfg.period
    grid = np.linspace(0.0, horizon, max(4096, int(horizon / cfg.period * 512)))
    w = 2 * np.pi / cfg.period
    cum = cfg.rate * (grid + cfg.amplitude / w * (1 - np.cos(w * grid)))
    return invert_cumulative(grid, cum, cfg.rate, targets)


def bounded_arrivals(cfg: WorkloadCfg, rng: np.random.Generator) -> F64:
    """Every arrival of an open-loop ``cfg`` in ``[0, cfg.duration)``: unit-rate Poisson
    targets drawn in a block sized for the peak rate (redrawn twice as large if it falls
    short), mapped through the kind's rate; deterministic in ``rng``."""
    peak = cfg.rate
    if cfg.kind == "step":
        peak = max([cfg.rate] + [st.rate for st in cfg.steps])
    elif cfg.kind == "diurnal":
        peak = cfg.rate * (1 + cfg.amplitude)
    block = max(int(peak * cfg.duration * 1.1) + 64, 64)
    n = 0
    arrival = np.zeros(0)
    while True:
        n += block
        if cfg.kind == "poisson":
            arrival = np.cumsum(rng.exponential(1.0 / cfg.rate, size=n))
        elif cfg.kind == "step":
            arrival = step_arrivals(cfg, n, rng)
        else:
            arrival = diurnal_arrivals(cfg, n, rng)
        if arrival[-1] >= cfg.duration:
            return arrival[arrival < cfg.duration]


def read_mooncake(path: Path, limit: int) -> tuple[F64, I32, I32]:
    """(arrival s, input, output) of the first ``limit`` records of a Mooncake JSONL trace
    (``timestamp`` in ms). ``InputError`` names the line of a bad record."""
    ts, ins, outs, _, _ = read_mooncake_records(path, limit)
    return ts, ins, outs


def read_mooncake_records(path: Path, limit: int) -> tuple[F64, I32, I32, I64, I64]:
    """(arrival s, input, output, hash ids flat, hash id offsets) of the first ``limit``
    records of a Mooncake JSONL trace. ``hash_ids`` is optional per record; when given it is a
    list of ints, at most one per 512-token block of ``input_length``. ``InputError`` names the
    line of a bad record."""
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    flat: list[int] = []
    start = [0]
    tb = MOONCAKE_BLOCK_TOKENS
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if len(ts) >= limit:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                t = float(rec["timestamp"]) / 1000.0
                n_in = int(rec["input_length"])
                n_out = int(rec["output_length"])
                hids = rec.get("hash_ids", [])
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as err:
                raise InputError(
                    f"bad Mooncake record ({err}); need timestamp, input_length, output_length",
                    source=str(path),
                    where=f"line {lineno}",
                ) from None
            if not isinstance(hids, list) or not all(
                type(h) is int and -(2**63) <= h < 2**63 for h in hids
            ):
                raise InputError(
                    "hash_ids is not a list of integers; allowed: a list of 64-bit ints, one "
                    f"per {tb}-token block of the prompt",
                    source=str(path),
                    where=f"line {lineno}: hash_ids",
                )
            if len(hids) > -(-max(n_in, 0) // tb):
                raise InputError(
                    f"{len(hids)} hash ids for input_length {n_in}; allowed: at most one per "
                    f"{tb}-token block ({-(-max(n_in, 0) // tb)})",
                    source=str(path),
                    where=f"line {lineno}: hash_ids",
                )
            check_request(t, n_in, n_out, str(path), lineno)
            ts.append(t)
            ins.append(n_in)
            outs.append(n_out)
            flat.extend(hids)
            start.append(len(flat))
    return (
        np.asarray(ts),
        np.asarray(ins, dtype=np.int32),
        np.asarray(outs, dtype=np.int32),
        np.asarray(flat, dtype=np.int64),
        np.asarray(start, dtype=np.int64),
    )


def _reorder_csr(flat: I64, start: I64, order: npt.NDArray[np.intp]) -> tuple[I64, I64]:
    """The CSR lists ``(flat, start)`` with their rows taken in ``order``."""
    lens = np.diff(start)[order]
    new_start = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=new_start[1:])
    idx = np.repeat(start[:-1][order] - new_start[:-1], lens) + np.arange(
        new_start[-1], dtype=np.int64
    )
    return flat[idx], new_start


def read_request_csv(path: Path, limit: int) -> tuple[F64, I32, I32]:
    """(arrival s, input, output) from a CSV with columns ``time,input_tokens,output_tokens``."""
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        need = {"time", "input_tokens", "output_tokens"}
        try:
            if not need <= set(reader.fieldnames or []):
                raise InputError(
                    f"CSV header must contain {sorted(need)}", source=str(path), where="line 1"
                )
            for row in reader:
                if len(ts) >= limit:
                    break
                lineno = reader.line_num
                try:
                    t = float(row["time"])
                    n_in, n_out = int(row["input_tokens"]), int(row["output_tokens"])
                except (ValueError, TypeError, OverflowError) as err:
                    raise InputError(
                        f"bad record ({show(str(err))})", source=str(path), where=f"line {lineno}"
                    ) from None
                check_request(t, n_in, n_out, str(path), lineno)
                ts.append(t)
                ins.append(n_in)
                outs.append(n_out)
        except csv.Error as err:
            raise InputError(
                f"not a CSV record ({err})",
                source=str(path),
                where=f"line {reader.reader.line_num}",
            ) from None
    return np.asarray(ts), np.asarray(ins, dtype=np.int32), np.asarray(outs, dtype=np.int32)


#: prefix naming a trace shipped in the package (``engine/data/traces``)
SHIPPED_TRACE = "shipped:"


def trace_path(trace: str, base_dir: Path | None = None) -> Path:
    """The file of ``workload.trace``: ``shipped:NAME`` is a trace shipped in the package
    (``engine/data/traces/NAME``); else the path as given, or relative to ``base_dir``."""
    if trace.startswith(SHIPPED_TRACE):
        from importlib.resources import files

        return Path(str(files("engine") / "data" / "traces" / trace[len(SHIPPED_TRACE) :]))
    p = Path(trace)
    if not p.is_absolute() and base_dir is not None and not p.exists():
        p = base_dir / p
    return p


def _categorical(shares: list[float], n: int, rng: np.random.Generator) -> I32:
    p = np.asarray(shares, dtype=np.float64)
    return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int32)


def make_workload(
    cfg: WorkloadCfg,
    model_shares: list[float],
    rng: np.random.Generator,
    base_dir: Path | None = None,
    model_classes: list[int | None] | None = None,
) -> Workload:
    """Generate the workload ``cfg`` for deployments with traffic ``model_shares``;
    ``model_classes[i]`` (a class index or ``None``) pins the class of model ``i``'s requests."""
    think = None
    hash_flat: I64 | None = None
    hash_start: I64 | None = None
    if cfg.duration > 0 and cfg.kind == "closed-loop":
        raise InputError(
            "a closed-loop workload is bounded by `requests`, not `duration`",
            where="workload.duration",
        )
    if cfg.kind == "trace":
        arrival, inp, out, hash_flat, hash_start = _trace_requests(cfg, base_dir)
        n = int(arrival.size)
    else:
        arrival, think = _synthetic_arrivals(cfg, rng)
        n = int(arrival.size)
        inp = draw_tokens(cfg.input_tokens, n, rng)
        out = draw_tokens(cfg.output_tokens, n, rng)
    model = _categorical(model_shares, n, rng)
    cls = _categorical([c.share for c in cfg.classes], n, rng)
    for i, forced in enumerate(model_classes or []):
        if forced is not None:
            cls[model == i] = forced
    return Workload(
        arrival=arrival.astype(np.float64),
        model=model,
        cls=cls,
        inp=inp.astype(np.int32),
        out=out.astype(np.int32),
        closed_loop=cfg.kind == "closed-loop",
        clients=cfg.clients if cfg.kind == "closed-loop" else 0,
        think=think,
        hash_flat=hash_flat,
        hash_start=hash_start,
    )


def _trace_requests(
    cfg: WorkloadCfg, base_dir: Path | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, I64 | None, I64 | None]:
    """A trace workload's requests in arrival order, the first at time 0, times scaled by
    :func:`sim.serving.tracescale.time_scale` (``trace_time_scale`` or ``trace_peak_rate``),
    token counts at least 1, cut to ``duration`` (or the first ``requests`` records):
    ``(arrival, inp, out, hash_flat, hash_start)``, the block hash ids as CSR arrays for a
    Mooncake trace (else ``None``)."""
    if not cfg.trace:
        raise InputError("workload.trace: a trace workload needs a trace file path")
    try:
        p = trace_path(cfg.trace, base_dir)
        found = p.is_file()
    except OSError as err:  # e.g. a name longer than the file system takes
        raise InputError(
            f"no such trace file ({err.strerror}): {show(cfg.trace)}", where="workload.trace"
        ) from None
    if not found:
        raise InputError(f"no such trace file: {show(cfg.trace)}", where="workload.trace")
    bounded = cfg.duration > 0
    limit = MAX_REQUESTS + 1 if bounded else cfg.requests
    hash_flat: I64 | None = None
    hash_start: I64 | None = None
    fmt = trace_format(cfg.trace_format, p)
    if fmt == "mooncake":
        arrival, inp, out, hash_flat, hash_start = read_mooncake_records(p, limit)
    elif fmt == "azure":
        arrival, inp, out = read_azure_csv(p, limit)
    else:
        arrival, inp, out = read_request_csv(p, limit)
    if arrival.size == 0:
        raise InputError("trace has no records", source=str(p))
    if arrival.size > MAX_REQUESTS:
        raise InputError(
            f"more than {MAX_REQUESTS:,} records; allowed: at most that many requests a run "
            "(bound the trace by workload.requests instead of workload.duration)",
            source=str(p),
        )
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order][0]
    arrival = arrival * time_scale(cfg, arrival)
    if not arrival[-1] <= MAX_DURATION:
        raise InputError(
            f"the scaled trace lasts {show(float(arrival[-1]))} s; allowed: at most "
            f"{MAX_DURATION:g} s (a smaller trace_time_scale or a larger trace_peak_rate)",
            source=str(p),
        )
    inp, out = np.maximum(inp[order], 1), np.maximum(out[order], 1)
    if hash_flat is not None and hash_start is not None:
        hash_flat, hash_start = _reorder_csr(hash_flat, hash_start, order)
    if bounded:
        keep = arrival < cfg.duration  # a prefix: arrivals are sorted
        arrival, inp, out = arrival[keep], inp[keep], out[keep]
        if hash_flat is not None and hash_start is not None:
            hash_start = hash_start[: int(keep.sum()) + 1]
            hash_flat = hash_flat[: int(hash_start[-1])]
    return arrival, inp, out, hash_flat, hash_start


def _synthetic_arrivals(
    cfg: WorkloadCfg, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """Arrival times of a generated workload (over ``duration`` when bounded, else
    ``requests`` of them) and, for a closed loop, each request's think time: the first
    ``clients`` requests start at once, the rest on completion (arrivals all 0)."""
    n = cfg.requests
    if cfg.kind == "profile":
        return profile_arrivals(cfg, rng)[0], None
    if cfg.duration > 0:
        return bounded_arrivals(cfg, rng), None
    if cfg.kind == "poisson":
        return np.cumsum(rng.exponential(1.0 / cfg.rate, size=n)), None
    if cfg.kind == "step":
        return step_arrivals(cfg, n, rng), None
    if cfg.kind == "diurnal":
        return diurnal_arrivals(cfg, n, rng), None
    think = rng.exponential(cfg.think_time, size=n) if cfg.think_time > 0 else np.zeros(n)
    return np.zeros(n), think
