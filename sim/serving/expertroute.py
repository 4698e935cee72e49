"""Which routed experts an iteration activates: a seeded Zipf router, a routing trace, and the
popularity counts prefetch ranks experts by.

A router answers ``route(step, tokens)`` with, per expert layer (in layer order), the sorted
ids of the distinct experts the iteration's ``tokens`` tokens route to. Invariants: every id
is in ``0 .. n_experts - 1``, no id repeats, and the Zipf router activates at most
``min(n_experts, tokens * top_k)`` experts per layer (each token picks ``top_k`` distinct ones).

Routing trace (``experts.trace``): a CSV with the header ``step,layer,expert,tokens``, one row
per (step, expert layer, expert) an iteration routed tokens to. ``step`` counts a replica's
iterations of the model from 0 and the trace repeats cyclically (step ``s`` reads trace step
``s mod (last step + 1)``; a step without rows activates no expert); ``layer`` is the block
number of an expert layer (its index among the model's attention blocks); ``tokens`` (>= 1)
is read and checked but does not change timing (the cost protocol prices the batch).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from engine.errors import InputError

#: tokens drawn per block by the Zipf router (bounds its memory: layers x block x experts)
DRAW_BLOCK = 256
TRACE_COLUMNS = ("step", "layer", "expert", "tokens")


class Router(Protocol):
    """Routing of an iteration (see the module docstring)."""

    def route(self, step: int, tokens: int) -> list[np.ndarray]:
        """Per expert layer, the sorted distinct experts step ``step``'s ``tokens`` tokens
        route to."""
        ...


class ZipfRouter:
    """Each token picks ``top_k`` distinct experts of each expert layer, expert ``e`` with
    weight ``rank(e) ** -exponent``; every layer ranks its experts in its own order (a
    permutation drawn from ``rng`` at construction). Sampling without replacement by the
    Gumbel top-k rule; draws come only from ``rng``."""

    def __init__(
        self, n_layers: int, n_experts: int, top_k: int, exponent: float, rng: np.random.Generator
    ) -> None:
        if n_layers < 1 or n_experts < 1 or not 1 <= top_k <= n_experts:
            raise ValueError(
                f"need n_layers >= 1, n_experts >= 1 and top_k in 1..n_experts, got "
                f"{n_layers}, {n_experts}, {top_k}"
            )
        self.n_layers = n_layers
        self.n_experts = n_experts
        self.top_k = top_k
        self.rng = rng
        ranks = np.arange(1, n_experts + 1, dtype=np.float64)
        logw = -exponent * np.log(ranks)
        #: log weight of each expert id, per layer (L, E)
        self.logw = np.empty((n_layers, n_experts))
        for li in range(n_layers):
            self.logw[li, rng.permutation(n_experts)] = logw

    def probabilities(self) -> np.ndarray:
        """Each expert's share of one pick, per layer (rows sum to 1)."""
        w = np.exp(self.logw)
        out: np.ndarray = w / w.sum(axis=1, keepdims=True)
        return out

    def route(self, step: int, tokens: int) -> list[np.ndarray]:
        """See :class:`Router`; ``step`` is not used (draws are independent per call)."""
        del step
        n_l, n_e, k = self.n_layers, self.n_experts, self.top_k
        seen = np.zeros((n_l, n_e), dtype=bool)
        left = max(tokens, 0)
        while left > 0 and not seen.all():
            b = min(left, DRAW_BLOCK)
            keys = self.rng.gumbel(size=(n_l, b, n_e)) + self.logw[:, None, :]
            picks = np.argpartition(-keys, k - 1, axis=2)[:, :, :k] if k < n_e else None
            if picks is None:
                seen[:] = True
            else:
                rows = np.repeat(np.arange(n_l), b * k)
                seen[rows, picks.reshape(-1)] = True
            left -= b
        return [np.flatnonzero(seen[li]) for li in range(n_l)]


class TraceRouter:
    """Routing read from a trace (:func:`read_routing_trace`); cycles over its steps."""

    def __init__(self, steps: dict[int, list[np.ndarray]], n_steps: int, n_layers: int) -> None:
        self.steps = steps
        self.n_steps = n_steps
        self.empty = [np.zeros(0, dtype=np.int64) for _ in range(n_layers)]

    def route(self, step: int, tokens: int) -> list[np.ndarray]:
        """See :class:`Router`; ``tokens`` is not used (the trace decides)."""
        del tokens
        return self.steps.get(step % self.n_steps, self.empty)


