"""The storage-tier interface: a named place that holds whole objects as bytes.

A tier is a dumb byte store keyed by **names** (relative POSIX paths such as
``"llama-tiny/v1/000012.chunk"``). It does not decide what to keep: capacity, eviction and
promotion belong to :class:`engine.cache.TierCache` and :class:`engine.tiers.stack.TierStack`.

Contract of every tier:

* ``put(name, data)`` stores a copy of ``data`` (``bytes``, ``bytearray``, ``memoryview`` or a
  1-D ``uint8`` array of any backend) under ``name``, replacing an older object of that name.
  After ``put`` returns, mutating ``data`` does not change what the tier holds.
* ``get(name)`` returns the object's bytes as a 1-D ``uint8`` array (NumPy for object store,
  SSD and host tiers; the tier's backend for the device tier). Raises :class:`KeyError`
  (:class:`TierMiss`) when ``name`` is absent. Bytes in == bytes out.
* ``delete(name)`` removes ``name``; returns whether it was there.
* ``names()`` lists the stored names sorted (deterministic order).
* Constructors do no I/O: directories are created on the first ``put``.

Names are validated by :func:`check_name`: non-empty, ``/``-separated parts of
``[A-Za-z0-9._-]``, no ``.`` or ``..`` part, so a name can never escape a tier's root.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import numpy as np

from engine.errors import InputError

TierKind = Literal["object", "ssd", "host", "device"]
_PART = re.compile(r"^[A-Za-z0-9._-]+$")

__all__ = ["Tier", "TierKind", "TierMiss", "as_host_bytes", "check_name"]


class TierMiss(KeyError):
    """The named object is not stored in this tier."""


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe relative object name, else raise :class:`InputError`."""
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or any(p in ("", ".", "..") or not _PART.match(p) for p in parts):
        raise InputError(
            f"object name {name!r} not allowed; allowed: '/'-separated parts of "
            "letters, digits, '.', '_' and '-' (no empty, '.' or '..' part)",
            where="tier object name",
        )
    return name


def as_host_bytes(data: Any) -> np.ndarray:
    """View or copy ``data`` as a contiguous 1-D NumPy ``uint8`` array on the host.

    Accepts bytes-like objects, NumPy arrays of any dtype (reinterpreted as bytes) and device
    arrays that have a ``.get()`` (copied to the host).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    getter = getattr(data, "get", None)
    if callable(getter) and not isinstance(data, np.ndarray):
        data = getter()
    arr = np.ascontiguousarray(np.asarray(data))
    return arr.reshape(-1).view(np.uint8)


class Tier(ABC):
    """Base class of the four real tiers; see the module docstring for the contract."""

    kind: ClassVar[TierKind]

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def put(self, name: str, data: Any) -> None:
        """Store a copy of ``data`` under ``name``."""

    @abstractmethod
    def get(self, name: str) -> Any:
        """The bytes stored under ``name`` as a 1-D uint8 array; :class:`TierMiss` if absent."""

    @abstractmethod
    def delete(self, name: str) -> bool:
        """Remove ``name``; whether it was present."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Whether ``name`` is stored."""

    @abstractmethod
    def names(self) -> list[str]:
        """Every stored name, sorted."""

    def get_host(self, name: str) -> np.ndarray:
        """Like :meth:`get` but always a host NumPy array (copied off a GPU for device tiers)."""
        return as_host_bytes(self.get(name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
