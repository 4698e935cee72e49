"""Device-memory tier: CuPy arrays in GPU memory, or a separate NumPy arena on a CPU.

On the CuPy backend ``put`` copies host bytes to the GPU (host -> device over PCIe) or device
bytes within the GPU, and ``get`` returns the CuPy array. On NumPy the tier stands in for HBM:
every object is copied into a buffer of its own, separate from the host tier's, so moving an
object between the two costs a real memory copy just as on a GPU machine.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from engine import backend
from engine.tiers.base import TierKind, as_host_bytes
from engine.tiers.memory import MemoryTier

__all__ = ["DeviceTier"]


class DeviceTier(MemoryTier):
    """Objects in device memory of backend ``xp`` (NumPy: a host arena standing in for HBM)."""

    kind: ClassVar[TierKind] = "device"

    def __init__(self, name: str = "device", xp: ModuleType = np) -> None:
        super().__init__(name)
        self.xp = xp
        self.on_gpu = backend.is_gpu(xp)

    def _copy_in(self, data: Any) -> Any:
        xp = self.xp
        if self.on_gpu and not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
            src = data.reshape(-1).view(xp.uint8)  # already on the device: device -> device
            out = xp.empty(src.size, dtype=xp.uint8)
            out[...] = src
            return out
        host = as_host_bytes(data)
        out = xp.empty(host.size, dtype=xp.uint8)
        if self.on_gpu:
            out.set(host)  # host -> device
        else:
            np.copyto(out, host)
        return out

    def get_host(self, name: str) -> np.ndarray:
        """A host copy of ``name`` (device -> host on a GPU)."""
        return backend.to_numpy(self.get(name)).reshape(-1).view(np.uint8)
