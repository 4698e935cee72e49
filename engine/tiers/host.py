"""Host-memory tier: NumPy byte arrays, page-locked (pinned) through CuPy on a GPU backend.

Pinned buffers make host -> device copies run at full PCIe speed and allow asynchronous
copies. With the NumPy backend the buffers are ordinary NumPy arrays. Either way
:meth:`HostTier.get` returns a NumPy ``uint8`` array.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from engine import backend
from engine.tiers.base import TierKind, as_host_bytes
from engine.tiers.memory import MemoryTier

__all__ = ["HostTier"]


class HostTier(MemoryTier):
    """Objects in host DRAM. ``xp``: the backend in use (pinned allocations when CuPy)."""

    kind: ClassVar[TierKind] = "host"

    def __init__(self, name: str = "host", xp: ModuleType = np) -> None:
        super().__init__(name)
        self.xp = xp
        self.pinned = backend.is_gpu(xp)

    def _copy_in(self, data: Any) -> np.ndarray:
        src = as_host_bytes(data)
        if self.pinned:
            mem = self.xp.cuda.alloc_pinned_memory(max(1, src.size))
            out = np.frombuffer(mem, dtype=np.uint8, count=src.size)  # keeps `mem` alive
        else:
            out = np.empty(src.size, dtype=np.uint8)
        np.copyto(out, src)
        return out
