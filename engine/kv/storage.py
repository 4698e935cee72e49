"""Paged KV storage: per-layer K and V block arrays in fp32, fp16, int8 or int4.

The allocator (data-agnostic) hands out integer block ids; this module holds the bytes for
those ids. Each layer owns one K array and one V array shaped
``[num_blocks, block_tokens, kv_heads, head_dim]`` (logical shape; int4 stores the last axis
packed to ``head_dim // 2`` bytes). Arrays come from the backend module ``xp`` (NumPy or CuPy).

Group-quantised layout (int8 / int4, see :mod:`engine.kv.quant` for the codec)
--------------------------------------------------------------------------------
* **Keys are grouped per channel**: for each block, head and channel, ``key_group`` consecutive
  token slots share one scale and one minimum. ``key_group = min(group_size, block_tokens)``
  (both powers of two, so it divides the block). Scales/mins:
  ``[num_blocks, block_tokens // key_group, kv_heads, head_dim]``.
* **Values are grouped per token**: for each block slot and head, ``value_group`` consecutive
  channels share one scale and minimum. ``value_group = min(group_size, head_dim)``, which
  must divide ``head_dim``. Scales/mins: ``[num_blocks, block_tokens, kv_heads,
  head_dim // value_group]``.
* Scales and mins are float32 and live beside the codes, indexed by the same block id.

Partial writes (decode appends one token at a time): a key group that is only partly written
keeps an exact float32 copy of its written slots in a small staging map (at most one open group
per sequence and layer). Each write re-codes the group from that exact copy over the slots
written so far (a per-block "written" mask tracks them), so appending token by token gives
exactly the codes a single bulk write would give for the same slots - no re-quantisation drift.
The copy is dropped once the group is full. Overwriting an already full group re-codes from the
dequantised values (one extra rounding). Call :meth:`KVStorage.reset` when a block id is reused
for new content so stale slots do not widen a group's range.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.kv.quant import (
    BITS,
    check_format,
    dequantize_groups,
    is_quantised,
    pack_int4,
    quantize_groups,
    unpack_int4,
)

__all__ = ["KVLayout", "KVStorage"]


@dataclass(frozen=True)
class KVLayout:
    """Shape and format of a KV store. Validated by :meth:`check` (InputError on bad values)."""

    num_layers: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    fmt: str = "fp32"
    group_size: int = 64

    @property
    def key_group(self) -> int:
        """Token slots per key scale group (per channel): ``min(group_size, block_tokens)``."""
        return min(self.group_size, self.block_tokens)

    @property
    def value_group(self) -> int:
        """Channels per value scale group (per token): ``min(group_size, head_dim)``."""
        return min(self.group_size, self.head_dim)

    def check(self, source: str | None = None) -> None:
        """Raise InputError naming the field and what is allowed if the layout is unusable."""
        check_format(self.fmt, self.group_size, source=source)
        bt = self.block_tokens
        if not (isinstance(bt, int) and 8 <= bt <= 512 and bt & (bt - 1) == 0):
            raise InputError(
                f"block_tokens {bt!r} not allowed; allowed: a power of two from 8 to 512",
                source=source,
                where="kv.block_tokens",
            )
        for field in ("num_layers", "kv_heads", "head_dim"):
            value = getattr(self, field)
            if not (isinstance(value, int) and value >= 1):
                raise InputError(
                    f"{field} {value!r} not allowed; allowed: an integer >= 1",
                    source=source,
                    where=f"kv.{field}",
                )
        if is_quantised(self.fmt) and self.head_dim % self.value_group:
            raise InputError(
                f"head_dim {self.head_dim} is not a multiple of the value group "
                f"{self.value_group}; allowed: head_dim a multiple of min(group_size, head_dim)",
                source=source,
                where="kv.head_dim",
            )
        if self.fmt == "int4" and self.head_dim % 2:
            raise InputError(
                f"head_dim {self.head_dim} is odd; int4 packs two values per byte, "
                "allowed: an even head_dim",
                source=source,
                where="kv.head_dim",
            )

    def bytes_per_block(self) -> int:
        """Bytes one block id occupies over all layers, K and V, scales and mins included."""
        bt, h, d = self.block_tokens, self.kv_heads, self.head_dim
        per_tensor = {"fp32": 4 * bt * h * d, "fp16": 2 * bt * h * d}.get(self.fmt)
        if per_tensor is None:
            codes = bt * h * d * BITS[self.fmt] // 8
            k_meta = 2 * 4 * (bt // self.key_group) * h * d
            v_meta = 2 * 4 * bt * h * (d // self.value_group)
            return self.num_layers * (2 * codes + k_meta + v_meta)
        return self.num_layers * 2 * per_tensor


def _take_into(xp: ModuleType, data: Any, ids: Any, out: Any) -> Any:
    """``out[...] = data[ids]`` without a temporary. ids are already range-checked, so NumPy's
    unbuffered ``mode="clip"`` is safe (its default ``"raise"`` buffers the whole output)."""
    if xp is np:
        return np.take(data, ids, axis=0, out=out, mode="clip")
    return xp.take(data, ids, axis=0, out=out)


@dataclass
class _Tensor:
    """One layer's K or V: codes (or floats) plus float32 scale/min for quantised formats."""

    data: Any
    scale: Any | None
    zero: Any | None


