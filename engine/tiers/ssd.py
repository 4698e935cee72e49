"""NVMe/SSD cache tier: one file per object in a cache directory, plain file I/O.

``put`` writes to a temporary file in the same directory and renames it over the final name
(``os.replace``), so a reader never sees a half-written object and a crash leaves either the
old or the new bytes. ``get`` reads the whole file with ``readinto`` into a fresh NumPy buffer.
The directory is created on the first ``put`` (no I/O in the constructor).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from engine.tiers.base import Tier, TierKind, TierMiss, as_host_bytes, check_name

__all__ = ["SsdTier"]

_TMP_SUFFIX = ".tmp-write"


class SsdTier(Tier):
    """Objects as files under ``root`` (a local directory on the NVMe drive)."""

    kind: ClassVar[TierKind] = "ssd"

    def __init__(self, root: str | Path, name: str = "ssd") -> None:
        super().__init__(name)
        self.root = Path(root)

    def path(self, name: str) -> Path:
        """The file that holds ``name``."""
        return self.root / check_name(name)

    def put(self, name: str, data: Any) -> None:
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        with open(tmp, "wb") as f:
            f.write(as_host_bytes(data).data)
        os.replace(tmp, path)

    def get(self, name: str) -> np.ndarray:
        path = self.path(name)
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                out = np.empty(size, dtype=np.uint8)
                view = out.data
                got = 0
                while got < size:  # readinto may return short counts
                    n = f.readinto(view[got:])
                    if not n:
                        break
                    got += n
        except FileNotFoundError:
            raise TierMiss(f"{self.name}: no object {name!r} ({path})") from None
        return out[:got]

    def delete(self, name: str) -> bool:
        try:
            self.path(name).unlink()
        except FileNotFoundError:
            return False
        return True

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_file() and not p.name.endswith(_TMP_SUFFIX)
        )
