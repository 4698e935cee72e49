"""GPU paths (marker ``gpu``; skipped cleanly where no CUDA device with CuPy exists).

The CUDA kernel (fp32 / fp16 stores) and the backend-generic array path on CuPy (int8 / int4)
are compared with the NumPy path on the same data, and with dense float64 attention.
CuPy is reached only through engine.backend (ARCHITECTURE contract 4).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from engine import backend
from engine.kv.attention import dense_attention, paged_decode_attention
from engine.kv.quant import rel_error
from engine.kv.storage import KVLayout, KVStorage

pytestmark = pytest.mark.gpu

BOUND = {"fp32": 1e-5, "fp16": 2e-3, "int8": 1e-2, "int4": 0.15}


@pytest.fixture(scope="module")
def cp() -> ModuleType:
    return backend.get_backend("cupy")


def _stores(
    xp: ModuleType, fmt: str, lens: list[int], block_tokens: int, kv_heads: int, dim: int
) -> tuple[KVStorage, KVStorage, list[list[int]], list[np.ndarray], list[np.ndarray]]:
    """The same scattered sequences written to a NumPy store and a CuPy store."""
    rng = np.random.default_rng(11)
    need = [-(-n // block_tokens) for n in lens]
    lay = KVLayout(1, block_tokens, kv_heads, dim, fmt, 64)
    host, dev = KVStorage(lay, sum(need) + 1, np), KVStorage(lay, sum(need) + 1, xp)
    perm = rng.permutation(host.num_blocks).tolist()
    tables, ks, vs = [], [], []
    for n, nb in zip(lens, need, strict=True):
        table, perm = perm[:nb], perm[nb:]
        k = rng.standard_normal((n, kv_heads, dim)).astype(np.float32)
        v = rng.standard_normal((n, kv_heads, dim)).astype(np.float32)
        host.write_tokens(0, table, 0, k, v)
        dev.write_tokens(0, table, 0, xp.asarray(k), xp.asarray(v))
        tables.append(table)
        ks.append(k)
        vs.append(v)
    return host, dev, tables, ks, vs


def test_backend_picks_cupy(cp: ModuleType) -> None:
    assert backend.get_backend("auto") is cp
    assert backend.is_gpu(cp) and backend.name(cp) == "cupy"
    np.testing.assert_array_equal(backend.to_numpy(cp.arange(3)), np.arange(3))


@pytest.mark.parametrize("fmt", ["fp32", "fp16"])
@pytest.mark.parametrize(("kv_heads", "heads", "dim"), [(2, 8, 64), (8, 8, 128), (1, 4, 256)])
def test_kernel_matches_numpy_path(
    cp: ModuleType, fmt: str, kv_heads: int, heads: int, dim: int
) -> None:
    lens = [1, 31, 32, 33, 700, 4099]
    host, dev, tables, ks, vs = _stores(cp, fmt, lens, 16, kv_heads, dim)
    q = np.random.default_rng(3).standard_normal((len(lens), heads, dim)).astype(np.float32)
    want = paged_decode_attention(q, host, tables, lens, chunk_tokens=512)
    got = paged_decode_attention(cp.asarray(q), dev, tables, lens)  # CUDA kernel
    assert rel_error(backend.to_numpy(got), want, np) < 1e-5
    assert rel_error(backend.to_numpy(got), dense_attention(q, ks, vs), np) < BOUND[fmt]
    plain = paged_decode_attention(cp.asarray(q), dev, tables, lens, 512, use_kernel=False)
    assert rel_error(backend.to_numpy(plain), want, np) < 1e-5


def test_kernel_long_context_and_empty_sequence(cp: ModuleType) -> None:
    lens = [16384, 0, 5]
    _host, dev, tables, ks, vs = _stores(cp, "fp32", lens, 64, 2, 128)
    q = np.random.default_rng(4).standard_normal((3, 4, 128)).astype(np.float32)
    got = backend.to_numpy(paged_decode_attention(cp.asarray(q), dev, tables, lens))
    np.testing.assert_array_equal(got[1], 0)
    assert rel_error(got, dense_attention(q, ks, vs), np) < 1e-5


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantised_array_path_on_gpu(cp: ModuleType, fmt: str) -> None:
    lens = [100, 2048, 513]
    host, dev, tables, ks, vs = _stores(cp, fmt, lens, 64, 2, 128)
    k_host, _ = host.read(0, tables[1])
    k_dev, _ = dev.read(0, tables[1])
    assert rel_error(backend.to_numpy(k_dev), k_host, np) < 1e-5  # same codes up to rounding ties
    q = (0.5 * np.random.default_rng(5).standard_normal((3, 8, 128))).astype(np.float32)
    want = paged_decode_attention(q, host, tables, lens, chunk_tokens=256)
    got = backend.to_numpy(paged_decode_attention(cp.asarray(q), dev, tables, lens, 256))
    assert rel_error(got, want, np) < 1e-4
    assert rel_error(got, dense_attention(q, ks, vs), np) < BOUND[fmt]
