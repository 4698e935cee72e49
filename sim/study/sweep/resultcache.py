"""Per-run result cache of a sweep: one small JSON file per finished run, by config hash.

Layout under the sweep folder::

    runs/<config-hash>.json     a finished run: {"config_hash", "seed", "params", "status": "ok",
                                 "metrics": {flat summary}, "wall_s"}
    failed/<config-hash>.json   the last failure of a run (status "failed", "error")

Invariant: a file under ``runs/`` is complete -- it is written to a temporary file in the same
folder and renamed into place (``os.replace`` is atomic), so an interrupted sweep leaves either
the whole record or none. A record whose file cannot be parsed is treated as missing and run
again. Failures are kept for the report but never count as done, so a resumed sweep retries
them. The cache does no I/O until it is first read or written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process's umask (read from ``/proc`` where it says, else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_umask(path: str | Path, folder: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would (0666/0777 less the umask):
    ``tempfile`` creates files 0600 and folders 0700, which a rename would keep."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary sibling and a rename (never half-written);
    the file gets the user's umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
    try:
        as_umask(tmp)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunCache:
    """Finished runs of one sweep folder, keyed by config hash."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _ok(self, h: str) -> Path:
        return self.folder / "runs" / f"{h}.json"

    def _failed(self, h: str) -> Path:
        return self.folder / "failed" / f"{h}.json"

    def get(self, h: str) -> dict[str, Any] | None:
        """The finished record of run ``h``, or ``None`` (missing or unreadable)."""
        try:
            rec: dict[str, Any] = json.loads(self._ok(h).read_text("utf-8"))
        except (OSError, ValueError):
            return None
        return rec if rec.get("config_hash") == h and rec.get("status") == "ok" else None

    def failure(self, h: str) -> dict[str, Any] | None:
        """The last recorded failure of run ``h``, or ``None``."""
        try:
            rec: dict[str, Any] = json.loads(self._failed(h).read_text("utf-8"))
        except (OSError, ValueError):
            return None
        return rec

    def put(self, record: dict[str, Any]) -> None:
        """Store a record (``status`` "ok" or "failed") atomically."""
        h = str(record["config_hash"])
        text = json.dumps(record, sort_keys=False) + "\n"
        if record.get("status") == "ok":
            write_atomic(self._ok(h), text)
            self._failed(h).unlink(missing_ok=True)
        else:
            write_atomic(self._failed(h), text)

    def done(self) -> list[str]:
        """Hashes of every finished run in the folder, sorted."""
        d = self.folder / "runs"
        if not d.is_dir():
            return []
        return sorted(p.stem for p in d.glob("*.json") if self.get(p.stem) is not None)
