"""Attention and elementwise op tables timed in place, inside the engine's own layer loop.

An op timed alone, called again and again on the same inputs, does not cost what it costs
inside an iteration: there, the ops before it have just moved other weights, activations
and KV through the caches, and NumPy's temporaries come and go between differently sized
calls. On the 2-core VM, attention and the elementwise ops cost 1.3-2.5x more inside an
iteration than alone (``docs/history/2026-12-01-calibration.md``), and alone their times
depended on what the probe had allocated before. This probe therefore times them where the
engine runs them: it serves iterations of a probe decoder with
:class:`engine.runtime.model.DecoderModel` (the engine's model, its KV allocator and paged
store) and times every op through the model's op hook (:attr:`DecoderModel.op`) on
:func:`hwbench.opprobe.op_clock`, with a device synchronisation around each op on a GPU.

For each head layout ``(heads, kv_heads)`` of the :class:`hwbench.opprobe.OpGrid`, a probe
decoder of :data:`PROBE_BLOCKS` blocks (hidden ``heads * head_dim``, MLP width
:data:`FFN_RATIO` times that, as in the LLaMA shapes, vocabulary :data:`PROBE_VOCAB`,
random weights) serves:

* **decode** knots ``(batch, context)``: ``batch`` sequences whose ``context`` tokens of K/V
  are written into the paged store first (random values, through the allocator's block
  tables, as a prefill leaves them), then ``warmup + repeats`` decode iterations, each one
  token per sequence; the table's point is the median over the timed iterations of the
  ``attention_decode`` op's seconds per block (the new token's K/V scatter and the paged
  attention);
* **prefill** knots ``(batch, tokens)``: iterations of ``batch`` new prompts of ``tokens``
  tokens each; the point is the ``attention_prefill`` op (KV write and causal attention)
  per block.

The same iterations give the **elementwise tables**, by the activation elements one call
reads: ``norm`` (a residual add and an RMSNorm: the blocks' norm and residual-add seconds
over twice the blocks, at rows x hidden), ``activation`` (SiLU of the gate times up, per
block, at rows x MLP width) and ``embedding`` (the row gather, at rows x hidden); each
element count's median over every iteration that had it.

Nothing is fitted. GEMM tables stay on :func:`hwbench.opprobe.gemm_table` (a full m x n x k
grid, which a decoder's few weight shapes cannot cover).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from engine.runtime.model import DecoderConfig, DecoderModel, IterationState
from hwbench.probes import syncer
from sim.serving.opcost import AttentionTable, Curves, ElementwiseTable, TableOrigin

__all__ = [
    "FFN_RATIO",
    "PROBE_BLOCKS",
    "PROBE_VOCAB",
    "InSituGrid",
    "InSituTables",
    "OpTimer",
    "insitu_tables",
    "probe_config",
]

#: blocks of a probe decoder (the calibration and validation decoders have 4)
PROBE_BLOCKS = 4
#: MLP width over hidden size of a probe decoder (LLaMA-2-7B: 11008 / 4096)
FFN_RATIO = 11008 / 4096
#: vocabulary of a probe decoder
PROBE_VOCAB = 2048
#: the KV block the probe decoders use (the engine's default)
BLOCK_TOKENS = 16


class InSituGrid(Protocol):
    """The knots :func:`insitu_tables` reads (:class:`hwbench.opprobe.OpGrid` has them)."""

    @property
    def layouts(self) -> tuple[tuple[int, int], ...]: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def decode_batch(self) -> tuple[int, ...]: ...
    @property
    def decode_context(self) -> tuple[int, ...]: ...
    @property
    def prefill_batch(self) -> tuple[int, ...]: ...
    @property
    def prefill_tokens(self) -> tuple[int, ...]: ...
    @property
    def warmup(self) -> int: ...
    @property
    def repeats(self) -> int: ...


@dataclass
class OpTimer:
    """An :data:`engine.runtime.model.OpCall` that times every op on ``clock`` (with
    ``sync`` before and after on a GPU), adds its seconds to :attr:`seconds` by name and
    counts it in :attr:`calls`; ops nested in a timed op are not timed again (its time
    includes them)."""

    clock: Callable[[], float]
    sync: Callable[[], None] = lambda: None
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: int = 0
    _depth: int = 0

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self._depth:
            return fn(*args)
        self._depth += 1
        try:
            self.sync()
            t0 = self.clock()
            out = fn(*args)
            self.sync()
            self.seconds[name] += self.clock() - t0
            self.calls += 1
        finally:
            self._depth -= 1
        return out

    def take(self) -> dict[str, float]:
        """The seconds recorded since the last call, by op name; starts afresh."""
        out = dict(self.seconds)
        self.seconds = defaultdict(float)
        return out


@dataclass
class InSituTables:
    """What :func:`insitu_tables` measured."""

    attention: list[AttentionTable]
    elementwise: list[ElementwiseTable]


def probe_config(heads: int, kv_heads: int, head_dim: int) -> DecoderConfig:
    """The probe decoder of one head layout (module docstring)."""
    hidden = heads * head_dim
    return DecoderConfig(
        name=f"insitu-{heads}x{kv_heads}x{head_dim}",
        n_blocks=PROBE_BLOCKS,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=round(hidden * FFN_RATIO),
        vocab=PROBE_VOCAB,
        block_tokens=BLOCK_TOKENS,
    )


def _weights(cfg: DecoderConfig, xp: ModuleType, rng: np.random.Generator) -> list[dict[str, Any]]:
    return [
        {
            name: xp.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.02)
            for name, shape in cfg.layout(i)
        }
        for i in range(cfg.n_layers)
    ]


class _Probe:
    """One probe decoder, its weights and the op times it collected."""

    def __init__(
        self,
        xp: ModuleType,
        cfg: DecoderConfig,
        kv_tokens: int,
        timer: OpTimer,
        seed: int,
        ew: dict[str, dict[int, list[float]]],
    ) -> None:
        self.xp, self.cfg, self.timer = xp, cfg, timer
        self.rng = np.random.default_rng(seed)
        self.w = _weights(cfg, xp, self.rng)
        self.model = DecoderModel(cfg, kv_tokens, xp)
        self.model.op = timer
        self.next_sid = 0
        self.ew = ew  # per elementwise op: elements per call -> seconds per call (added to)

    def _iteration(self, st: IterationState, rows: int) -> dict[str, float]:
        for layer in range(self.cfg.n_layers):
            self.model.run_layer(st, layer, self.w[layer])
        secs = self.timer.take()
        n, cfg = self.cfg.n_blocks, self.cfg
        norm = secs.get("input_norm", 0.0) + secs.get("post_attn_norm", 0.0)
        self.ew["norm"][rows * cfg.hidden].append((norm + secs.get("residual_add", 0.0)) / (2 * n))
        self.ew["activation"][rows * cfg.ffn].append(secs.get("activation", 0.0) / n)
        self.ew["embedding"][rows * cfg.hidden].append(secs.get("embedding", 0.0))
        return secs

    def _fill(self, sids: list[int], ctx: int) -> None:
        """Give each sequence ``ctx`` tokens of random K/V in every block's store."""
        kv, store, cfg = self.model.kv, self.model.store, self.cfg
        shape = (ctx, cfg.kv_heads, cfg.head_dim)
        for sid in sids:
            kv.allocate(sid, ctx)
            table = kv.block_table(sid)
            for blk in range(cfg.n_blocks):
                k = self.xp.asarray(self.rng.standard_normal(shape, dtype=np.float32))
                v = self.xp.asarray(self.rng.standard_normal(shape, dtype=np.float32))
                store.write_tokens(blk, table, 0, k, v)

    def decode_point(self, batch: int, ctx: int, warmup: int, repeats: int) -> float:
        """Median seconds per block of ``attention_decode`` at this knot."""
        sids = list(range(self.next_sid, self.next_sid + batch))
        self.next_sid += batch
        self._fill(sids, ctx)
        got = []
        for i in range(warmup + repeats):
            st = self.model.begin([], [(s, 1) for s in sids])
            secs = self._iteration(st, batch)
            if i >= warmup:
                got.append(secs["attention_decode"] / self.cfg.n_blocks)
        for s in sids:
            self.model.release(s)
        return float(np.median(got))

    def prefill_point(self, batch: int, tokens: int, warmup: int, repeats: int) -> float:
        """Median seconds per block of ``attention_prefill`` at this knot."""
        got = []
        for i in range(warmup + repeats):
            sids = list(range(self.next_sid, self.next_sid + batch))
            self.next_sid += batch
            prompts = [(s, self.rng.integers(0, self.cfg.vocab, tokens)) for s in sids]
            secs = self._iteration(self.model.begin(prompts, []), batch * tokens)
            if i >= warmup:
                got.append(secs["attention_prefill"] / self.cfg.n_blocks)
            for s in sids:
                self.model.release(s)
        return float(np.median(got))


