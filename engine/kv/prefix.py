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

Never Python's ``hash()``: keys must be equal in the simulator, the engine and across runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from hashlib import blake2b

import numpy as np

from engine.errors import InputError

BlockKey = Hashable

#: parent digest of the first block.
ROOT = b"\x00" * 16
_DIGEST = 16


def num_blocks(num_tokens: int, block_tokens: int) -> int:
    """Blocks needed for ``num_tokens`` tokens (the last one may be partial)."""
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
