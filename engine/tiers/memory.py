"""Shared code of the two in-memory tiers (host and device): a dict of byte arrays.

Each stored object is its own array allocated by the tier (an *arena* of separate buffers),
so a tier never aliases the caller's memory: ``put`` copies in, ``get`` hands out the tier's
buffer (callers must not write to it). ``nbytes`` tracks the bytes held.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from engine.tiers.base import Tier, TierMiss, check_name


class MemoryTier(Tier):
    """A tier whose objects are arrays in some memory; subclasses allocate and copy."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._objects: dict[str, Any] = {}
        self.nbytes = 0  # invariant: == sum of sizes of the stored arrays

    @abstractmethod
    def _copy_in(self, data: Any) -> Any:
        """A new 1-D uint8 array of this tier's memory holding a copy of ``data``."""

    def put(self, name: str, data: Any) -> None:
        check_name(name)
        arr = self._copy_in(data)
        old = self._objects.get(name)
        if old is not None:
            self.nbytes -= int(old.size)
        self._objects[name] = arr
        self.nbytes += int(arr.size)

    def get(self, name: str) -> Any:
        try:
            return self._objects[name]
        except KeyError:
            raise TierMiss(f"{self.name}: no object {name!r}") from None

    def delete(self, name: str) -> bool:
        arr = self._objects.pop(name, None)
        if arr is None:
            return False
        self.nbytes -= int(arr.size)
        return True

    def exists(self, name: str) -> bool:
        return name in self._objects

    def names(self) -> list[str]:
        return sorted(self._objects)
