"""Chunk metadata for one model version: ids, layers, head groups, sizes, offsets (R1, R26, R28).

A model's weights are cut into fixed-size chunks (``chunk_bytes``, 256 KiB .. 16 MiB; R30's
default 4 MiB). Chunk ids run ``0 .. n_chunks-1`` per model, in layer order, so the chunks of
one layer are a contiguous id range (:meth:`ChunkTable.layer_slice`).

Invariants (kept by :func:`chunk_model`, checked by the tests):

* a chunk never spans two layers, and with ``"layer-head"`` sharding never two head groups;
* every chunk has ``0 < size <= chunk_bytes``; a layer's chunk sizes sum to its bytes;
* ``offset`` is the chunk's byte offset inside its layer, ``global_offset`` inside the whole
  model's flat byte stream (layers concatenated in order).

Sharding (R26): ``"layer"`` cuts each layer's bytes directly. ``"layer-head"`` first splits a
layer into ``heads`` head groups (sizes differ by at most one byte; the first groups get the
extra bytes) and cuts each group separately. ``"layer-head-seq"`` chunks weights exactly like
``"layer-head"``: sequence/batch sharding splits activations and KV, not parameters, and is
applied by the simulator's scheduler, not here.

A chunk's global key is the tuple ``(model, id)``; :meth:`ChunkTable.key` gives an equivalent
int (high 32 bits from a stable hash of the model name, low 32 bits the id). Keys do not
include the version: a version change replaces a chunk's contents under the same key and is
tracked by ``version`` (and the checksums).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import crc32c
import numpy as np

MIN_CHUNK_BYTES = 256 * 1024
MAX_CHUNK_BYTES = 16 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024

Sharding = Literal["layer", "layer-head", "layer-head-seq"]
SHARDINGS: tuple[str, ...] = ("layer", "layer-head", "layer-head-seq")


def chunk_checksums(data: bytes | bytearray | memoryview) -> tuple[str, str]:
    """Return ``(crc32c_hex, sha256_hex)`` of ``data``: CRC32C for the fast per-transfer check,
    SHA-256 for the end-to-end verification of R28. Hex strings are lower-case, 8 and 64 chars.
    """
    crc = crc32c.crc32c(data)
    return f"{crc:08x}", hashlib.sha256(data).hexdigest()


def _model_tag(model: str) -> int:
    return int.from_bytes(hashlib.blake2b(model.encode("utf-8"), digest_size=4).digest(), "big")


@dataclass(frozen=True, eq=False)
class ChunkTable:
    """Chunking of one model version. Arrays are indexed by chunk id; treat them as read-only.

    ``layer`` (int32), ``head`` (int32, head group, -1 with ``"layer"`` sharding),
    ``size`` (int64 bytes), ``offset`` (int64, inside the layer), ``global_offset`` (int64).
    """

    model: str
    version: int
    chunk_bytes: int
    sharding: str
    heads: int
    layer: np.ndarray
    head: np.ndarray
    size: np.ndarray
    offset: np.ndarray
    global_offset: np.ndarray
    _layer_start: np.ndarray = field(repr=False)  # chunk id range of layer l: [s[l], s[l+1])
    _layer_bytes: np.ndarray = field(repr=False)

    @property
    def n_chunks(self) -> int:
        """Number of chunks."""
        return int(self.size.shape[0])

    @property
    def n_layers(self) -> int:
        """Number of layers (including layers of zero bytes, which have no chunks)."""
        return int(self._layer_bytes.shape[0])

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole model (sum of chunk sizes)."""
        return int(self._layer_bytes.sum())

    def layer_slice(self, layer: int) -> range:
        """Chunk ids of ``layer`` as a ``range``; ``IndexError`` for an unknown layer."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.n_layers - 1}")
        return range(int(self._layer_start[layer]), int(self._layer_start[layer + 1]))

    def layer_bytes(self, layer: int) -> int:
        """Bytes of ``layer``."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.n_layers - 1}")
        return int(self._layer_bytes[layer])

    def key(self, chunk_id: int) -> int:
        """Stable int key of chunk ``chunk_id``, unique across models (up to 32-bit tag clashes
        of model names); equivalent to the tuple key ``(model, chunk_id)``."""
        if not 0 <= chunk_id < self.n_chunks:
            raise IndexError(f"chunk {chunk_id} out of range 0..{self.n_chunks - 1}")
        return (_model_tag(self.model) << 32) | chunk_id

    def keys(self, ids: Sequence[int] | range | None = None) -> list[tuple[str, int]]:
        """Tuple keys ``(model, id)`` for ``ids`` (all chunks by default)."""
        chosen = range(self.n_chunks) if ids is None else ids
        return [(self.model, int(i)) for i in chosen]


def _split_even(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def chunk_model(
    model: str,
    layer_bytes: Sequence[int],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    version: int = 1,
    sharding: Sharding = "layer",
    heads: int = 1,
) -> ChunkTable:
    """Cut a model whose layers hold ``layer_bytes`` into chunks; see the module docstring.

    Raises ``ValueError`` if ``chunk_bytes`` is outside 256 KiB .. 16 MiB, a layer size is
    negative, ``heads < 1`` or ``sharding`` is unknown.
    """
    if not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(
            f"chunk_bytes={chunk_bytes} is outside the allowed range "
            f"{MIN_CHUNK_BYTES} (256 KiB) .. {MAX_CHUNK_BYTES} (16 MiB)"
        )
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding {sharding!r} is not one of {', '.join(SHARDINGS)}")
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    groups = 1 if sharding == "layer" else heads
    layers: list[int] = []
    head_ids: list[int] = []
    sizes: list[int] = []
    offsets: list[int] = []
    starts = [0]
    for li, nbytes in enumerate(layer_bytes):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"layer {li} has negative size {nbytes}")
        pos = 0
        for g, gbytes in enumerate(_split_even(nbytes, groups)):
            full, rest = divmod(gbytes, chunk_bytes)
            pieces = [chunk_bytes] * full + ([rest] if rest else [])
            for piece in pieces:
                layers.append(li)
                head_ids.append(g if sharding != "layer" else -1)
                sizes.append(piece)
                offsets.append(pos)
                pos += piece
        starts.append(len(sizes))
    size = np.asarray(sizes, dtype=np.int64)
    global_offset = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(size[:-1], out=global_offset[1:])
    return ChunkTable(
        model=model,
        version=version,
        chunk_bytes=chunk_bytes,
        sharding=sharding,
        heads=groups,
        layer=np.asarray(layers, dtype=np.int32),
        head=np.asarray(head_ids, dtype=np.int32),
        size=size,
        offset=np.asarray(offsets, dtype=np.int64),
        global_offset=global_offset,
        _layer_start=np.asarray(starts, dtype=np.int64),
        _layer_bytes=np.asarray([int(b) for b in layer_bytes], dtype=np.int64),
    )
