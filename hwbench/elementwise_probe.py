"""Elementwise op tables: the engine's own norm, activation and embedding code, timed.

The op model prices an op no table covers from a roofline (bytes over memory bandwidth plus
a per-op floor). That fits a fused GPU kernel, not the NumPy engine: its RMSNorm is six
array operations with temporaries (a mean reduction among them), its SiLU-and-mul five, and
on the 2-core VM a 1 x 256 norm takes ~20 us where the roofline says ~3 us, a 512 x 688
activation ~1.5 ms where it says ~10 us. :func:`elementwise_tables` therefore times what
:class:`engine.runtime.model.DecoderModel` runs for each op, over the elements one call
reads (tokens x width), as :class:`sim.serving.opcost.ElementwiseTable`:

* ``norm`` -- the residual add ``x + y`` then the engine's RMSNorm (the op model's
  "fused residual-add + RMSNorm", which the engine runs unfused), width ``width``;
* ``activation`` -- the engine's ``silu(g) * u``;
* ``embedding`` -- a row gather ``E[ids]`` from a 4096-row table.

Timed with :func:`hwbench.opprobe.op_clock` like every other op table (the calling thread's
CPU time on NumPy). Nothing is fitted.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from engine.runtime.model import _rmsnorm, _silu  # the engine's own kernels, timed as run
from sim.serving.opcost import ElementwiseTable, TableOrigin

__all__ = ["EW_ROWS", "EW_WIDTH", "elementwise_tables"]

#: row width of every timed call (the calibration decoder's hidden size)
EW_WIDTH = 256
#: rows per timed call: 1 (a batch-1 decode) up to 4096 (a 1M-element prefill activation)
EW_ROWS: tuple[int, ...] = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)

Timer = Callable[[Callable[[], object]], float]


def elementwise_tables(
    xp: ModuleType,
    median: Timer,
    org: TableOrigin,
    rows: tuple[int, ...] = EW_ROWS,
    width: int = EW_WIDTH,
) -> list[ElementwiseTable]:
    """One table per op (module docstring) at ``rows`` x ``width`` elements, each point the
    ``median`` (a timer: seconds of one call of its argument) of the engine's code."""
    rng = np.random.default_rng(13)
    big = max(rows)
    x_all = xp.asarray(rng.standard_normal((big, width), dtype=np.float32))
    y_all = xp.asarray(rng.standard_normal((big, width), dtype=np.float32))
    wn = xp.ones(width, dtype=xp.float32)
    emb = xp.asarray(rng.standard_normal((4096, width), dtype=np.float32))
    ids_all = rng.integers(0, 4096, big)
    secs: dict[str, list[float]] = {"norm": [], "activation": [], "embedding": []}
    for r in rows:
        x, y = xp.ascontiguousarray(x_all[:r]), xp.ascontiguousarray(y_all[:r])
        ids = ids_all[:r]

        def norm(x: Any = x, y: Any = y) -> object:
            return _rmsnorm(x + y, wn, xp)

        def act(x: Any = x, y: Any = y) -> object:
            return _silu(x, xp) * y

        def gather(ids: Any = ids) -> object:
            return emb[xp.asarray(ids)]

        secs["norm"].append(median(norm))
        secs["activation"].append(median(act))
        secs["embedding"].append(median(gather))
    kernels = {
        "norm": "x + y, then engine.runtime.model._rmsnorm",
        "activation": "engine.runtime.model._silu(g) * u",
        "embedding": "row gather E[ids] (E: 4096 rows)",
    }
    elements = [r * width for r in rows]
    return [
        ElementwiseTable(
            origin=org,
            op=op,  # type: ignore[arg-type]
            kernel=f"{kernels[op]}, width {width}",
            elements=elements,
            latency_s=[max(v, 1e-9) for v in vals],
        )
        for op, vals in secs.items()
    ]
