"""Content keys of KV blocks, for prefix sharing (data-agnostic, deterministic across processes).

Block ``i`` of a sequence covers token positions ``[i*B, min((i+1)*B, n))`` for block size ``B``
and ``n`` tokens. Its *key* identifies the KV content of those positions, which depends on every
token up to the end of the block, so keys are **chained**:

* from token ids: ``key_i = blake2b(key_{i-1} || tokens of block i as little-endian int64,
  digest_size=16)`` with ``key_{-1} = ROOT``. Two sequences get equal ``key_i`` iff their first
  ``min((i+1)*B, n)`` tokens are equal (up to a 128-bit collision). A partial last block hashes
  fewer tokens, so it never equals a full block's key.
* from given hash ids (Mooncake traces give one id per block of 512 tokens): Mooncake ids are
  already *prefix-unique* (equal ids mean equal content of the whole prefix), so by default the
  key of a full block is the id itself. With ``chained=True`` the ids are only trusted to name
  one block's own tokens and the key is ``blake2b(key_{i-1} || repr(id))``.
  A partial last block (``n`` not a multiple of ``B``) gets the key ``(id_key, tokens_in_block)``
  so that it can only match a block covering the same number of tokens.

* from a trace's block ids for a pool of *another* block size (:func:`trace_block_keys`): the
  trace names blocks of ``T`` tokens (Mooncake: 512), the pool has blocks of ``B`` tokens. A
  full pool block ``k`` ends at token ``e = (k+1)*B``; the trace block holding its last token is
  ``t = (e-1) // T`` and its key is ``(hash_ids[t], e - t*T)``: the id of that trace block and
  how far into it the pool block reaches. Because Mooncake ids are prefix-unique, the pair fixes
  the first ``e`` tokens, so two prompts get equal keys for block ``k`` exactly when their trace
  ids say the first ``e`` tokens are equal. This works for ``B < T`` (``T/B`` pool blocks per
  trace block), ``B == T`` and ``B > T`` alike. Only *full* pool blocks inside the ids' span get
  keys (a partial last block is never shared), as vLLM caches full blocks only.

Never Python's ``hash()``: keys must be equal in the simulator, the engine and across runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from hashlib import blake2b
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from engine.errors import InputError

#: an int, or an integer array (functions typed with it return the same kind)
IntOrArray = TypeVar("IntOrArray", int, np.ndarray)

if TYPE_CHECKING:
    pass

BlockKey = Hashable

#: parent digest of the first block.
ROOT = b"\x00" * 16
_DIGEST = 16


def num_blocks(num_tokens: IntOrArray, block_tokens: int) -> IntOrArray:
    """Blocks needed for ``num_tokens`` tokens (the last one may be partial); elementwise for an
    integer array."""
    return -(-num_tokens // block_tokens)


def token_block_keys(
    tokens: Sequence[int] | np.ndarray, block_tokens: int, parent: bytes = ROOT
) -> list[bytes]:
    """Chained keys of every block of ``tokens`` (including a partial last block)."""
    buf = np.asarray(tokens, dtype="<i8").tobytes()
    step = block_tokens * 8
    keys: list[bytes] = []
    prev = parent
    for start in range(0, len(buf), step):
        prev = blake2b(prev + buf[start : start + step], digest_size=_DIGEST).digest()
        keys.append(prev)
    return keys


def id_block_keys(
    hash_ids: Sequence[Hashable],
    num_tokens: int,
    block_tokens: int,
    chained: bool = False,
    source: str | None = None,
) -> list[BlockKey]:
    """Keys of the first ``len(hash_ids)`` blocks of a ``num_tokens``-token sequence.

    ``hash_ids[i]`` names block ``i``; there may be fewer ids than blocks (only a prefix is
    shareable) but not more (``InputError`` naming ``source``).
    """
    nb = num_blocks(num_tokens, block_tokens)
    if len(hash_ids) > nb:
        raise InputError(
            f"{len(hash_ids)} hash ids for {num_tokens} tokens, but {num_tokens} tokens fill only "
            f"{nb} block(s) of {block_tokens}; allowed: at most one hash id per block",
            source=source,
            where="hash_ids",
        )
    keys: list[BlockKey] = []
    prev = ROOT
    for i, hid in enumerate(hash_ids):
        if chained:
            prev = blake2b(prev + repr(hid).encode(), digest_size=_DIGEST).digest()
            key: BlockKey = prev
        else:
            key = hid
        covered = num_tokens - i * block_tokens
        if covered < block_tokens:  # partial last block: key carries its token count
            key = (key, covered)
        keys.append(key)
    return keys


def trace_block_keys(
    hash_ids: Sequence[int] | np.ndarray,
    num_tokens: int,
    block_tokens: int,
    trace_block_tokens: int,
    source: str | None = None,
) -> list[tuple[int, int]]:
    """Keys of the full ``block_tokens`` blocks of a ``num_tokens``-token prompt whose trace
    names its blocks of ``trace_block_tokens`` with ``hash_ids`` (see the module docstring).

    Returns one ``(hash id, tokens into that trace block)`` key per full pool block that ends
    inside the span the ids cover (``min(num_tokens, len(hash_ids) * trace_block_tokens)``
    tokens). More ids than trace blocks of the prompt is an ``InputError`` naming ``source``.
    """
    tb = trace_block_tokens
    if block_tokens < 1 or tb < 1:
        raise ValueError(f"block sizes must be >= 1, got {block_tokens} and {tb}")
    nids = len(hash_ids)
    if nids > num_blocks(num_tokens, tb):
        raise InputError(
            f"{nids} hash ids for {num_tokens} tokens, but {num_tokens} tokens fill only "
            f"{num_blocks(num_tokens, tb)} trace block(s) of {tb}; allowed: at most one hash id "
            "per trace block",
            source=source,
            where="hash_ids",
        )
    covered = min(num_tokens, nids * tb)
    ids = [int(h) for h in hash_ids]
    keys: list[tuple[int, int]] = []
    for end in range(block_tokens, covered + 1, block_tokens):
        t = (end - 1) // tb
        keys.append((ids[t], end - t * tb))
    return keys
