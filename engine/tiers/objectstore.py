"""Object-store tier over fsspec: a local directory by default, any fsspec URL when configured.

``ObjectStoreTier("/data/objects")`` or ``ObjectStoreTier("file:///data/objects")`` stores
objects as files; ``ObjectStoreTier("s3://bucket/prefix")`` (with ``s3fs`` installed) or
``"memory://x"`` store them wherever fsspec does. Objects are written whole
(``pipe_file``) and read whole (``cat_file``); names map to ``<url>/<name>``.
The filesystem is resolved lazily on first use (no I/O in the constructor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from engine.errors import InputError
from engine.tiers.base import Tier, TierKind, TierMiss, as_host_bytes, check_name

__all__ = ["ObjectStoreTier"]


class ObjectStoreTier(Tier):
    """Objects at fsspec location ``url`` (a plain path means the local filesystem)."""

    kind: ClassVar[TierKind] = "object"

    def __init__(self, url: str | Path, name: str = "object_store") -> None:
        super().__init__(name)
        self.url = str(url)
        self._fs: Any = None
        self._root = ""

    def _resolve(self) -> tuple[Any, str]:
        if self._fs is None:
            import fsspec  # imported lazily: fsspec is only needed once an object is touched

            try:
                fs, root = fsspec.core.url_to_fs(self.url)
            except (ImportError, ValueError) as err:
                raise InputError(
                    f"cannot open object store {self.url!r}: {err}; allowed: a local path or "
                    "an fsspec URL whose filesystem is installed (file://, memory://, s3://...)",
                    where="object_store.url",
                ) from None
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs, self._root

    def location(self, name: str) -> str:
        """The fsspec path of ``name`` (without protocol)."""
        _, root = self._resolve()
        return f"{root}/{check_name(name)}"

    def put(self, name: str, data: Any) -> None:
        fs, _ = self._resolve()
        path = self.location(name)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, as_host_bytes(data).tobytes())

    def get(self, name: str) -> np.ndarray:
        fs, _ = self._resolve()
        path = self.location(name)
        try:
            raw = fs.cat_file(path)
        except FileNotFoundError:
            raise TierMiss(f"{self.name}: no object {name!r} ({self.url}/{name})") from None
        return np.frombuffer(raw, dtype=np.uint8)  # read-only view of the bytes read

    def delete(self, name: str) -> bool:
        fs, _ = self._resolve()
        path = self.location(name)
        if not fs.exists(path):
            return False
        fs.rm_file(path)
        return True

    def exists(self, name: str) -> bool:
        fs, _ = self._resolve()
        return bool(fs.isfile(self.location(name)))

    def names(self) -> list[str]:
        fs, root = self._resolve()
        if not fs.exists(root):
            return []
        found = fs.find(root)
        prefix = root + "/"
        return sorted(p[len(prefix) :] if p.startswith(prefix) else p for p in found)
