"""Paged decode attention (engine.kv.attention) against dense float64 attention.

Relative error: ||out - ref|| / ||ref||, Frobenius over the whole [batch, heads, head_dim]
output, ref = dense_attention on the original (unquantised) K and V in float64.

Data model: K, V i.i.d. N(0, 1); q i.i.d. N(0, Q_STD^2) with the default 1/sqrt(head_dim)
softmax scale, so the logits have standard deviation Q_STD. The quantised error depends on how
sharp the attention is (key errors move the logits): with Q_STD = 0.5 int4 group 64 gives about
0.10 and int8 about 0.006; with Q_STD = 1 int4 gives about 0.125 (over the issue's 0.12 bound)
while int8 stays about 0.008 (test_int8_bound_holds_for_unit_logits). benchmarks/kv.py prints
the whole table.

Two checks per case: (1) against dense float64 attention over the K/V the store decodes to -
paging, chunking, the online softmax and on-the-fly dequantisation must be exact to 1e-5 for
every format; (2) against dense float64 attention over the original K/V - the format's bound.
A single short sequence with one KV head is a noisy sample of the int4 error (mean 0.10,
sample std about 0.01 measured over 300 draws), so the int4 must-show bound 0.12 is asserted
over batches of 8 sequences x 4 KV heads (test_int4_group64_bound_over_batches); single
Hypothesis examples hold int4 to 0.15.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from engine.kv.attention import dense_attention, paged_decode_attention
from engine.kv.quant import rel_error
from engine.kv.storage import KVLayout, KVStorage

Q_STD = 0.5
BOUND = {"fp32": 1e-5, "fp16": 2e-3, "int8": 1e-2, "int4": 0.12}
SINGLE_SAMPLE_BOUND = {**BOUND, "int4": 0.15}
# chunked vs unchunked: same data, only the float32 accumulation order differs (the error of
# a float32 sum over n terms grows like sqrt(n) * 6e-8; 16K tokens measure about 1.2e-6)
CHUNK_TOL = 5e-6


def _build(
    fmt: str,
    lens: list[int],
    *,
    block_tokens: int,
    kv_heads: int,
    head_dim: int,
    group: int = 64,
    seed: int = 0,
    split_writes: bool = True,
) -> tuple[KVStorage, list[list[int]], list[np.ndarray], list[np.ndarray]]:
    """A store holding one sequence per length, blocks scattered by a random permutation."""
    rng = np.random.default_rng(seed)
    need = [-(-n // block_tokens) for n in lens]
    store = KVStorage(KVLayout(1, block_tokens, kv_heads, head_dim, fmt, group), sum(need) + 2, np)
    perm = rng.permutation(store.num_blocks).tolist()
    tables, ks, vs = [], [], []
    for n, nb in zip(lens, need, strict=True):
        table, perm = perm[:nb], perm[nb:]
        k = rng.standard_normal((n, kv_heads, head_dim)).astype(np.float32)
        v = rng.standard_normal((n, kv_heads, head_dim)).astype(np.float32)
        cut = n // 3 if split_writes else n  # prefill then a second write, as decode would
        store.write_tokens(0, table, 0, k[:cut], v[:cut])
        store.write_tokens(0, table, cut, k[cut:], v[cut:])
        tables.append(table)
        ks.append(k)
        vs.append(v)
    return store, tables, ks, vs


def _decoded(
    store: KVStorage, tables: list[list[int]], lens: list[int]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each sequence's K and V as the store decodes them, [len, kv_heads, head_dim]."""
    ks, vs = [], []
    for table, n in zip(tables, lens, strict=True):
        k, v = store.read(0, table)
        ks.append(k.reshape(-1, *k.shape[2:])[:n])
        vs.append(v.reshape(-1, *v.shape[2:])[:n])
    return ks, vs


def _query(batch: int, heads: int, head_dim: int, seed: int, std: float = Q_STD) -> np.ndarray:
    rng = np.random.default_rng(seed + 1000)
    return (std * rng.standard_normal((batch, heads, head_dim))).astype(np.float32)


lengths = st.one_of(st.integers(1, 80), st.integers(1, 2048))


