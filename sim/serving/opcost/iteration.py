"""The op-level cost model: one serving iteration of a decoder as a sum of per-GPU ops.

An iteration (vLLM v1 / SGLang style) runs prefill chunks and decodes of one replica in one
fused pass, so the weights are read once. For ``T = prefill_tokens + n_decode`` tokens on a
tensor-parallel group of ``tp`` GPUs (heads, KV heads, MLP width and vocabulary split ``tp``
ways; KV heads replicated when fewer than ``tp``), the ops are, per GPU:

================== ========= ==============================================================
op                 count     shape / bytes
================== ========= ==============================================================
embedding          1         lookup: reads ``T * hidden`` elements
embedding_allreduce 1        all-reduce of ``T * hidden`` elements (tp > 1; vocab-parallel)
input_norm         layers    fused residual-add + RMSNorm: reads and writes ``2 * hidden``
qkv_gemm           layers    GEMM ``m = T``, ``n = (heads + 2 kv_heads) head_dim / tp``,
                             ``k = hidden``
rope               layers    elementwise over q and k
attention_prefill  layers    causal attention of the prompt chunks (by tokens and squares)
attention_decode   layers    paged decode attention (by batch and mean context)
o_gemm             layers    GEMM ``n = hidden``, ``k = heads head_dim / tp``
allreduce_attn     layers    all-reduce of ``T * hidden`` elements (tp > 1)
post_attn_norm     layers    as input_norm
gate_up_gemm       layers    GEMM ``n = 2 ffn / tp``, ``k = hidden``
activation         layers    SiLU-and-mul: reads ``2 ffn / tp``, writes ``ffn / tp``
down_gemm          layers    GEMM ``n = hidden``, ``k = ffn / tp``
allreduce_mlp      layers    as allreduce_attn
final_norm         1         RMSNorm: reads ``hidden``, writes ``hidden``
lm_head            1         GEMM ``m = n_prompts + n_decode`` (last prompt token and each
                             decode only), ``n = vocab / tp``, ``k = hidden``, bf16
iteration_overhead 1         the profile's ``ops.roofline.iteration_overhead_s``
prompt_overhead    1         ``ops.engine.prompt_overhead_s_per_token`` x prompt tokens (a
                             calibrated engine's work outside the ops, slower after prefills)
admission          1         ``ops.framework.admission_s`` x ``n_prompts`` (the serving
                             framework's work per request admitted)
token_output       1         ``ops.framework.token_output_s`` x ``n_prompts + n_decode`` (its
                             work per sampled token: scheduling, output, detokenisation)
================== ========= ==============================================================

Each op's time comes from the profile's measured tables (:mod:`sim.serving.opcost.tables`) where one
covers it, else from the roofline ``max(flops / (peak * eff), bytes / (hbm_bw * mem_eff)) +
op_floor_s`` (all-reduce: a ring, ``2 (g - 1) / g * bytes / (nvlink_bw * link_eff) + 2 (g - 1)
* nvlink_latency``). :meth:`OpCostModel.iteration_breakdown` says which was used per op:
``table``, ``table-extrapolated`` (beyond the last knot), ``table-scaled`` (an attention table
of the same head size and GQA group with a different head count, scaled by heads),
``roofline``, ``fused`` (the profile says the engine fuses it: 0 s), ``overhead``,
``framework`` (a serving framework's overhead, ``ops.framework``), ``none in profile`` (0 s:
the profile states no framework overheads), or ``not run`` (0 s: no prompt tokens, no
decodes, or no all-reduce at ``tp = 1``).
Peak FLOP/s is the profile's ``flops_fp16`` for 2-byte weights, twice that for 1-byte (fp8)
weights, ``flops_fp32`` otherwise. TP groups are assumed to sit inside one NVLink domain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.serving.iterprice import RooflinePass
from sim.serving.models import ModelSpec
from sim.serving.moeparallel import DEFAULT_ROUTING_SKEW, ExpertParallel
from sim.serving.opcost.moemla import IN_MODULE, MOE_OP_NAMES, MlaOps, MoeOps
from sim.serving.opcost.singleops import SingleOps
from sim.serving.roofline import roofline_pass

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.moeroofline import MoeRoofline

#: the op names of an iteration, in execution order
OP_NAMES: tuple[str, ...] = (
    "embedding",
    "embedding_allreduce",
    "input_norm",
    "qkv_gemm",
    "rope",
    "attention_prefill",
    "attention_decode",
    "o_gemm",
    "allreduce_attn",
    "post_attn_norm",
    "gate_up_gemm",
    "activation",
    "down_gemm",
    "allreduce_mlp",
    "final_norm",
    "lm_head",
    "iteration_overhead",
    "layer_overhead",
    "prompt_overhead",
    "admission",
    "token_output",
)
#: ops the memoised part of :meth:`OpCostModel.iteration_time` leaves out (they depend on
#: more than the token count)
_NOT_MEMOISED = (
    "attention_prefill",
    "attention_decode",
    "prompt_overhead",
    "admission",
    "token_output",
)


@dataclass(frozen=True)
class OpCost:
    """One op of an iteration: total seconds over its layers and where the time came from."""

    name: str
    seconds: float
    source: str


class OpCostModel(SingleOps):
    """Iteration times of one decoder replica (``tp`` GPUs per stage) on one profile; see the
    module docstring for the op list. The op-table implementation of
    :class:`sim.serving.itercost.IterationCost`: :meth:`work` is the op sum plus the pipeline
    hand-offs of ``counts`` (a :class:`sim.serving.iterprice.RooflinePass` of the same replica,
    or for a model with experts its :class:`sim.serving.moeroofline.MoeRoofline`, which also
    counts the FLOPs and bytes; default: a one-stage replica's plain roofline). Holds no state
    between calls apart from memoised sums."""

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec,
        tp: int = 1,
        counts: RooflinePass | MoeRoofline | None = None,
        ep: int = 1,
        routing_skew: float = DEFAULT_ROUTING_SKEW,
        gpus_per_server: int | None = None,
    ) -> None:
        super().__init__(profile, model, tp)
        shape = self.shape
        self.counts = counts if counts is not None else roofline_pass(profile, model, tp=tp)
        if self.counts.tp != tp:
            raise ValueError(f"counts are for tp={self.counts.tp}, not tp={tp}")
        self.pp = self.counts.pp
        hd, h = shape.head_dim, shape.hidden
        self.gemms: dict[str, tuple[int, int]] = {  # name -> (n, k) per GPU
            "qkv_gemm": ((self.q_heads + 2 * self.kv_heads) * hd, h),
            "o_gemm": (h, self.q_heads * hd),
            "gate_up_gemm": (2 * -(-shape.ffn // tp), h),
            "down_gemm": (h, -(-shape.ffn // tp)),
        }
        split = self.ops.engine is not None and self.ops.engine.split_projections
        q_n, kv_n, f_n = self.q_heads * hd, self.kv_heads * hd, -(-shape.ffn // tp)
        #: name -> the (n, k) of each GEMM the engine runs for it (split projections: q, k, v
        #: and gate, up apart; else one merged GEMM)
        self.gemm_parts: dict[str, tuple[tuple[int, int], ...]] = {
            name: ((n, k),) for name, (n, k) in self.gemms.items()
        }
        if split:
            self.gemm_parts["qkv_gemm"] = ((q_n, h), (kv_n, h), (kv_n, h))
            self.gemm_parts["gate_up_gemm"] = ((f_n, h), (f_n, h))
        self._expert_and_latent_ops(ep, routing_skew, gpus_per_server)
        self.vocab_per_gpu = -(-shape.vocab // tp)
        self._head_dtype = (
            "fp32" if shape.dtype_bytes == 4 else "bf16"
        )  # fp8 models keep a 16-bit lm_head
        #: the engine's own terms (sim.serving.opcost.terms.EngineTerms); None: fused, none extra
        self.engine = self.ops.engine
        #: seconds of engine overhead per prompt token (EngineTerms; 0 without an engine)
        self._prompt_overhead = (
            self.engine.prompt_overhead_s_per_token if self.engine is not None else 0.0
        )
        #: the serving framework's overheads (FrameworkTerms); None: the profile states none
        self.framework = self.ops.framework
        fw = self.framework
        #: seconds per request admitted and per token sampled (0 without framework terms)
        self._admission = fw.admission_s if fw is not None else 0.0
        self._token_output = fw.token_output_s if fw is not None else 0.0
        self._gemm_cache: dict[int, dict[str, tuple[float, str]]] = {}
        # (tokens, logits rows) -> seconds of every op but attention
        self._fixed_cache: dict[tuple[int, int], float] = {}
        self._pre_cache: dict[int, float] = {}  # by token count: the ops before lm_head
        self._tail_cache: dict[int, tuple[float, float]] = {}  # by sampled rows: lm_head, overhead

    def _expert_and_latent_ops(
        self, ep: int, routing_skew: float, gpus_per_server: int | None
    ) -> None:
        """Set up the MLA attention ops and the expert-block ops of a model that has them."""
        shape = self.shape
        if shape.n_dense_layers == 0:  # every block has experts: no dense MLP to price
            del self.gemm_parts["gate_up_gemm"], self.gemm_parts["down_gemm"]
        if shape.mla:
            self.mla = MlaOps(self)
            self.gemm_parts["qkv_gemm"] = self.mla.qkv_parts
            self.gemm_parts["o_gemm"] = (self.mla.o_part,)
        #: the expert layout and expert-block ops (None: a dense model)
        self.layout = ExpertParallel(self.tp, ep if shape.n_moe_layers else 1)
        self.moe: MoeOps | None = None
        #: the op names of an iteration, in order: :data:`OP_NAMES`, with an expert model's
        #: :data:`sim.serving.opcost.moemla.MOE_OP_NAMES` after ``down_gemm``
        self.op_names: tuple[str, ...] = OP_NAMES
        if shape.n_moe_layers:
            cross = gpus_per_server is not None and self.layout.group > gpus_per_server
            self.moe = MoeOps(self, self.layout, routing_skew, cross_node=cross)
            at = OP_NAMES.index("down_gemm") + 1
            self.op_names = (*OP_NAMES[:at], *MOE_OP_NAMES, *OP_NAMES[at:])

    # -- iterations ------------------------------------------------------------------------------
    def _layer_gemms(self, m: int) -> dict[str, tuple[float, str]]:
        """``{gemm name: (seconds, source)}`` of one layer's GEMMs at ``m`` tokens (memoised)."""
        cached = self._gemm_cache.get(m)
        if cached is None:
            cached = {}
            for name, parts in self.gemm_parts.items():
                timed = [self.gemm_time(m, n, k) for n, k in parts]
                srcs = {src for _, src in timed}
                src = "table-extrapolated" if "table-extrapolated" in srcs else timed[0][1]
                cached[name] = (sum(secs for secs, _ in timed), src)
            if len(self._gemm_cache) < 65536:
                self._gemm_cache[m] = cached
        return cached

    def iteration_breakdown(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[OpCost]:
        """Every op of one fused iteration (see the module docstring) with its source."""
        if min(prefill_tokens, prefill_sq, n_prompts, n_decode) < 0 or decode_ctx < 0:
            raise ValueError("iteration arguments must be >= 0")
        s, tp, rl = self.shape, self.tp, self.ops.roofline
        t = prefill_tokens + n_decode
        if t == 0:
            return [OpCost(name, 0.0, "not run") for name in self.op_names]
        layers = s.n_layers
        h, hd = s.hidden, s.head_dim
        out: list[OpCost] = []

        def add(name: str, secs: float, src: str, count: int = 1) -> None:
            fused = name in rl.fused
            out.append(OpCost(name, 0.0 if fused else secs * count, "fused" if fused else src))

        row_bytes = t * h * self.act_bytes
        add("embedding", *self.table_elementwise(
            "embedding", t, h, self.roofline_time(0.0, 2 * row_bytes, 1.0)))  # fmt: skip
        add("embedding_allreduce", *self.allreduce_time(row_bytes, tp))
        norm, norm_src = self.table_elementwise(
            "norm", t, h, self.elementwise_time(t, 2 * h, 2 * h)
        )
        gemms = self._layer_gemms(t)
        in_module = self.mla is not None and self.mla.module_tables
        add("input_norm", norm, norm_src, layers)
        if in_module:
            add("qkv_gemm", 0.0, IN_MODULE)
        else:
            add("qkv_gemm", *gemms["qkv_gemm"], layers)
        if self.mla is not None:
            rope_dim = (self.q_heads + 1) * s.qk_rope_head_dim
        else:
            rope_dim = (self.q_heads + self.kv_heads) * hd
        add("rope", self.elementwise_time(t, rope_dim, rope_dim), "roofline", layers)
        secs, src = self.prefill_attention_time(prefill_tokens, prefill_sq, n_prompts)
        add("attention_prefill", secs, src, layers)
        add("attention_decode", *self.decode_attention_time(n_decode, decode_ctx), layers)
        if in_module:
            add("o_gemm", 0.0, IN_MODULE)
        else:
            add("o_gemm", *gemms["o_gemm"], layers)
        ar, ar_src = self.allreduce_time(row_bytes, tp)
        add("allreduce_attn", ar, ar_src, layers)
        add("post_attn_norm", norm, norm_src, layers)
        dense = s.n_dense_layers
        if dense:
            add("gate_up_gemm", *gemms["gate_up_gemm"], dense)
            ffn = self.gemms["down_gemm"][1]
            fallback = self.elementwise_time(t, 2 * ffn, ffn)
            add("activation", *self.table_elementwise("activation", t, ffn, fallback), dense)
            add("down_gemm", *gemms["down_gemm"], dense)
        else:
            for name in ("gate_up_gemm", "activation", "down_gemm"):
                add(name, 0.0, "not run")
        if self.moe is not None:
            for name, (secs, src) in self.moe.block(t).items():
                add(name, secs, src, s.n_moe_layers)
        # an expert block with attention data parallelism combines by all-to-all instead
        reduced = dense if self.layout.dp > 1 else layers
        add("allreduce_mlp", ar if reduced else 0.0, ar_src if reduced else "not run", reduced)
        add("final_norm", *self.table_elementwise("norm", t, h, self.elementwise_time(t, h, h)))
        add(
            "lm_head",
            *self.gemm_time(n_prompts + n_decode, self.vocab_per_gpu, h, self._head_dtype),
        )
        self._overhead_ops(add, prefill_tokens, n_prompts, n_decode)
        return out

    def _overhead_ops(
        self,
        add: Callable[..., None],
        prefill_tokens: int,
        n_prompts: int,
        n_decode: int,
    ) -> None:
        """The ops outside the kernels: the iteration's and each layer's overhead, the
        engine's per-prompt-token work, and the serving framework's per-request and
        per-token work (``ops.framework``)."""
        rl = self.ops.roofline
        if self.framework is not None:
            over_src = "framework"
        else:
            over_src = "overhead" if rl.iteration_overhead_s else "none in profile"
        add("iteration_overhead", rl.iteration_overhead_s, over_src)
        per_layer = self.engine.layer_overhead_s if self.engine is not None else 0.0
        add(
            "layer_overhead",
            per_layer,
            "overhead" if per_layer else "not run",
            self.shape.n_layers + 2,
        )
        per_tok = self._prompt_overhead
        run = per_tok > 0 and prefill_tokens > 0
        add("prompt_overhead", per_tok * prefill_tokens, "overhead" if run else "not run")
        stated = "framework" if self.framework is not None else "none in profile"
        add("admission", self._admission * n_prompts, stated if n_prompts else "not run")
        add("token_output", self._token_output * (n_prompts + n_decode), stated)

    def _split(self) -> bool:
        """Whether iterations run as a prefill part plus a decode part (EngineTerms)."""
        return self.engine is not None and not self.engine.fused_iterations

    def _parts(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[list[OpCost]]:
        """The op lists of an iteration: one fused list, or (engine with
        ``fused_iterations: false``) the prefill part's and the decode part's, the iteration
        overhead charged once (on the first part that runs)."""
        if not self._split() or prefill_tokens <= 0 or n_decode <= 0:
            return [
                self.iteration_breakdown(
                    prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
                )
            ]
        pre = self.iteration_breakdown(prefill_tokens, prefill_sq, n_prompts, 0, 0.0)
        dec = self.iteration_breakdown(0, 0, 0, n_decode, decode_ctx)
        dec = [OpCost(o.name, 0.0, o.source) if o.name == "iteration_overhead" else o for o in dec]
        return [pre, dec]

    def iteration_ops(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> dict[str, float]:
        """``{op_name: seconds}`` of one fused iteration (every name of :attr:`op_names`)."""
        ops = self.breakdown(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)
        return {name: secs for name, secs, _ in ops if name in self.op_names}

    def iteration_time(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> float:
        """Seconds of one fused iteration: ``prefill_tokens`` prompt tokens in ``n_prompts``
        chunks whose squared lengths sum to ``prefill_sq``, plus one token for each of
        ``n_decode`` sequences holding ``decode_ctx`` context tokens in all. Weights are read
        once; an empty iteration costs 0. Equals the sum of :meth:`iteration_ops`; the parts
        that depend only on the token count and the logits rows are memoised. An engine with
        ``fused_iterations: false`` pays a prefill part and a decode part (the iteration
        overhead once)."""
        if self._split() and prefill_tokens > 0 and n_decode > 0:
            pre_s = self.iteration_time(prefill_tokens, prefill_sq, n_prompts, 0, 0.0)
            dec_s = self.iteration_time(0, 0, 0, n_decode, decode_ctx)
            return pre_s + dec_s - self.ops.roofline.iteration_overhead_s
        t = prefill_tokens + n_decode
        if t <= 0 or min(prefill_tokens, prefill_sq, n_prompts, n_decode) < 0 or decode_ctx < 0:
            ops = self.iteration_breakdown(
                prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
            )  # raises on negative arguments; 0 for an empty iteration
            return float(sum(op.seconds for op in ops))
        sampled = n_prompts + n_decode
        fixed = self._fixed_cache.get((t, sampled))
        if fixed is None:
            # the ops before lm_head depend on t only, lm_head and the overhead on `sampled`
            # only: memoised apart, added in the breakdown's order (bit-identical to its sum)
            pre = self._pre_cache.get(t)
            tail = self._tail_cache.get(sampled)
            if pre is None or tail is None:
                pre, lm, over = 0.0, 0.0, 0.0
                for op in self.iteration_breakdown(t, t, sampled, 0, 0.0):
                    if op.name == "lm_head":
                        lm = op.seconds
                    elif op.name == "iteration_overhead":
                        over = op.seconds
                    elif op.name not in _NOT_MEMOISED:
                        pre += op.seconds
                tail = (lm, over)
                if len(self._pre_cache) < 65536:
                    self._pre_cache[t] = pre
                    self._tail_cache[sampled] = tail
            fixed = pre + tail[0] + tail[1]
            if len(self._fixed_cache) < 65536:
                self._fixed_cache[(t, sampled)] = fixed
        layers = self.shape.n_layers
        attn = self.prefill_attention_time(prefill_tokens, prefill_sq, n_prompts)[0]
        attn += self.decode_attention_time(n_decode, decode_ctx)[0]
        framework = self._admission * n_prompts + self._token_output * sampled
        return fixed + layers * attn + self._prompt_overhead * prefill_tokens + framework

    # -- the IterationCost protocol ----------------------------------------------------------
    def work(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> tuple[float, float, float, float]:
        """``(compute_s, collective_s, flops, bytes)`` (:class:`sim.serving.itercost.IterationCost`):
        :meth:`iteration_time` (all-reduces included), the ``pp - 1`` hand-offs, and the
        roofline's FLOP and byte counts."""
        _, _, flops, nbytes = self.counts.work(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )
        tokens = prefill_tokens + n_decode
        if tokens <= 0:
            return 0.0, 0.0, flops, nbytes
        compute = self.iteration_time(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)
        return compute, self.counts.handoff_time(float(tokens)), flops, nbytes

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[tuple[str, float, str]]:
        """``(op, seconds, source)`` of every op (:attr:`op_names`, summed over an unfused
        engine's parts) and ``pp_handoff``; sums to :meth:`work`'s time up to rounding."""
        secs: dict[str, float] = {}
        srcs: dict[str, str] = {}
        for part in self._parts(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx):
            for op in part:
                secs[op.name] = secs.get(op.name, 0.0) + op.seconds
                if srcs.get(op.name, "not run") == "not run":
                    srcs[op.name] = op.source
        tokens = prefill_tokens + n_decode
        hand = self.counts.handoff_time(float(tokens)) if tokens > 0 else 0.0
        out = [(name, secs[name], srcs[name]) for name in secs]
        out.append(("pp_handoff", hand, "roofline" if hand > 0 else "not run"))
        return out
