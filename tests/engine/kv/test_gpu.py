"""GPU paths (marker ``gpu``; skipped cleanly where no CUDA device with CuPy exists).

The CUDA kernel (fp32 / fp16 stores) and the backend-generic array path on CuPy (int8 / int4)
are compared with the NumPy path on the same data, and with dense float64 attention.
CuPy is reached only through engine.backend (ARCHITECTURE contract 4).

One test here needs no GPU: the kernel's CUDA source is compiled as C++20 on the host with
one std::thread per CUDA thread and a std::barrier for ``__syncthreads``, run block by block,
and compared with the NumPy path - so indexing, tiling, barriers and the online softmax of the
real kernel text are checked on a CPU. It is skipped where no ``g++`` is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from engine import backend
from engine.kv import gpu_kernels
from engine.kv.attention import dense_attention, paged_decode_attention
from engine.kv.quant import rel_error
from engine.kv.storage import KVLayout, KVStorage

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


@pytest.mark.gpu
def test_backend_picks_cupy(cp: ModuleType) -> None:
    assert backend.get_backend("auto") is cp
    assert backend.is_gpu(cp) and backend.name(cp) == "cupy"
    np.testing.assert_array_equal(backend.to_numpy(cp.arange(3)), np.arange(3))


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_kernel_long_context_and_empty_sequence(cp: ModuleType) -> None:
    lens = [16384, 0, 5]
    _host, dev, tables, ks, vs = _stores(cp, "fp32", lens, 64, 2, 128)
    q = np.random.default_rng(4).standard_normal((3, 4, 128)).astype(np.float32)
    got = backend.to_numpy(paged_decode_attention(cp.asarray(q), dev, tables, lens))
    np.testing.assert_array_equal(got[1], 0)
    assert rel_error(got, dense_attention(q, ks, vs), np) < 1e-5


@pytest.mark.gpu
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


_HOST_HALF = r"""
inline float to_f32(unsigned short bits)
{
    const unsigned int sign = (bits & 0x8000u) << 16;
    const float mag = std::bit_cast<float>((bits & 0x7fffu) << 13) * 5.192296858534828e33f;
    return std::bit_cast<float>(std::bit_cast<unsigned int>(mag) | sign);  // 2^112 rebias
}
"""

_HARNESS = r"""
#include <algorithm>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
struct Dim3 { int x = 0, y = 0, z = 0; };
static Dim3 blockIdx;
static thread_local Dim3 threadIdx;
static std::barrier<>* block_barrier = nullptr;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline float __int_as_float(unsigned int x) { return std::bit_cast<float>(x); }
using std::min;
__SOURCE__
template <typename T> std::vector<T> load(const char* path, size_t n)
{
    std::vector<T> v(n);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(v.data(), sizeof(T), n, f) != n) std::exit(3);
    std::fclose(f);
    return v;
}
int main(int argc, char** argv)
{
    // B H KVH D BT NB MAXB scale half dir
    const int B = std::atoi(argv[1]), H = std::atoi(argv[2]), KVH = std::atoi(argv[3]);
    const int D = std::atoi(argv[4]), BT = std::atoi(argv[5]), NB = std::atoi(argv[6]);
    const int MAXB = std::atoi(argv[7]);
    const float scale = std::atof(argv[8]);
    const bool half = std::atoi(argv[9]) != 0;
    const std::string dir = argv[10];
    const size_t kv_n = size_t(NB) * BT * KVH * D;
    auto q = load<float>((dir + "/q").c_str(), size_t(B) * H * D);
    auto tables = load<int>((dir + "/tables").c_str(), size_t(B) * MAXB);
    auto lens = load<int>((dir + "/lens").c_str(), B);
    std::vector<float> out(size_t(B) * H * D, -1.0f);
    std::vector<float> kf, vf;
    std::vector<unsigned short> kh, vh;
    if (half) {
        kh = load<unsigned short>((dir + "/k").c_str(), kv_n);
        vh = load<unsigned short>((dir + "/v").c_str(), kv_n);
    } else {
        kf = load<float>((dir + "/k").c_str(), kv_n);
        vf = load<float>((dir + "/v").c_str(), kv_n);
    }
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < H; ++h) {
            blockIdx.x = b;
            blockIdx.y = h;
            std::barrier<> bar(THREADS);
            block_barrier = &bar;
            std::vector<std::thread> threads;
            for (int t = 0; t < THREADS; ++t) {
                threads.emplace_back([&, t] {
                    threadIdx.x = t;
                    if (half)
                        paged_attn_f16(q.data(), kh.data(), vh.data(), tables.data(),
                                       lens.data(), out.data(), H, KVH, D, BT, MAXB, scale);
                    else
                        paged_attn_f32(q.data(), kf.data(), vf.data(), tables.data(),
                                       lens.data(), out.data(), H, KVH, D, BT, MAXB, scale);
                });
            }
            for (auto& th : threads) th.join();
        }
    }
    FILE* f = std::fopen((dir + "/out").c_str(), "wb");
    std::fwrite(out.data(), sizeof(float), out.size(), f);
    std::fclose(f);
    return 0;
}
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CUDA kernel source built as a host program (skips without g++)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not installed; the CPU emulation of the CUDA kernel needs it")
    work = tmp_path_factory.mktemp("kernel_emulation")
    src = _HARNESS.replace("__SOURCE__", gpu_kernels.kernel_source(half_to_float=_HOST_HALF))
    (work / "emulate.cpp").write_text(src, encoding="utf-8")
    binary = work / "emulate"
    subprocess.run(
        [gxx, "-std=c++20", "-O1", "-pthread", "-o", str(binary), str(work / "emulate.cpp")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return binary


@pytest.mark.parametrize(
    ("fmt", "kv_heads", "heads", "dim"), [("fp32", 2, 4, 64), ("fp16", 1, 2, 160)]
)
def test_cuda_kernel_source_emulated_on_cpu(
    emulator: Path, tmp_path: Path, fmt: str, kv_heads: int, heads: int, dim: int
) -> None:
    """Tile edges (31/32/33/65 tokens), an empty context, GQA, and head_dim > THREADS."""
    lens = [0, 1, 31, 32, 33, 65]
    host, _, tables, ks, vs = _stores(np, fmt, lens, 16, kv_heads, dim)
    q = np.random.default_rng(6).standard_normal((len(lens), heads, dim)).astype(np.float32)
    max_blocks = max(len(t) for t in tables)
    table = np.zeros((len(lens), max_blocks), dtype=np.int32)
    for b, t in enumerate(tables):
        table[b, : len(t)] = t
    k_data, v_data = host.raw(0)
    for name, arr in {
        "q": q,
        "k": k_data.view(np.uint16) if fmt == "fp16" else k_data,
        "v": v_data.view(np.uint16) if fmt == "fp16" else v_data,
        "tables": table,
        "lens": np.asarray(lens, dtype=np.int32),
    }.items():
        np.ascontiguousarray(arr).tofile(tmp_path / name)
    scale = 1.0 / np.sqrt(dim)
    args = [len(lens), heads, kv_heads, dim, 16, host.num_blocks, max_blocks]
    subprocess.run(
        [
            str(emulator),
            *map(str, args),
            repr(float(scale)),
            str(int(fmt == "fp16")),
            str(tmp_path),
        ],
        check=True,
        timeout=120,
    )
    got = np.fromfile(tmp_path / "out", dtype=np.float32).reshape(q.shape)
    want = paged_decode_attention(q, host, tables, lens, chunk_tokens=32)
    np.testing.assert_array_equal(got[0], 0)  # empty context
    assert rel_error(got, want, np) < 1e-5
    assert rel_error(got, dense_attention(q, ks, vs), np) < BOUND[fmt]
