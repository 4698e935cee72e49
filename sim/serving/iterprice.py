"""The price of one serving iteration on the simulator's hot path.

:class:`RooflinePass` is the arithmetic of :meth:`sim.serving.costmodel.CostModel.iteration_work`
for a roofline cost model (no measured op tables): one fused, tensor/pipeline-parallel pass
over the weights. :class:`IterPricer` is what each deployed model
(:class:`sim.serving.context.ModelRt`) asks per iteration: the cost model's price plus the
serving loop's per-iteration gap, with decode-only iterations read from a memo interpolated
between context knots.

Both live apart from the cost model so the optional compiled build can compile them
(``engine/native.py``): the cost model is built from validated pydantic profiles, these take
plain numbers. The arithmetic is the cost model's, operation for operation and in the same
order, so every price is the same float in either build and whichever object computes it
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

#: ``iteration_work(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)``
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
    bytes, attention, lookup, lm_head, count)``, FLOPs and bytes per TP rank. See
    :meth:`sim.serving.costmodel.CostModel.iteration_work` for the model; :meth:`work`
    returns what it returns when the profile has no op tables.
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
        """One ring all-reduce of ``nbytes`` over the ``tp`` GPUs (0 at ``tp = 1``); see
        :meth:`sim.serving.costmodel.CostModel.allreduce_time`."""
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


class IterPricer:
    """``(seconds, flops, bytes)`` of one iteration of one deployed model (see
    :meth:`sim.serving.context.ModelRt.iter_cost`, which asks this).

    ``cost`` is the model's cost model. Its ``roofline`` (a :class:`RooflinePass`, or None
    when it has op tables) is called directly; otherwise its ``iteration_work`` when it has
    one, else its ``prefill_time`` and ``decode_step_time``. ``fused``: an iteration mixing
    prefill and decode is one pass (``compute + collectives``), not a prefill pass plus a
    decode pass. Decode-only prices are memoised per (batch, knot of ``CTX_BUCKET`` context
    tokens) and interpolated linearly between knots.
    """

    def __init__(self, cost: Any, is_cnn: bool, iter_gap_s: float, fused: bool) -> None:
        self.cost = cost
        self.is_cnn = is_cnn
        self.iter_gap_s = float(iter_gap_s)
        self.fused = fused
        roof = getattr(cost, "roofline", None)
        self.roof: RooflinePass | None = roof if isinstance(roof, RooflinePass) else None
        self.work_fn: WorkFn | None = getattr(cost, "iteration_work", None)
        #: decode price per memo key: (seconds, slope per token, flops, slope, bytes, slope)
        self.memo: dict[int, tuple[float, float, float, float, float, float]] = {}

    def iter_cost(
        self, prefill_tokens: int, prefill_sq: float, n_prompts: int, n_dec: int, ctx: float
    ) -> tuple[float, float, float]:
        """See :meth:`sim.serving.context.ModelRt.iter_cost`."""
        if self.is_cnn:
            t = float(self.cost.cnn_batch_time(max(n_prompts, 1)))
            return t + self.iter_gap_s, 0.0, 0.0
        if prefill_tokens <= 0:
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
        roof, work_fn = self.roof, self.work_fn
        if roof is not None:  # a direct (compiled) call
            c, k, f, b = roof.work(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)
        elif work_fn is not None:
            c, k, f, b = work_fn(prefill_tokens, prefill_sq, n_prompts, n_dec, ctx)
        else:
            c = k = f = b = 0.0
        if self.fused and (roof is not None or work_fn is not None):
            return c + k, f, b
        cost = self.cost
        t = 0.0
        if prefill_tokens > 0:
            t += float(cost.prefill_time(int(prefill_tokens), round(prefill_sq)))
        if n_dec > 0:
            t += float(cost.decode_step_time(int(n_dec), int(ctx)))
        return t, f, b