def read_routing_trace(
    path: str | Path, blocks: Sequence[int], n_experts: Sequence[int]
) -> TraceRouter:
    """Read a routing trace (module docstring) for a model whose expert layers are the blocks
    ``blocks`` with ``n_experts`` experts each. Raises :class:`InputError` naming the file
    and line of the first bad record (missing file, wrong header, a non-integer, a layer that
    is not an expert layer, an expert out of range, a repeated (step, layer, expert), tokens
    < 1, no rows)."""
    src = str(path)
    p = Path(path)
    if not p.is_file():
        raise InputError("routing trace not found", source=src)
    layer_of = {b: i for i, b in enumerate(blocks)}
    rows: dict[int, list[list[int]]] = {}
    seen: set[tuple[int, int, int]] = set()
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or tuple(h.strip().lower() for h in header) != TRACE_COLUMNS:
                raise InputError(
                    f"header must be {','.join(TRACE_COLUMNS)}", source=src, where="line 1"
                )
            for row in reader:
                where = f"line {reader.line_num}"
                if not row or all(not f.strip() for f in row):
                    continue
                if len(row) != len(TRACE_COLUMNS):
                    raise InputError(
                        f"{len(row)} fields, expected 4 ({','.join(TRACE_COLUMNS)})",
                        source=src,
                        where=where,
                    )
                vals = []
                for name, text in zip(TRACE_COLUMNS, row, strict=True):
                    t = text.strip()
                    if not t.isdigit():
                        raise InputError(
                            f"{name} {text!r} is not a whole number >= 0", source=src, where=where
                        )
                    vals.append(int(t))
                step, block, expert, tokens = vals
                li = layer_of.get(block)
                if li is None:
                    allowed = f"{blocks[0]}..{blocks[-1]}" if blocks else "none"
                    raise InputError(
                        f"layer {block} is not an expert layer of the model (expert layers: "
                        f"{allowed})",
                        source=src,
                        where=where,
                    )
                if expert >= n_experts[li]:
                    raise InputError(
                        f"expert {expert} out of range 0..{n_experts[li] - 1}",
                        source=src,
                        where=where,
                    )
                if tokens < 1:
                    raise InputError("tokens must be >= 1", source=src, where=where)
                if (step, li, expert) in seen:
                    raise InputError(
                        f"step {step}, layer {block}, expert {expert} repeats an earlier row",
                        source=src,
                        where=where,
                    )
                seen.add((step, li, expert))
                rows.setdefault(step, [[] for _ in blocks])[li].append(expert)
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", source=src) from None
    except csv.Error as err:
        raise InputError(f"not a CSV record ({err})", source=src) from None
    if not rows:
        raise InputError("no rows after the header", source=src)
    steps = {s: [np.asarray(sorted(e), dtype=np.int64) for e in per] for s, per in rows.items()}
    return TraceRouter(steps, max(rows) + 1, len(blocks))


class Popularity:
    """How often each expert of each expert layer was active in one replica's iterations (the
    estimate expert prefetch ranks by)."""

    def __init__(self, n_layers: int, n_experts: int) -> None:
        self.counts = np.zeros((n_layers, n_experts), dtype=np.int64)
        self.iterations = np.zeros(n_layers, dtype=np.int64)

    def record(self, layer: int, experts: np.ndarray) -> None:
        """Expert layer ``layer`` ran one more iteration, with ``experts`` active."""
        self.counts[layer, experts] += 1
        self.iterations[layer] += 1

    def likely(self, layer: int, share: float) -> list[int]:
        """The experts of ``layer`` active in at least ``share`` (> 0) of its iterations so
        far, most often active first (ties: lower id first); none before any iteration."""
        n = int(self.iterations[layer])
        if n == 0:
            return []
        row = self.counts[layer]
        order = np.lexsort((np.arange(row.shape[0]), -row))
        need = share * n
        return [int(e) for e in order if row[e] >= need and row[e] > 0]