class KVStorage:
    """Block arrays for K and V of every layer; see the module doc for the layout.

    Invariants: every layer has the same ``num_blocks``; ``written[layer][b, s]`` is True iff
    slot ``s`` of block ``b`` was written since the last :meth:`reset` of ``b`` (or creation).
    """

    def __init__(self, layout: KVLayout, num_blocks: int, xp: ModuleType = np) -> None:
        """Allocate zeroed arrays for ``num_blocks`` blocks on backend ``xp`` (no I/O)."""
        layout.check()
        if not (isinstance(num_blocks, int) and num_blocks >= 0):
            raise InputError(f"num_blocks {num_blocks!r} not allowed; allowed: an integer >= 0")
        self.layout = layout
        self.xp = xp
        self.num_blocks = num_blocks
        self._k = [self._new_tensor(num_blocks, key=True) for _ in range(layout.num_layers)]
        self._v = [self._new_tensor(num_blocks, key=False) for _ in range(layout.num_layers)]
        self._written = [
            xp.zeros((num_blocks, layout.block_tokens), dtype=bool)
            for _ in range(layout.num_layers)
        ]
        # (layer, block_id, key group index) -> exact float32 keys of a partly written group.
        self._stage: dict[tuple[int, int, int], Any] = {}

    # ----------------------------------------------------------------------------- layout
    def _new_tensor(self, n: int, *, key: bool) -> _Tensor:
        xp, lay = self.xp, self.layout
        bt, h, d = lay.block_tokens, lay.kv_heads, lay.head_dim
        if lay.fmt == "fp32":
            return _Tensor(xp.zeros((n, bt, h, d), dtype=xp.float32), None, None)
        if lay.fmt == "fp16":
            return _Tensor(xp.zeros((n, bt, h, d), dtype=xp.float16), None, None)
        width = d // 2 if lay.fmt == "int4" else d
        meta = (n, bt // lay.key_group, h, d) if key else (n, bt, h, d // lay.value_group)
        return _Tensor(
            xp.zeros((n, bt, h, width), dtype=xp.uint8),
            xp.ones(meta, dtype=xp.float32),
            xp.zeros(meta, dtype=xp.float32),
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by all block arrays (codes, scales, mins), excluding the written mask."""
        return self.layout.bytes_per_block() * self.num_blocks

    def grow(self, extra_blocks: int) -> int:
        """Append ``extra_blocks`` empty blocks to every layer; return the new block count.

        Existing block ids and their contents are unchanged (arrays are reallocated and copied).
        """
        if extra_blocks < 0:
            raise ValueError(f"extra_blocks must be >= 0, got {extra_blocks}")
        if extra_blocks == 0:
            return self.num_blocks
        xp = self.xp
        for tensors, key in ((self._k, True), (self._v, False)):
            for i, t in enumerate(tensors):
                new = self._new_tensor(extra_blocks, key=key)
                tensors[i] = _Tensor(
                    xp.concatenate((t.data, new.data)),
                    None if t.scale is None else xp.concatenate((t.scale, new.scale)),
                    None if t.zero is None else xp.concatenate((t.zero, new.zero)),
                )
        self._written = [
            xp.concatenate((w, xp.zeros((extra_blocks, self.layout.block_tokens), dtype=bool)))
            for w in self._written
        ]
        self.num_blocks += extra_blocks
        return self.num_blocks

    def reset(self, block_ids: Any) -> None:
        """Forget the contents of ``block_ids`` in every layer (they read back as zeros)."""
        ids = self._ids(block_ids)
        gone = {int(b) for b in self.xp.asarray(ids).ravel().tolist()}
        for key in [key for key in self._stage if key[1] in gone]:
            del self._stage[key]
        for layer in range(self.layout.num_layers):
            self._written[layer][ids] = False
            for t in (self._k[layer], self._v[layer]):
                t.data[ids] = 0
                if t.scale is not None and t.zero is not None:
                    t.scale[ids] = 1
                    t.zero[ids] = 0

    def written(self, layer: int) -> Any:
        """The ``[num_blocks, block_tokens]`` bool mask of written slots for ``layer`` (a copy)."""
        return self._written[layer].copy()

    # ----------------------------------------------------------------------------- helpers
    def _ids(self, block_ids: Any) -> Any:
        ids = self.xp.asarray(block_ids, dtype=self.xp.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            raise IndexError(f"block id out of range 0..{self.num_blocks - 1}")
        return ids

    def _check_tokens(self, x: Any, what: str) -> None:
        lay = self.layout
        if x.ndim != 3 or x.shape[1:] != (lay.kv_heads, lay.head_dim):
            raise ValueError(
                f"{what} must be [tokens, {lay.kv_heads}, {lay.head_dim}], got {tuple(x.shape)}"
            )

    def _store_codes(self, t: _Tensor, index: Any, codes: Any) -> None:
        t.data[index] = pack_int4(codes, self.xp) if self.layout.fmt == "int4" else codes

    def _codes(self, data: Any) -> Any:
        return unpack_int4(data, self.xp) if self.layout.fmt == "int4" else data

    # ----------------------------------------------------------------------------- writes
    def write(self, layer: int, block_id: int, start: int, k: Any, v: Any) -> None:
        """Write ``n`` tokens' K and V (each ``[n, kv_heads, head_dim]``) into slots
        ``start .. start+n-1`` of ``block_id`` in ``layer``. The range must fit in the block."""
        xp, lay = self.xp, self.layout
        self._check_tokens(k, "k")
        self._check_tokens(v, "v")
        n = k.shape[0]
        if v.shape[0] != n:
            raise ValueError(f"k has {n} tokens but v has {v.shape[0]}")
        if not (start >= 0 and start + n <= lay.block_tokens):
            raise ValueError(f"slots {start}..{start + n - 1} outside block of {lay.block_tokens}")
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} out of range 0..{self.num_blocks - 1}")
        if n == 0:
            return
        end = start + n
        self._written[layer][block_id, start:end] = True
        kt, vt = self._k[layer], self._v[layer]
        if not is_quantised(lay.fmt):
            kt.data[block_id, start:end] = k
            vt.data[block_id, start:end] = v
            return
        bits = BITS[lay.fmt]
        assert kt.scale is not None and kt.zero is not None
        assert vt.scale is not None and vt.zero is not None
        # Values: groups lie inside one token, so new tokens are coded on their own.
        codes, scale, zero = quantize_groups(v, bits, -1, lay.value_group, xp)
        self._store_codes(vt, (block_id, slice(start, end)), codes)
        vt.scale[block_id, start:end] = scale
        vt.zero[block_id, start:end] = zero
        # Keys: re-code every touched token group over all its written slots.
        g = lay.key_group
        g0, g1 = (start // g) * g, -(-end // g) * g
        cur = dequantize_groups(
            self._codes(kt.data[block_id, g0:g1]),
            kt.scale[block_id, g0 // g : g1 // g],
            kt.zero[block_id, g0 // g : g1 // g],
            0,
            g,
            xp,
        )
        for gi in range(g0 // g, g1 // g):  # exact copies of open groups replace decoded ones
            staged = self._stage.get((layer, block_id, gi))
            if staged is not None:
                cur[gi * g - g0 : (gi + 1) * g - g0] = staged
        cur[start - g0 : end - g0] = k
        mask = self._written[layer][block_id, g0:g1]
        codes, scale, zero = quantize_groups(cur, bits, 0, g, xp, valid=mask[:, None, None])
        self._store_codes(kt, (block_id, slice(g0, g1)), codes)
        kt.scale[block_id, g0 // g : g1 // g] = scale
        kt.zero[block_id, g0 // g : g1 // g] = zero
        # Invariant: a staging entry exists iff its group is partly (not fully) written here.
        for gi in range(g0 // g, g1 // g):
            key = (layer, block_id, gi)
            if bool(mask[gi * g - g0 : (gi + 1) * g - g0].all()):
                self._stage.pop(key, None)
            else:
                self._stage[key] = cur[gi * g - g0 : (gi + 1) * g - g0].copy()

    def write_blocks(self, layer: int, block_ids: Any, k: Any, v: Any) -> None:
        """Fill whole blocks at once: ``k``/``v`` are ``[len(block_ids), block_tokens,
        kv_heads, head_dim]``; previous contents of those blocks are replaced."""
        xp, lay = self.xp, self.layout
        ids = self._ids(block_ids)
        shape = (ids.shape[0], lay.block_tokens, lay.kv_heads, lay.head_dim)
        if tuple(k.shape) != shape or tuple(v.shape) != shape:
            raise ValueError(f"k and v must be {shape}, got {tuple(k.shape)}, {tuple(v.shape)}")
        self._written[layer][ids] = True
        kt, vt = self._k[layer], self._v[layer]
        if not is_quantised(lay.fmt):
            kt.data[ids] = k
            vt.data[ids] = v
            return
        full = {int(b) for b in ids.ravel().tolist()}
        for key in [key for key in self._stage if key[0] == layer and key[1] in full]:
            del self._stage[key]
        bits = BITS[lay.fmt]
        for t, x, axis, g in ((kt, k, 1, lay.key_group), (vt, v, -1, lay.value_group)):
            codes, scale, zero = quantize_groups(x, bits, axis, g, xp)
            self._store_codes(t, ids, codes)
            assert t.scale is not None and t.zero is not None
            t.scale[ids] = scale
            t.zero[ids] = zero

    def write_tokens(self, layer: int, block_table: Any, start_pos: int, k: Any, v: Any) -> None:
        """Write a sequence's tokens at logical positions ``start_pos ..`` through its block
        table (position ``p`` lives in block ``block_table[p // block_tokens]``, slot
        ``p % block_tokens``). Runs of whole blocks are written in one vectorised call."""
        bt = self.layout.block_tokens
        table = [int(b) for b in block_table]
        n = int(k.shape[0])
        if -(-(start_pos + n) // bt) > len(table):
            raise ValueError(
                f"block table of {len(table)} blocks cannot hold positions up to {start_pos + n}"
            )
        i, pos = 0, start_pos
        while i < n:
            bi, slot = divmod(pos, bt)
            whole = (n - i) // bt if slot == 0 else 0
            if whole:
                span = whole * bt
                shape = (whole, bt, *k.shape[1:])
                self.write_blocks(
                    layer,
                    table[bi : bi + whole],
                    k[i : i + span].reshape(shape),
                    v[i : i + span].reshape(shape),
                )
                take = span
            else:
                take = min(bt - slot, n - i)
                self.write(layer, table[bi], slot, k[i : i + take], v[i : i + take])
            i += take
            pos += take

    # ----------------------------------------------------------------------------- reads
    def read(
        self, layer: int, block_ids: Any, out: tuple[Any, Any] | None = None
    ) -> tuple[Any, Any]:
        """Dequantised float32 K and V for ``block_ids`` (any int array shape ``S``); each is
        ``[*S, block_tokens, kv_heads, head_dim]``. Unwritten slots read as zeros for fp32/fp16
        and as the group minimum (0 for a never-written group) for quantised formats.

        ``out``: optional ``(k_buf, v_buf)`` C-contiguous float32 arrays of that shape to fill
        and return (lets a chunked reader reuse two buffers instead of allocating per chunk).
        """
        k_out, v_out = (None, None) if out is None else out
        return self.read_keys(layer, block_ids, k_out), self.read_values(layer, block_ids, v_out)

    def read_keys(self, layer: int, block_ids: Any, out: Any | None = None) -> Any:
        """The K half of :meth:`read` (into ``out`` if given)."""
        ids = self._ids(block_ids)
        return self._read(self._k[layer], ids, ids.ndim, self.layout.key_group, out)

    def read_values(self, layer: int, block_ids: Any, out: Any | None = None) -> Any:
        """The V half of :meth:`read` (into ``out`` if given)."""
        ids = self._ids(block_ids)
        return self._read(self._v[layer], ids, -1, self.layout.value_group, out)

    def _read(self, t: _Tensor, ids: Any, axis: int, group: int, out: Any | None) -> Any:
        xp = self.xp
        if t.scale is None or t.zero is None:
            if out is None:
                got = xp.take(t.data, ids, axis=0)
                return got if got.dtype == xp.float32 else got.astype(xp.float32)
            if t.data.dtype == xp.float32:
                return _take_into(xp, t.data, ids, out)
            out[...] = xp.take(t.data, ids, axis=0)
            return out
        codes = self._codes(xp.take(t.data, ids, axis=0))
        scale = xp.take(t.scale, ids, axis=0)
        zero = xp.take(t.zero, ids, axis=0)
        return dequantize_groups(codes, scale, zero, axis, group, xp, out=out)

    def raw(self, layer: int) -> tuple[Any, Any]:
        """The stored K and V data arrays of ``layer`` (no copy; for kernels and benchmarks)."""
        return self._k[layer].data, self._v[layer].data
