"""Chunk store: a model's weights written once to an object store as verified chunk files.

Layout in the object store (one folder per model version)::

    <model>/v<version>/manifest.json         written last: its presence means "complete"
    <model>/v<version>/<id:08d>.chunk        chunk bytes, ids as in engine.chunks.ChunkTable

Weights are random but deterministic: layer ``l`` holds ``standard_normal * 0.02`` values of
``dtype`` drawn from ``numpy.random.Generator(PCG64(SeedSequence(seed).spawn(n)[l]))``, so any
layer can be regenerated alone (:func:`layer_weights`) to check what the tiers served. Layer
sizes come from the simulator's model catalogue (``ModelSpec.layer_bytes()``), scaled down by
:func:`scale_layer_bytes` so the model fits the machine; the engine never imports ``sim``.

Every chunk record in the manifest carries ``version``, ``size``, CRC32C and SHA-256
(:func:`engine.chunks.chunk_checksums`). :class:`ChunkStore` reads chunks through a
:class:`engine.tiers.TierStack`; each read from the object store or an SSD cache is verified
against both checksums and the size, so bad bytes are never served: a bad copy is discarded and
re-fetched (SSD -> object store; object store -> retry -> replicas). A chunk absent everywhere
raises :class:`ChunkMissing` (an :class:`InputError` naming model, version, chunk, layer and
file); a chunk with no good copy raises :class:`ChunkCorrupt`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from engine.chunks import DEFAULT_CHUNK_BYTES, ChunkTable, chunk_checksums, chunk_model
from engine.configfile import parse_mapping
from engine.errors import InputError
from engine.policy.base import Key
from engine.tiers.base import Tier, TierMiss
from engine.tiers.stack import ObjectCorrupt, ObjectMissing, ReadResult, TierStack

DTYPES: dict[str, int] = {"float16": 2, "float32": 4}
MANIFEST_FORMAT = 1

__all__ = [
    "DTYPES",
    "ChunkCorrupt",
    "ChunkMissing",
    "ChunkRecord",
    "ChunkStore",
    "Manifest",
    "chunk_name",
    "layer_weights",
    "load_manifest",
    "manifest_name",
    "scale_layer_bytes",
    "write_model",
]


class ChunkMissing(InputError):
    """A chunk (or a manifest) does not exist in any tier; the message names it."""


class ChunkCorrupt(RuntimeError):
    """Every existing copy of a chunk failed verification; nothing was served."""


def manifest_name(model: str, version: int) -> str:
    """Object name of the manifest of ``model`` version ``version``."""
    return f"{model}/v{version}/manifest.json"


def chunk_name(model: str, version: int, chunk_id: int) -> str:
    """Object name of chunk ``chunk_id`` of ``model`` version ``version``."""
    return f"{model}/v{version}/{chunk_id:08d}.chunk"


def scale_layer_bytes(layer_bytes: Sequence[int], scale: float, dtype_bytes: int) -> list[int]:
    """Each layer's size times ``scale`` (0 < scale <= 1), rounded down to whole elements of
    ``dtype_bytes``; a non-empty layer keeps at least one element. Order is preserved."""
    if not 0.0 < scale <= 1.0:
        raise InputError(f"scale {scale!r} not allowed; allowed: 0 < scale <= 1", where="scale")
    out = []
    for b in layer_bytes:
        n = int(b * scale) // dtype_bytes * dtype_bytes
        out.append(max(n, dtype_bytes) if b > 0 else 0)
    return out


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk as written: ``id``, ``layer``, ``size`` (bytes) and checksums (hex)."""

    id: int
    layer: int
    size: int
    crc32c: str
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Everything needed to regenerate, locate and verify a model version's chunks."""

    model: str
    version: int
    seed: int
    dtype: str
    chunk_bytes: int
    layer_bytes: tuple[int, ...]
    chunks: tuple[ChunkRecord, ...]
    format: int = MANIFEST_FORMAT

    def table(self) -> ChunkTable:
        """The chunking (ids, layers, offsets) this manifest was written with."""
        return chunk_model(self.model, self.layer_bytes, self.chunk_bytes, self.version)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes)

    def to_json(self) -> str:
        d = asdict(self)
        d["layer_bytes"] = list(self.layer_bytes)
        d["chunks"] = [asdict(c) for c in self.chunks]
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str) -> Manifest:
        """Parse a manifest; :class:`InputError` naming ``source`` and the bad field."""
        raw = parse_mapping(text, source, "manifest", fmt="json")
        fields = (
            "model",
            "version",
            "seed",
            "dtype",
            "chunk_bytes",
            "layer_bytes",
            "chunks",
            "format",
        )
        if sorted(raw) != sorted(fields):
            raise InputError(
                f"manifest keys {sorted(raw)} not allowed; allowed: {sorted(fields)}",
                source=source,
            )
        if raw["dtype"] not in DTYPES:
            raise InputError(
                f"dtype {raw['dtype']!r} not allowed; allowed: {', '.join(DTYPES)}",
                source=source,
                where="dtype",
            )
        try:
            chunks = tuple(ChunkRecord(**c) for c in raw["chunks"])
        except TypeError as err:
            raise InputError(f"bad chunk record: {err}", source=source, where="chunks") from None
        return cls(
            model=str(raw["model"]),
            version=int(raw["version"]),
            seed=int(raw["seed"]),
            dtype=str(raw["dtype"]),
            chunk_bytes=int(raw["chunk_bytes"]),
            layer_bytes=tuple(int(b) for b in raw["layer_bytes"]),
            chunks=chunks,
            format=int(raw["format"]),
        )


