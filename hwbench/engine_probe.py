"""Engine probe: time whole engine iterations and fit the simulator's compute terms to them.

The generic probes (:mod:`hwbench.probes`) measure a machine's matmul rate, copy bandwidths
and a tiny layer's overhead. On a small CPU model those do not add up to the engine's real
iteration time: every layer also pays NumPy temporaries and call overheads, and paged decode
attention (many small batched products) costs far more per context token than its bytes and
FLOPs say. This probe runs the engine's own decoder (the validation model,
:func:`hwbench.validate.decoder_config`) exactly as the engine does -- all layers, KV
allocation, paged decode attention -- for a few decode batches/contexts and prefill lengths.

:func:`fit_engine` then fits seven terms by least squares on log time:

* the roofline terms of :class:`sim.costmodel.CostModel` -- ``per_layer_overhead_s``,
  ``kernel_launch_s`` (per pass), the achieved FLOP rate and the weight-read bandwidth;
* three attention terms that :class:`EngineCostModel` adds per attention layer: a fixed cost
  per decode step (``attn_fixed_s``), a cost per context token of the batch
  (``attn_per_token_s``) and, in prefill, a cost per squared prompt token (``prefill_sq_s``).

The profile keeps the points in ``fitted["engine_pass"]`` (kind 0 = decode, 1 = prefill) and
the terms in ``fitted["engine_fit"]``; the roofline terms also replace the ``gpu`` block's
values so the plain :class:`CostModel` benefits too. Link bandwidths are untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.runtime.model import DecoderConfig, DecoderModel, unpack
from engine.runtime.weights import ResidentWeights
from sim.costmodel import CostModel, GpuProfile, Profile

__all__ = ["EngineCostModel", "PassPoint", "calibrate_engine", "engine_probe", "fit_engine"]

DECODE, PREFILL = 0, 1


@dataclass(frozen=True)
class PassPoint:
    """One probed iteration shape and its mean time (``median_s`` holds the mean): ``kind`` DECODE (``batch`` sequences
    of ``context`` tokens) or PREFILL (one prompt of ``tokens``)."""

    kind: int
    batch: int
    context: int
    tokens: int
    median_s: float
    q25_s: float
    q75_s: float

    def row(self) -> dict[str, float]:
        return {
            "kind": float(self.kind),
            "batch": float(self.batch),
            "context": float(self.context),
            "tokens": float(self.tokens),
            "median_s": self.median_s,
            "q25_s": self.q25_s,
            "q75_s": self.q75_s,
        }


def engine_probe(
    cfg: DecoderConfig,
    xp: ModuleType = np,
    *,
    decode: tuple[tuple[int, int], ...] = (
        (1, 64),
        (1, 256),
        (4, 128),
        (8, 64),
        (8, 256),
        (16, 128),
        (16, 256),
    ),
    prefill: tuple[int, ...] = (16, 64, 128, 256),
    warmup: int = 1,
    repeats: int = 5,
) -> list[PassPoint]:
    """Mean seconds of whole engine iterations (every layer) for each shape."""
    weights = ResidentWeights(11, cfg.layer_bytes(), xp)
    weights.load()
    layers = [unpack(cfg.layout(i), weights.layer(i, 0.0), xp) for i in range(cfg.n_layers)]
    rng = np.random.default_rng(0)
    need = max([b * (c + warmup + repeats + 1) for b, c in decode] + [max(prefill, default=1)])
    model = DecoderModel(cfg, need + 64 * cfg.block_tokens, xp)
    sid = 0
    out: list[PassPoint] = []

    def iteration(pre: list[tuple[int, np.ndarray]], dec: list[tuple[int, int]]) -> float:
        t0 = time.perf_counter()
        st = model.begin(pre, dec)
        for i, w in enumerate(layers):
            model.run_layer(st, i, w)
        logits = st.logits_p if pre else st.logits_d
        int(xp.argmax(logits[0]))
        return time.perf_counter() - t0

    for batch, ctx in decode:
        seqs = []
        for _ in range(batch):
            sid += 1
            iteration([(sid, rng.integers(0, cfg.vocab, ctx))], [])
            seqs.append(sid)
        ts = [iteration([], [(s, 1) for s in seqs]) for _ in range(warmup + repeats)][warmup:]
        for s in seqs:
            model.release(s)
        out.append(_point(DECODE, batch, ctx + warmup + repeats // 2, 0, ts))
    for tokens in prefill:
        ts = []
        for _ in range(warmup + repeats):
            sid += 1
            ts.append(iteration([(sid, rng.integers(0, cfg.vocab, tokens))], []))
            model.release(sid)
        out.append(_point(PREFILL, 1, 0, tokens, ts[warmup:]))
    return out


def _point(kind: int, batch: int, ctx: int, tokens: int, ts: list[float]) -> PassPoint:
    # The MEAN, not the median: a request's latency is a sum of iteration times, which
    # converges to the mean (pauses when the OS runs something else included).
    q = np.percentile(ts, [25, 75])
    return PassPoint(kind, batch, ctx, tokens, float(np.mean(ts)), float(q[0]), float(q[1]))


class EngineCostModel(CostModel):
    """:class:`CostModel` plus the engine's attention terms from ``fitted["engine_fit"]``
    (zero when the profile has none, which gives the plain cost model)."""

    def __init__(self, profile: Profile, model: Any) -> None:
        super().__init__(profile, model)
        fit = (profile.fitted.get("engine_fit") or [{}])[0]
        self.attn_fixed = float(fit.get("attn_fixed_s", 0.0))
        self.attn_token = float(fit.get("attn_per_token_s", 0.0))
        self.prefill_sq = float(fit.get("prefill_sq_s", 0.0))
        self.n_attn = int(model.n_attention_layers)

    def decode_step_time(self, batch: int, total_context_tokens: int) -> float:
        t = super().decode_step_time(batch, total_context_tokens)
        if batch > 0:
            t += self.n_attn * (self.attn_fixed + self.attn_token * total_context_tokens)
        return t

    def decode_step_times(self, batch: np.ndarray, total_context_tokens: np.ndarray) -> np.ndarray:
        t = super().decode_step_times(batch, total_context_tokens)
        extra = self.n_attn * (
            self.attn_fixed + self.attn_token * np.asarray(total_context_tokens, dtype=float)
        )
        return t + np.where(np.asarray(batch) > 0, extra, 0.0)

    def prefill_time(self, tokens: int, sq_tokens: int | None = None) -> float:
        sq = float(tokens) ** 2 if sq_tokens is None else float(sq_tokens)
        return super().prefill_time(tokens, sq_tokens) + self.n_attn * self.prefill_sq * sq


TERMS: tuple[str, ...] = (
    "per_layer_overhead_s",
    "kernel_launch_s",
    "flop_rate",
    "hbm_bandwidth",
    "attn_fixed_s",
    "attn_per_token_s",
    "prefill_sq_s",
)


def _predict(cost: CostModel, p: PassPoint) -> float:
    if p.kind == DECODE:
        return float(cost.decode_step_time(p.batch, p.batch * p.context))
    return float(cost.prefill_time(p.tokens))


def _with_terms(profile: Profile, terms: dict[str, float], points: list[PassPoint]) -> Profile:
    g = profile.gpu
    gpu = GpuProfile(
        hbm_bytes=g.hbm_bytes,
        hbm_bandwidth=terms["hbm_bandwidth"],
        flops_fp16=terms["flop_rate"],
        flops_fp32=terms["flop_rate"],
        compute_efficiency=1.0,
        kernel_launch_s=terms["kernel_launch_s"],
        per_layer_overhead_s=terms["per_layer_overhead_s"],
    )
    fitted = dict(profile.fitted)
    fitted["engine_pass"] = [p.row() for p in points]
    fitted["engine_fit"] = [dict(terms)]
    return profile.model_copy(update={"gpu": gpu, "fitted": fitted})


def fit_engine(profile: Profile, spec: Any, points: list[PassPoint]) -> Profile:
    """``profile`` with the terms of the module docstring fitted to ``points``.

    ``spec`` is the validation model's :class:`sim.models.ModelSpec`. The search starts from
    the profile's own values (attention terms from 1 us) and moves one term at a time by
    shrinking factors of ``e**step`` while the squared log error of the pass times falls."""
    g = profile.gpu
    x = np.log(
        [
            max(g.per_layer_overhead_s, 1e-7),
            max(g.kernel_launch_s, 1e-7),
            g.flops_fp32 * g.compute_efficiency,
            g.hbm_bandwidth,
            1e-6,
            1e-8,
            1e-9,
        ]
    )
    meas = np.log([p.median_s for p in points])

    def terms(v: np.ndarray) -> dict[str, float]:
        return dict(zip(TERMS, (float(t) for t in np.exp(v)), strict=True))

    def loss(v: np.ndarray) -> float:
        cost = EngineCostModel(_with_terms(profile, terms(v), points), spec)
        pred = np.log([_predict(cost, p) for p in points])
        return float(np.sum((pred - meas) ** 2))

    best = loss(x)
    step = 2.0
    while step > 0.01:
        improved = False
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                y = x.copy()
                y[i] += sign * step
                v = loss(y)
                if v < best:
                    x, best, improved = y, v, True
        if not improved:
            step /= 2.0
    out = terms(x)
    out["rms_log_error"] = float(np.sqrt(best / max(len(points), 1)))
    notes = profile.notes + (
        " Compute terms fitted to whole engine iterations of the validation decoder "
        "(hwbench.engine_probe; see fitted.engine_fit)."
    )
    fitted_profile = _with_terms(profile, out, points)
    return fitted_profile.model_copy(update={"notes": notes})


def calibrate_engine(profile: Profile, xp: ModuleType = np, *, quick: bool = True) -> Profile:
    """Probe the validation decoder on backend ``xp`` and return the fitted profile."""
    from hwbench.validate import decoder_config, sim_catalogue

    cfg = decoder_config()
    spec = sim_catalogue(cfg)[cfg.name]
    points = engine_probe(cfg, xp, repeats=5 if quick else 15, warmup=1 if quick else 3)
    return fit_engine(profile, spec, points)