def _curves(
    batches: tuple[int, ...],
    xs: tuple[int, ...],
    point: Callable[[int, int, int, int], float],
    grid: InSituGrid,
) -> Curves:
    secs = [[max(point(b, x, grid.warmup, grid.repeats), 1e-9) for x in xs] for b in batches]
    return Curves(batch=list(batches), x=[list(xs)] * len(batches), latency_s=secs)


def insitu_tables(
    xp: ModuleType,
    grid: InSituGrid,
    org: TableOrigin,
    clock: Callable[[], float] = time.thread_time,
) -> InSituTables:
    """Decode and prefill attention tables for every head layout of ``grid`` (an
    :class:`hwbench.opprobe.OpGrid`), and the elementwise tables, timed inside the engine's
    layer loop on ``clock`` (module docstring)."""
    timer = OpTimer(clock, syncer(xp))
    ew: dict[str, dict[int, list[float]]] = {
        k: defaultdict(list) for k in ("norm", "activation", "embedding")
    }
    attention: list[AttentionTable] = []
    steps = grid.warmup + grid.repeats
    for i, (heads, kv_heads) in enumerate(grid.layouts):
        cfg = probe_config(heads, kv_heads, grid.head_dim)
        need = max(
            max(grid.decode_batch) * (max(grid.decode_context) + steps + BLOCK_TOKENS),
            max(grid.prefill_batch) * (max(grid.prefill_tokens) + BLOCK_TOKENS),
        )
        probe = _Probe(xp, cfg, need, timer, 31 + i, ew)
        dec = _curves(grid.decode_batch, grid.decode_context, probe.decode_point, grid)
        pre = _curves(grid.prefill_batch, grid.prefill_tokens, probe.prefill_point, grid)
        for phase, curves, kernel in (
            ("decode", dec, "engine DecoderModel: K/V scatter + paged_decode_attention"),
            ("prefill", pre, "engine DecoderModel: KV write + causal attention"),
        ):
            attention.append(
                AttentionTable(
                    origin=org,
                    phase=phase,  # type: ignore[arg-type]
                    heads=heads,
                    kv_heads=kv_heads,
                    head_dim=grid.head_dim,
                    kv_dtype="fp32",
                    kernel=f"{kernel}, in place",
                    curves=curves,
                )
            )
    kernels = {
        "norm": "engine DecoderModel: residual add + _rmsnorm, in place",
        "activation": "engine DecoderModel: _silu(g) * u, in place",
        "embedding": "engine DecoderModel: embedding row gather, in place",
    }
    elementwise = [
        ElementwiseTable(
            origin=org,
            op=op,  # type: ignore[arg-type]
            kernel=kernels[op],
            elements=sorted(by_elems),
            latency_s=[max(float(np.median(by_elems[e])), 1e-9) for e in sorted(by_elems)],
        )
        for op, by_elems in ew.items()
    ]
    return InSituTables(attention, elementwise)
