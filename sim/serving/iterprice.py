"""The price of one serving iteration on the simulator's hot path.

:class:`RooflinePass` is the roofline implementation of
:class:`sim.serving.itercost.IterationCost` (built by :func:`sim.serving.roofline.roofline_pass`):
one fused, tensor/pipeline-parallel pass over the weights, priced layer kind by layer kind,
with its all-reduces and pipeline hand-offs. :class:`IterPricer` is what each deployed model
(:class:`sim.serving.context.ModelRt`) asks per iteration: the iteration cost's price plus the
serving loop's per-iteration gap, with decode-only iterations read from a memo interpolated
between context knots.

Both take plain numbers (no pydantic profiles), so the optional compiled build compiles them
(``engine/native.py``); every price is the same float in either build
(``tests/sim/serving/test_iterprice.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: decode cost table knots: every ``CTX_BUCKET`` tokens of total batch context
CTX_BUCKET_BITS = 6
CTX_BUCKET = 1 << CTX_BUCKET_BITS
#: memo keys pack ``(batch, knot)`` into one int: ``batch << _KEY_SHIFT | knot``
_KEY_SHIFT = 40

#: ``work(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)`` of an iteration cost
WorkFn = Callable[[int, float, int, int, float], tuple[float, float, float, float]]


def _max(a: float, b: float) -> float:
    """``max(a, b)`` as CPython computes it (``b`` only when ``b > a``)."""
    return b if b > a else a


def _min(a: float, b: float) -> float:
    """``min(a, b)`` as CPython computes it (``b`` only when ``b < a``)."""
    return b if b < a else a


class RooflinePass:
    """One fused iteration on a ``tp`` x ``pp`` replica, priced by the roofline.

    ``groups`` are the model's layer kinds with multiplicities: ``(flops per token, weight
    bytes, attention, lookup, lm_head, count)``, FLOPs and bytes per TP rank.

    Each layer costs ``max(flops / rate, bytes / hbm_bandwidth) + per_layer_overhead`` per GPU:
    its FLOPs and weights split over ``tp`` GPUs; an attention layer adds causal attention over
    the prompt chunks (``prefill_sq``: their squared lengths plus twice length x prior
    context), paged attention over the decodes' context and the KV it reads and writes; a
    lookup layer reads one row per token; the LM head runs only for sampled tokens (prompts
    whose prefill ends here, and every decode). Stages run one after another for the one
    batch in flight, each paying a kernel launch. Collectives: ``2`` all-reduces per
    transformer layer and one for the embedding, of ``tokens x hidden x act_bytes`` each
    (a ring over the TP link), plus ``pp - 1`` activation hand-offs.
    """

    def __init__(
        self,
        groups: list[tuple[float, float, bool, bool, bool, int]],
        *,
        tp: int,
        pp: int,
        flop_rate: float,
        hbm_bandwidth: float,
        overhead: float,
        launch: float,
        attn_flops_per_ctx: float,
        kv_bytes_per_token_layer: float,
        kv_replication: int,
        hidden: int,
        dtype_bytes: int,
        act_bytes: int,
        n_allreduce: int,
        link: tuple[float, float],
    ) -> None:
        self.flops1 = [float(g[0]) for g in groups]
        self.bytes1 = [float(g[1]) for g in groups]
        self.attention = [bool(g[2]) for g in groups]
        self.lookup = [bool(g[3]) for g in groups]
        self.head = [bool(g[4]) for g in groups]
        self.count = [int(g[5]) for g in groups]
        self.tp = int(tp)
        self.pp = int(pp)
        self.flop_rate = float(flop_rate)
        self.hbm_bandwidth = float(hbm_bandwidth)
        self.overhead = float(overhead)
        self.launch = float(launch)
        self.attn_flops_per_ctx = float(attn_flops_per_ctx)
        self.kv_bytes_per_token_layer = float(kv_bytes_per_token_layer)
        self.kv_replication = int(kv_replication)
        self.hidden = int(hidden)
        self.dtype_bytes = int(dtype_bytes)
        self.act_bytes = int(act_bytes)
        self.n_allreduce = int(n_allreduce)
        self.link_latency = float(link[0])
        self.link_bandwidth = float(link[1])

    def allreduce_time(self, nbytes: float) -> float:
        """One ring all-reduce of ``nbytes`` over the ``tp`` GPUs: ``2 (tp - 1)`` steps, each
        moving ``nbytes / tp`` over the TP link and paying its latency; 0 at ``tp = 1``."""
        tp = self.tp
        if tp <= 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (tp - 1)
        return steps * (self.link_latency + nbytes / tp / self.link_bandwidth)

    def handoff_time(self, tokens: float) -> float:
        """Seconds of the ``pp - 1`` activation hand-offs of ``tokens`` tokens (0 at ``pp = 1``)."""
        if self.pp <= 1:
            return 0.0
        act = tokens * self.hidden * self.act_bytes
        return (self.pp - 1) * (self.link_latency + act / self.tp / self.link_bandwidth)

    def work(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> tuple[float, float, float, float]:
        """``(compute_s, collective_s, flops, bytes)`` of one fused iteration (all
        zeros when it runs no token)."""
        tokens = float(prefill_tokens + n_decode)
        if tokens <= 0:
            return 0.0, 0.0, 0.0, 0.0
        tp = self.tp
        sampled = float(n_prompts + n_decode)
        a = self.attn_flops_per_ctx
        attn_f = (0.5 * a * prefill_sq + a * decode_ctx) / tp
        kv_b = (
            self.kv_bytes_per_token_layer * (prefill_tokens + decode_ctx) * self.kv_replication / tp
        )
        row = self.hidden * self.dtype_bytes / tp
        rate, bw, over = self.flop_rate, self.hbm_bandwidth, self.overhead
        t = 0.0
        flops = 0.0
        nbytes = 0.0
        attention, lookup, head, count = self.attention, self.lookup, self.head, self.count
        bytes1 = self.bytes1
        for i, f1 in enumerate(self.flops1):
            toks = sampled if head[i] else tokens
            f = f1 * toks
            b = _min(bytes1[i], toks * row) if lookup[i] else bytes1[i]
            if attention[i]:
                f += attn_f
                b += kv_b
            c = count[i]
            t += c * (_max(f / rate, b / bw) + over)
            flops += c * f
            nbytes += c * b
        compute = t + self.launch * self.pp  # every layer runs once, stage after stage
        act = tokens * self.hidden * self.act_bytes
        coll = self.n_allreduce * self.allreduce_time(act) + self.handoff_time(tokens)
        return compute, coll, flops * tp, nbytes * tp

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[tuple[str, float, str]]:
        """``(op, seconds, source)`` of one iteration, by layer kind (``embedding``,
        ``transformer_layers`` with their attention and KV reads, ``other_layers``,
        ``lm_head``), the kernel launches, the all-reduces and the PP hand-offs; every source
        ``roofline`` (``not run`` for a zero term). The seconds sum to :meth:`work`'s
        ``compute + collectives`` up to rounding."""
        tokens = float(prefill_tokens + n_decode)
        totals: dict[str, float] = {
            "embedding": 0.0,
            "transformer_layers": 0.0,
            "other_layers": 0.0,
            "lm_head": 0.0,
        }
        launch = allreduce = handoff = 0.0
        if tokens > 0:
            sampled = float(n_prompts + n_decode)
            a, tp = self.attn_flops_per_ctx, self.tp
            attn_f = (0.5 * a * prefill_sq + a * decode_ctx) / tp
            kv_b = (
                self.kv_bytes_per_token_layer
                * (prefill_tokens + decode_ctx)
                * self.kv_replication
                / tp
            )
            row = self.hidden * self.dtype_bytes / tp
            for i, f1 in enumerate(self.flops1):
                toks = sampled if self.head[i] else tokens
                f = f1 * toks
                b = _min(self.bytes1[i], toks * row) if self.lookup[i] else self.bytes1[i]
                if self.attention[i]:
                    f += attn_f
                    b += kv_b
                secs = self.count[i] * (
                    _max(f / self.flop_rate, b / self.hbm_bandwidth) + self.overhead
                )
                if self.head[i]:
                    totals["lm_head"] += secs
                elif self.lookup[i]:
                    totals["embedding"] += secs
                elif self.attention[i]:
                    totals["transformer_layers"] += secs
                else:
                    totals["other_layers"] += secs
            launch = self.launch * self.pp
            act = tokens * self.hidden * self.act_bytes
            allreduce = self.n_allreduce * self.allreduce_time(act)
            handoff = self.handoff_time(tokens)
        totals["kernel_launch"] = launch
        totals["allreduce"] = allreduce
        totals["pp_handoff"] = handoff
        return [(name, s, "roofline" if s > 0 else "not run") for name, s in totals.items()]


class IterPricer:
    """``(seconds, flops, bytes)`` of one iteration of one deployed model (see
    :meth:`sim.serving.context.ModelRt.iter_cost`, which asks this).

    ``cost`` is the model's iteration cost (:class:`sim.serving.itercost.IterationCost`); a
    :class:`RooflinePass` is called directly (a compiled call in the compiled build). Every
    price is ``compute + collectives`` of one fused pass plus the serving loop's
    ``iter_gap_s``. A CNN's iteration is one forward pass over ``max(n_prompts, 1)`` samples.
    Decode-only prices are memoised per (batch, knot of ``CTX_BUCKET`` context tokens) and
    interpolated linearly between knots; with ``memo=False`` every iteration is one call of
    ``cost.work`` with its own shape (a sequential cost: a recording).
    """

    def __init__(self, cost: Any, is_cnn: bool, iter_gap_s: float, memo: bool = True) -> None:
        self.cost = cost
        self.is_cnn = is_cnn
        self.iter_gap_s = float(iter_gap_s)
        self.use_memo = memo
        self.roof: RooflinePass | None = cost if isinstance(cost, RooflinePass) else None
        self.work_fn: WorkFn = cost.work
        #: decode price per memo key: (seconds, slope per token, flops, slope, bytes, slope)
        self.memo: dict[int, tuple[float, float, float, float, float, float]] = {}

    def iter_cost(
        self, prefill_tokens: int, prefill_sq: float, n_prompts: int, n_dec: int, ctx: float
    ) -> tuple[float, float, float]:
        """See :meth:`sim.serving.context.ModelRt.iter_cost`."""
        if self.is_cnn:
            samples = n_prompts if n_prompts > 1 else 1
            t, f, by = self.raw(samples, 0.0, samples, 0, 0.0)
            return t + self.iter_gap_s, f, by
        if prefill_tokens <= 0 and self.use_memo:
            if n_dec <= 0:
                return self.iter_gap_s, 0.0, 0.0
            knot = int(ctx) >> CTX_BUCKET_BITS
            key = n_dec << _KEY_SHIFT | knot
            d = self.memo.get(key)
            if d is None:
                lo = self.raw(0, 0.0, 0, n_dec, float(knot << CTX_BUCKET_BITS))
                hi = self.raw(0, 0.0, 0, n_dec, float((knot + 1) << CTX_BUCKET_BITS))
                d = (
                    lo[0],
                    (hi[0] - lo[0]) / CTX_BUCKET,
                    lo[1],
                    (hi[1] - lo[1]) / CTX_BUCKET,
                    lo[2],
                    (hi[2] - lo[2]) / CTX_BUCKET,
                )
                self.memo[key] = d
            x = ctx - (knot << CTX_BUCKET_BITS)
            return (
                self.iter_gap_s + d[0] + d[1] * x,
                d[2] + d[3] * x,
                d[4] + d[5] * x,
            )
        t, f, b = self.raw(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)
        return t + self.iter_gap_s, f, b

    def raw(
        self, prefill_tokens: int, prefill_sq: float, n_prompts: int, n_dec: int, ctx: float
    ) -> tuple[float, float, float]:
        """``(seconds, flops, bytes)`` of the iteration's compute, without the gap."""
        roof = self.roof
        if roof is not None:  # a direct (compiled) call
            c, k, f, b = roof.work(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)
        else:
            c, k, f, b = self.work_fn(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)
        return c + k, f, b