def layer_weights(seed: int, n_layers: int, layer: int, nbytes: int, dtype: str) -> np.ndarray:
    """The bytes of ``layer`` (of ``n_layers``) for ``seed``: see the module docstring."""
    child = np.random.SeedSequence(seed).spawn(n_layers)[layer]
    rng = np.random.Generator(np.random.PCG64(child))
    n = nbytes // DTYPES[dtype]
    values = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).astype(dtype)
    return values.view(np.uint8)


def load_manifest(store: Tier, model: str, version: int) -> Manifest:
    """Read and parse the manifest of ``model`` ``version``; :class:`ChunkMissing` if absent."""
    name = manifest_name(model, version)
    try:
        raw = store.get_host(name)
    except TierMiss:
        raise ChunkMissing(
            f"model {model!r} version {version} has no manifest (not written, or written only "
            "partly); write it with engine.chunkstore.write_model",
            source=f"{store.name}:{name}",
        ) from None
    return Manifest.from_json(raw.tobytes().decode("utf-8"), f"{store.name}:{name}")


def write_model(
    store: Tier,
    model: str,
    layer_bytes: Sequence[int],
    seed: int,
    *,
    version: int = 1,
    dtype: str = "float16",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Manifest:
    """Write ``model`` version ``version`` to ``store`` once and return its manifest.

    If a complete copy with the same inputs (seed, dtype, chunk size, layer sizes) is already
    there, its manifest is returned without writing: the same inputs give the same bytes. Chunks are written first and the manifest last, so a crash
    leaves no manifest and the next call rewrites everything.
    """
    if dtype not in DTYPES:
        raise InputError(
            f"dtype {dtype!r} not allowed; allowed: {', '.join(DTYPES)}", where="dtype"
        )
    bad = [i for i, b in enumerate(layer_bytes) if b % DTYPES[dtype]]
    if bad:
        raise InputError(
            f"layer {bad[0]} has {layer_bytes[bad[0]]} bytes, not whole {dtype} elements; "
            "allowed: multiples of the element size (use scale_layer_bytes)",
            where="layer_bytes",
        )
    table = chunk_model(model, layer_bytes, chunk_bytes, version)
    sizes = tuple(int(b) for b in layer_bytes)
    try:
        old = load_manifest(store, model, version)
    except InputError:
        old = None  # absent or unreadable: (re)write below
    if old is not None and (old.seed, old.dtype, old.chunk_bytes, old.layer_bytes) == (
        seed,
        dtype,
        chunk_bytes,
        sizes,
    ):
        return old  # same inputs give the same bytes: already written
    records: list[ChunkRecord] = []
    for layer in range(table.n_layers):
        ids = table.layer_slice(layer)
        if not len(ids):
            continue
        data = layer_weights(seed, table.n_layers, layer, table.layer_bytes(layer), dtype)
        for cid in ids:
            lo = int(table.offset[cid])
            piece = data[lo : lo + int(table.size[cid])]
            crc, sha = chunk_checksums(piece.data)
            records.append(ChunkRecord(cid, layer, int(piece.size), crc, sha))
            store.put(chunk_name(model, version, cid), piece)
    manifest = Manifest(model, version, seed, dtype, chunk_bytes, sizes, tuple(records))
    store.put(manifest_name(model, version), manifest.to_json().encode("utf-8"))
    return manifest


class _Models:
    """Chunk names and validation for every model version sharing one stack (by model)."""

    def __init__(self) -> None:
        self.stores: dict[str, ChunkStore] = {}

    def name_of(self, key: Key) -> str:
        model, cid = cast(tuple[str, int], key)
        return chunk_name(model, self.stores[model].manifest.version, cid)

    def valid(self, key: Key, data: np.ndarray) -> bool:
        model, cid = cast(tuple[str, int], key)
        return self.stores[model].matches(cid, data)


class ChunkStore:
    """Verified chunk reads of one model version through a :class:`TierStack`.

    Chunk keys in the stack's caches are ``(model, chunk_id)`` -- the keys of
    :meth:`engine.chunks.ChunkTable.keys`, so the engine's cache decisions are made on the same
    keys as the simulator's; the colour of each read is the model name (``color-lru``). Several
    models (one version each) may share a stack, as they share a node's tiers in the simulator:
    the constructor installs (or extends) the stack's ``validator`` and ``name_of`` and does no
    I/O.
    """

    def __init__(self, manifest: Manifest, stack: TierStack) -> None:
        self.manifest = manifest
        self.stack = stack
        self.table = manifest.table()
        if self.table.n_chunks != len(manifest.chunks):
            raise InputError(
                f"manifest lists {len(manifest.chunks)} chunks but its layer sizes give "
                f"{self.table.n_chunks}",
                source=manifest_name(manifest.model, manifest.version),
                where="chunks",
            )
        self._records = manifest.chunks
        models = getattr(stack.name_of, "__self__", None)
        if not isinstance(models, _Models):
            models = _Models()
            stack.validator = models.valid
            stack.name_of = models.name_of
        if manifest.model in models.stores:
            raise InputError(
                f"model {manifest.model!r} already has a chunk store on this stack; "
                "allowed: one version of each model per stack",
                where="model",
            )
        models.stores[manifest.model] = self

    # -- keys ------------------------------------------------------------------------------
    def matches(self, chunk_id: int, data: np.ndarray) -> bool:
        """Whether ``data`` is chunk ``chunk_id`` as the manifest records it: its size and
        both checksums (CRC32C and SHA-256)."""
        rec = self._records[chunk_id]
        if int(data.size) != rec.size:
            return False
        return chunk_checksums(np.ascontiguousarray(data).data) == (rec.crc32c, rec.sha256)

    def key(self, chunk_id: int) -> tuple[str, int]:
        """Cache key of chunk ``chunk_id``."""
        return (self.manifest.model, chunk_id)

    # -- reads -----------------------------------------------------------------------------
    def read_chunk(
        self, chunk_id: int, now: float, *, count: bool = True, pin: bool = False
    ) -> ReadResult:
        """Bytes of chunk ``chunk_id`` (verified), promoted up the stack; see TierStack.read."""
        levels = self.stack.levels
        if pin and levels and self.key(chunk_id) in levels[0].cache:
            levels[0].cache.pin(self.key(chunk_id))  # resident: pinned first, so it stays
            return self.read_chunks([chunk_id], now, count=count)[0]
        return self.read_chunks([chunk_id], now, count=count, pin=pin)[0]

    def read_chunks(
        self,
        chunk_ids: Sequence[int],
        now: float,
        *,
        count: bool = True,
        before_promote: Any = None,
        pin: bool = False,
    ) -> list[ReadResult]:
        """Chunks ``chunk_ids`` read as one transfer (see :meth:`TierStack.read_many`)."""
        for chunk_id in chunk_ids:
            if not 0 <= chunk_id < len(self._records):
                raise InputError(
                    f"chunk {chunk_id} not allowed; allowed: 0..{len(self._records) - 1}",
                    source=self.manifest.model,
                    where="chunk id",
                )
        items = [(self.key(c), self._records[c].size) for c in chunk_ids]
        try:
            return self.stack.read_many(
                items,
                now,
                self.manifest.model,
                count=count,
                before_promote=before_promote,
                pin=pin,
            )
        except ObjectMissing as err:
            cid = cast(tuple[str, int], err.key)[1]
            rec = self._records[cid]
            raise ChunkMissing(
                f"chunk {cid} (layer {rec.layer}, {rec.size} bytes) of model "
                f"{self.manifest.model!r} version {self.manifest.version} is missing: "
                f"{err.name!r} not found in {', '.join(err.searched)}",
                source=f"{self.stack.backing.name}:{err.name}",
            ) from None
        except ObjectCorrupt as err:
            cid = cast(tuple[str, int], err.key)[1]
            raise ChunkCorrupt(
                f"chunk {cid} (layer {self._records[cid].layer}) of model "
                f"{self.manifest.model!r} version {self.manifest.version}: every copy failed "
                f"CRC32C/SHA-256 verification ({', '.join(err.bad)}); nothing was served"
            ) from None

    def read_layer(self, layer: int, now: float, *, count: bool = True) -> list[Any]:
        """Verified bytes of every chunk of ``layer``, in chunk order."""
        return [self.read_chunk(c, now, count=count).data for c in self.table.layer_slice(layer)]

    def expected_layer(self, layer: int) -> np.ndarray:
        """The bytes ``layer`` must have (regenerated from the seed; for checks and tests)."""
        m = self.manifest
        return layer_weights(m.seed, len(m.layer_bytes), layer, m.layer_bytes[layer], m.dtype)
