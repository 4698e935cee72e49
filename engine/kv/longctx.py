"""Chunked long-context layout (R12) and the attention working-memory model it relies on.

A *chunk* is ``chunk_tokens`` consecutive tokens of one sequence (default 512), a whole number
of KV blocks. Attention walks a sequence's KV one chunk at a time (online softmax: running max
and running sum), so its working memory is O(chunk) instead of O(context).

Working-memory model (:class:`AttentionMemoryModel`), per device, for one sequence of ``L``
tokens and one layer at a time (layers run one after another and reuse the buffer):

* **resident KV** -- ``blocks(L) * block_tokens * kv_bytes_per_token`` (all layers, K and V, in
  the stored format, whole blocks), or, given a ``storage`` model
  (:class:`engine.kv.footprint.KvStorageModel`), the device bytes its layout reserves for
  ``L`` tokens (chunked storage, or one contiguous buffer regrown by 1.5x with its copies and
  fragments);
* **unchunked** attention gathers the whole sequence's K and V of one layer into one contiguous
  buffer (``L * gather_bytes_per_token``) and, for prefill, materialises the full ``L x L``
  score matrix (``L * L * score_bytes_per_pair``; ``score_bytes_per_pair`` = heads x 4 B for fp32
  scores); a decode step has one query, so ``1 x L`` scores;
* **chunked** attention holds one key chunk (``C * gather_bytes_per_token`` with
  ``C = min(L, chunk_tokens)``) and one score tile: ``C x C`` for prefill (queries also go one
  chunk at a time), ``1 x C`` for decode.

``peak = resident KV + working``; :meth:`AttentionMemoryModel.max_context` is the largest ``L``
whose peak fits a byte budget. Unchunked prefill is quadratic in ``L``, so it caps context early
(the "2K" of R12); chunked, context grows until the KV itself fills the budget ("16K+").
Example: a 7B-class model (32 layers, 32 heads of 128, fp16 KV = 512 KiB/token, fp32 scores
and gather) with a 10 GiB budget holds 7,232 tokens unchunked and 20,352 chunked (512-token
chunks, 64-token blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import InputError
from engine.kv.footprint import KvStorageModel

DEFAULT_CHUNK_TOKENS = 512


def validate_chunk_tokens(chunk_tokens: int, block_tokens: int) -> int:
    """Return ``chunk_tokens`` if it is a positive whole number of blocks, else ``InputError``."""
    if (
        isinstance(chunk_tokens, bool)
        or not isinstance(chunk_tokens, int)
        or chunk_tokens < block_tokens
        or chunk_tokens % block_tokens
    ):
        raise InputError(
            f"chunk_tokens={chunk_tokens!r} is not a whole number of {block_tokens}-token blocks; "
            f"allowed: a positive multiple of block_tokens ({block_tokens}, {2 * block_tokens}, "
            f"{4 * block_tokens}, ...)",
            where="chunk_tokens",
        )
    return chunk_tokens


def split_chunks(table: Sequence[int], block_tokens: int, chunk_tokens: int) -> list[list[int]]:
    """Split a block table into consecutive chunks of ``chunk_tokens // block_tokens`` blocks.

    Every chunk but the last is full; concatenating the chunks gives ``table`` back.
    """
    per = validate_chunk_tokens(chunk_tokens, block_tokens) // block_tokens
    return [list(table[i : i + per]) for i in range(0, len(table), per)]


def chunk_spans(num_tokens: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """Token ranges ``[start, end)`` of the chunks of a ``num_tokens``-token sequence."""
    return [(s, min(s + chunk_tokens, num_tokens)) for s in range(0, num_tokens, chunk_tokens)]


@dataclass(frozen=True)
class AttentionMemoryModel:
    """Peak device bytes of one sequence's attention, chunked or not (module docstring).

    ``kv_bytes_per_token``: stored K+V of one token over all layers. ``gather_bytes_per_token``:
    K+V of one token for one layer in the compute dtype (e.g. ``2 * kv_heads * head_dim * 4``).
    ``score_bytes_per_pair``: one query-key score for all heads of one layer (``heads * 4``).
    ``storage``: how the resident KV is laid out; ``None``: paged blocks of ``block_tokens``.
    """

    kv_bytes_per_token: int
    gather_bytes_per_token: int
    score_bytes_per_pair: int
    block_tokens: int = 64
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    storage: KvStorageModel | None = None

    def __post_init__(self) -> None:
        validate_chunk_tokens(self.chunk_tokens, self.block_tokens)
        if self.kv_bytes_per_token < 1:
            raise InputError(
                f"kv_bytes_per_token must be >= 1, got {self.kv_bytes_per_token}",
                where="kv_bytes_per_token",
            )
        for name in ("gather_bytes_per_token", "score_bytes_per_pair"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}", where=name)

    def kv_bytes(self, context: int) -> int:
        """Resident KV bytes of ``context`` tokens: whole blocks, or what ``storage`` reserves
        (non-decreasing in ``context``)."""
        if self.storage is not None:
            return self.storage.bytes(context, self.kv_bytes_per_token)
        bt = self.block_tokens
        return -(-context // bt) * bt * self.kv_bytes_per_token

    def working_bytes(self, context: int, chunked: bool, decode: bool = False) -> int:
        """Attention scratch bytes for ``context`` tokens (prefill, or one decode step)."""
        keys = min(context, self.chunk_tokens) if chunked else context
        queries = 1 if decode else keys
        return keys * self.gather_bytes_per_token + queries * keys * self.score_bytes_per_pair

    def peak_bytes(self, context: int, chunked: bool, decode: bool = False) -> int:
        """Resident KV plus attention scratch."""
        return self.kv_bytes(context) + self.working_bytes(context, chunked, decode)

    def max_context(self, budget_bytes: int, chunked: bool, decode: bool = False) -> int:
        """Largest context (tokens) whose peak fits ``budget_bytes``; 0 if not even one token."""
        if self.peak_bytes(1, chunked, decode) > budget_bytes:
            return 0
        lo, hi = 1, 2
        while self.peak_bytes(hi, chunked, decode) <= budget_bytes:  # peak grows with context
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # invariant: peak(lo) fits, peak(hi) does not
            mid = (lo + hi) // 2
            if self.peak_bytes(mid, chunked, decode) <= budget_bytes:
                lo = mid
            else:
                hi = mid
        return lo


def max_context_tokens(
    budget_bytes: int, model: AttentionMemoryModel, chunked: bool = True, decode: bool = False
) -> int:
    """Largest context a device budget holds under ``model`` (see the module docstring)."""
    return model.max_context(budget_bytes, chunked, decode)
