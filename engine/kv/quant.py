"""KV quantisation codecs: fp32, fp16 and asymmetric group-quantised int8 / int4.

Pure array functions; each takes the array module ``xp`` (NumPy or CuPy, from
:mod:`engine.backend`) so the same code runs on a CPU and a GPU.

Group quantisation (asymmetric, round to nearest)
-------------------------------------------------
Values are split into groups of ``group`` consecutive elements along one axis. For each group
with minimum ``lo`` and maximum ``hi``::

    scale = (hi - lo) / qmax            qmax = 2**bits - 1   (255 for int8, 15 for int4)
    code  = clip(rint((x - lo) / scale), 0, qmax)            stored as uint8
    x'    = code * scale + lo                                dequantised, float32

``scale`` and ``lo`` (the zero point, kept as a float minimum) are float32 arrays shaped like
the data with the grouped axis shortened to ``n // group``. A constant group has ``scale`` 1
and decodes exactly. The error of one element is at most ``scale / 2``.

int4 codes are packed two per byte along the **last** axis (element ``2i`` in the low nibble,
``2i + 1`` in the high nibble), so that axis must have even length. Packing is independent of
grouping: the group axis may be any axis.

Relative error (used by tests and benchmarks): ``||x' - x|| / ||x||``, Frobenius norm over the
whole array.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Literal, NamedTuple, get_args

from engine.errors import InputError

KVFormat = Literal["fp32", "fp16", "int8", "int4"]
FORMATS: tuple[str, ...] = get_args(KVFormat)
GROUP_SIZES: tuple[int, ...] = (32, 64, 128)
BITS: dict[str, int] = {"int8": 8, "int4": 4}

__all__ = [
    "BITS",
    "FORMATS",
    "GROUP_SIZES",
    "Encoded",
    "KVFormat",
    "check_format",
    "decode",
    "dequantize_groups",
    "encode",
    "is_quantised",
    "pack_int4",
    "quantize_groups",
    "rel_error",
    "roundtrip_rel_error",
    "unpack_int4",
]


class Encoded(NamedTuple):
    """One encoded array. ``scale`` and ``zero`` are None for fp32 / fp16."""

    data: Any
    scale: Any | None
    zero: Any | None


def check_format(fmt: str, group_size: int, *, source: str | None = None) -> None:
    """Raise InputError unless ``fmt`` is a known format and ``group_size`` an allowed size."""
    if fmt not in FORMATS:
        raise InputError(
            f"unknown KV format {fmt!r}; allowed: {', '.join(FORMATS)}",
            source=source,
            where="kv.format",
        )
    if group_size not in GROUP_SIZES:
        raise InputError(
            f"group size {group_size!r} not allowed; allowed: "
            f"{', '.join(str(g) for g in GROUP_SIZES)}",
            source=source,
            where="kv.group_size",
        )


def is_quantised(fmt: str) -> bool:
    """True for the group-quantised integer formats (int8, int4)."""
    return fmt in BITS


def _grouped_shape(shape: tuple[int, ...], axis: int, group: int) -> tuple[int, ...]:
    n = shape[axis]
    if group <= 0 or n % group:
        raise ValueError(f"axis {axis} has length {n}, not a multiple of group {group}")
    return (*shape[:axis], n // group, group, *shape[axis + 1 :])


def quantize_groups(
    x: Any, bits: int, axis: int, group: int, xp: ModuleType, valid: Any | None = None
) -> tuple[Any, Any, Any]:
    """Quantise ``x`` in groups of ``group`` along ``axis``; return ``(codes, scale, zero)``.

    ``codes`` is uint8 shaped like ``x`` (unpacked, values 0..2**bits-1); ``scale`` and
    ``zero`` are float32 with ``axis`` shortened to ``n // group``. If ``valid`` (a bool array
    broadcastable to ``x``) is given, only valid elements set each group's range; a group with
    no valid element gets zero 0 and scale 1. Invalid elements are still coded (clipped).
    """
    axis = axis % x.ndim
    qmax = float((1 << bits) - 1)
    gshape = _grouped_shape(x.shape, axis, group)
    xg = x.astype(xp.float32, copy=False).reshape(gshape)
    red = axis + 1
    if valid is None:
        lo = xg.min(axis=red)
        hi = xg.max(axis=red)
    else:
        vg = xp.broadcast_to(valid, x.shape).reshape(gshape)
        lo = xp.where(vg, xg, xp.float32(xp.inf)).min(axis=red)
        hi = xp.where(vg, xg, xp.float32(-xp.inf)).max(axis=red)
        empty = ~vg.any(axis=red)
        lo = xp.where(empty, xp.float32(0), lo)
        hi = xp.where(empty, xp.float32(0), hi)
    scale = (hi - lo) / xp.float32(qmax)
    scale = xp.where(scale > 0, scale, xp.float32(1)).astype(xp.float32)
    lo = lo.astype(xp.float32)
    q = (xg - xp.expand_dims(lo, red)) / xp.expand_dims(scale, red)
    codes = xp.clip(xp.rint(q), 0, qmax).astype(xp.uint8)
    return codes.reshape(x.shape), scale, lo


def dequantize_groups(
    codes: Any,
    scale: Any,
    zero: Any,
    axis: int,
    group: int,
    xp: ModuleType,
    out: Any | None = None,
) -> Any:
    """Inverse of :func:`quantize_groups` (unpacked ``codes``); returns float32 like ``codes``.

    ``out``, if given, is a C-contiguous float32 array shaped like ``codes`` that receives the
    result (no large temporary is allocated for it)."""
    axis = axis % codes.ndim
    gshape = _grouped_shape(codes.shape, axis, group)
    red = axis + 1
    if out is None:
        out = xp.empty(codes.shape, dtype=xp.float32)
    view = out.reshape(gshape)
    view[...] = codes.reshape(gshape)  # cast first: same-type in-place ops are ~3x faster
    view *= xp.expand_dims(scale, red)  # than one mixed uint8 x float32 broadcasting ufunc
    view += xp.expand_dims(zero, red)
    return out


def pack_int4(codes: Any, xp: ModuleType) -> Any:
    """Pack uint8 codes 0..15 two per byte along the last axis (even length required)."""
    if codes.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even last axis, got {codes.shape[-1]}")
    c = codes.astype(xp.uint8, copy=False)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(xp.uint8)


def unpack_int4(packed: Any, xp: ModuleType) -> Any:
    """Inverse of :func:`pack_int4`: uint8 codes with the last axis doubled."""
    lo = packed & xp.uint8(0x0F)
    hi = packed >> xp.uint8(4)
    return xp.stack((lo, hi), axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def encode(x: Any, fmt: str, axis: int, group: int, xp: ModuleType) -> Encoded:
    """Encode ``x`` in ``fmt`` with groups of ``group`` along ``axis`` (ignored for floats).

    fp32 / fp16 are plain casts (fp16 overflows to inf beyond +-65504). int4 data is packed
    along the last axis.
    """
    if fmt == "fp32":
        return Encoded(x.astype(xp.float32), None, None)
    if fmt == "fp16":
        return Encoded(x.astype(xp.float16), None, None)
    if fmt not in BITS:
        raise InputError(f"unknown KV format {fmt!r}; allowed: {', '.join(FORMATS)}")
    codes, scale, zero = quantize_groups(x, BITS[fmt], axis, group, xp)
    if fmt == "int4":
        codes = pack_int4(codes, xp)
    return Encoded(codes, scale, zero)


def decode(enc: Encoded, fmt: str, axis: int, group: int, xp: ModuleType) -> Any:
    """Decode an :class:`Encoded` back to float32."""
    if enc.scale is None or enc.zero is None:
        return enc.data.astype(xp.float32)
    codes = unpack_int4(enc.data, xp) if fmt == "int4" else enc.data
    return dequantize_groups(codes, enc.scale, enc.zero, axis, group, xp)


def rel_error(approx: Any, exact: Any, xp: ModuleType) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius, in float64); 0 when both are zero."""
    a = approx.astype(xp.float64)
    e = exact.astype(xp.float64)
    den = float(xp.linalg.norm(e.ravel()))
    num = float(xp.linalg.norm((a - e).ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def roundtrip_rel_error(x: Any, fmt: str, axis: int, group: int, xp: ModuleType) -> float:
    """Relative error of ``decode(encode(x))`` against ``x`` (see the module doc)."""
    return rel_error(decode(encode(x, fmt, axis, group, xp), fmt, axis, group, xp), x, xp)