@settings(max_examples=30)
@given(
    fmt=st.sampled_from(["fp32", "fp16", "int8", "int4"]),
    lens=st.lists(lengths, min_size=1, max_size=4),
    block_tokens=st.sampled_from([8, 16, 32, 64, 128]),
    chunk_blocks=st.one_of(st.none(), st.integers(1, 8)),
    kv_heads=st.sampled_from([1, 2]),
    q_per_kv=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([64, 128]),
    seed=st.integers(0, 2**16),
)
def test_paged_equals_dense_and_chunked_equals_unchunked(
    fmt: str,
    lens: list[int],
    block_tokens: int,
    chunk_blocks: int | None,
    kv_heads: int,
    q_per_kv: int,
    head_dim: int,
    seed: int,
) -> None:
    store, tables, ks, vs = _build(
        fmt, lens, block_tokens=block_tokens, kv_heads=kv_heads, head_dim=head_dim, seed=seed
    )
    q = _query(len(lens), kv_heads * q_per_kv, head_dim, seed)
    chunk = None if chunk_blocks is None else chunk_blocks * block_tokens
    out = paged_decode_attention(q, store, tables, lens, chunk_tokens=chunk)
    assert out.shape == q.shape and out.dtype == np.float32
    decoded_k, decoded_v = _decoded(store, tables, lens)
    assert rel_error(out, dense_attention(q, decoded_k, decoded_v), np) < 1e-5
    assert rel_error(out, dense_attention(q, ks, vs), np) < SINGLE_SAMPLE_BOUND[fmt]
    whole = paged_decode_attention(q, store, tables, lens, chunk_tokens=None)
    assert rel_error(out, whole, np) < CHUNK_TOL
    # one sequence per step (sub-batches with non-contiguous active sets) changes nothing
    stepped = paged_decode_attention(q, store, tables, lens, chunk_tokens=chunk, step_bytes=1)
    np.testing.assert_allclose(stepped, out, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_long_context_16k(fmt: str) -> None:
    """16K tokens (and a shorter neighbour) in 512-token chunks, equal to dense and unchunked."""
    lens = [16384, 5000]
    store, tables, ks, vs = _build(fmt, lens, block_tokens=64, kv_heads=1, head_dim=64, seed=5)
    q = _query(2, 4, 64, 5)
    out = paged_decode_attention(q, store, tables, lens, chunk_tokens=512)
    assert rel_error(out, dense_attention(q, ks, vs), np) < BOUND[fmt]
    whole = paged_decode_attention(q, store, tables, lens)
    assert rel_error(out, whole, np) < CHUNK_TOL


@pytest.mark.parametrize(
    ("block_tokens", "chunk", "seed"), [(16, 128, 1), (64, 512, 2), (128, None, 3)]
)
def test_int4_group64_bound_over_batches(block_tokens: int, chunk: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lens = [16384 if seed == 2 else 4096, *rng.integers(1, 4096, size=7).tolist()]
    store, tables, ks, vs = _build(
        "int4", lens, block_tokens=block_tokens, kv_heads=4, head_dim=64, seed=seed
    )
    q = _query(8, 8, 64, seed)
    out = paged_decode_attention(q, store, tables, lens, chunk_tokens=chunk)
    assert rel_error(out, dense_attention(q, ks, vs), np) < BOUND["int4"]


def test_int8_bound_holds_for_unit_logits() -> None:
    lens = [4096, 700, 33]
    store, tables, ks, vs = _build("int8", lens, block_tokens=64, kv_heads=2, head_dim=128)
    q = _query(3, 8, 128, 9, std=1.0)
    out = paged_decode_attention(q, store, tables, lens, chunk_tokens=512)
    assert rel_error(out, dense_attention(q, ks, vs), np) < 1e-2


def test_batch_equals_one_sequence_at_a_time() -> None:
    """Masking and the active-sequence subset give each sequence exactly its own answer."""
    lens = [1, 130, 700, 64]
    store, tables, _, _ = _build("int4", lens, block_tokens=32, kv_heads=2, head_dim=64)
    q = _query(4, 4, 64, 2)
    batched = paged_decode_attention(q, store, tables, lens, chunk_tokens=128)
    for b, n in enumerate(lens):
        alone = paged_decode_attention(q[b : b + 1], store, [tables[b]], [n], chunk_tokens=128)
        np.testing.assert_allclose(batched[b], alone[0], rtol=1e-6, atol=1e-7)


def test_single_token_context_returns_its_value() -> None:
    store, tables, _, vs = _build("fp32", [1], block_tokens=8, kv_heads=1, head_dim=64)
    q = _query(1, 2, 64, 0)
    out = paged_decode_attention(q, store, tables, [1], chunk_tokens=8)
    np.testing.assert_allclose(out[0], np.repeat(vs[0][0], 2, axis=0), rtol=1e-6)


def test_empty_context_gives_zeros_and_scale_is_used() -> None:
    store, tables, ks, vs = _build("fp32", [40], block_tokens=8, kv_heads=1, head_dim=64)
    q = _query(2, 1, 64, 3)
    out = paged_decode_attention(q, store, [tables[0], []], [40, 0], scale=0.3)
    np.testing.assert_array_equal(out[1], 0)
    ref = dense_attention(q[:1], ks, vs, scale=0.3)
    assert rel_error(out[:1], ref, np) < 1e-5
    assert rel_error(out[:1], dense_attention(q[:1], ks, vs), np) > 1e-3


def test_bad_arguments_are_refused() -> None:
    store, tables, _, _ = _build("fp32", [20], block_tokens=8, kv_heads=2, head_dim=64)
    q = _query(1, 4, 64, 0)
    with pytest.raises(InputError, match=r"chunk_tokens 12.*multiple of block_tokens \(8\)"):
        paged_decode_attention(q, store, tables, [20], chunk_tokens=12)
    with pytest.raises(InputError, match=r"heads 3 is not a multiple of kv_heads 2"):
        paged_decode_attention(_query(1, 3, 64, 0), store, tables, [20])
    with pytest.raises(ValueError, match="need 3 blocks"):
        paged_decode_attention(q, store, [tables[0][:2]], [20])
    with pytest.raises(ValueError, match="batch 1 needs 1"):
        paged_decode_attention(q, store, tables, [20, 3])


def test_against_torch_sdpa() -> None:
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("torch.nn.functional")
    lens = [300, 1025, 64]
    store, tables, ks, vs = _build("fp32", lens, block_tokens=16, kv_heads=2, head_dim=64)
    q = _query(3, 8, 64, 4, std=1.0)
    out = paged_decode_attention(q, store, tables, lens, chunk_tokens=256)
    ref = np.empty_like(out)
    for b in range(3):
        qt = torch.from_numpy(q[b][None, :, None, :])  # [1, heads, 1, dim]
        kt = torch.from_numpy(ks[b]).permute(1, 0, 2).repeat_interleave(4, dim=0)[None]
        vt = torch.from_numpy(vs[b]).permute(1, 0, 2).repeat_interleave(4, dim=0)[None]
        ref[b] = functional.scaled_dot_product_attention(qt, kt, vt)[0, :, 0, :].numpy()
    assert rel_error(out, ref, np) < 1e-5


def test_padded_table_array_and_bad_block_ids() -> None:
    """A [batch, width] table padded with -1 after each sequence's blocks is accepted (padding
    is never read); an out-of-range id inside the used part is refused before any read."""
    lens = [20, 3]
    store, tables, ks, vs = _build("fp32", lens, block_tokens=8, kv_heads=1, head_dim=64)
    padded = np.full((2, 5), -1, dtype=np.int64)
    for b, t in enumerate(tables):
        padded[b, : len(t)] = t
    q = _query(2, 2, 64, 1)
    out = paged_decode_attention(q, store, padded, lens, chunk_tokens=16)
    assert rel_error(out, dense_attention(q, ks, vs), np) < 1e-5
    padded[1, 0] = store.num_blocks
    with pytest.raises(IndexError, match=f"block id {store.num_blocks}"):
        paged_decode_attention(q, store, padded, lens)
