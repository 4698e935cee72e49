"""Paged KV cache: block allocator, admission rules, prefix keys, growable pool, offload,
chunked layout."""

from engine.kv.admission import KvAdmission, iteration_kind
from engine.kv.allocator import (
    ALLOWED_BLOCK_TOKENS,
    Allocation,
    KVBlockAllocator,
    KVOutOfBlocks,
    KVStats,
)
from engine.kv.attention import dense_attention, paged_decode_attention
from engine.kv.footprint import STORAGE_LAYOUTS, KvStorageModel, contiguous_regrowth
from engine.kv.longctx import (
    AttentionMemoryModel,
    chunk_spans,
    max_context_tokens,
    split_chunks,
    validate_chunk_tokens,
)
from engine.kv.offload import OffloadChain, make_offload_tiers
from engine.kv.pool import UNBOUNDED, BlockPool, growth_sequence, next_pool_size
from engine.kv.prefix import (
    ROOT,
    id_block_keys,
    num_blocks,
    token_block_keys,
    trace_block_keys,
)
from engine.kv.quant import FORMATS, GROUP_SIZES, KVFormat
from engine.kv.storage import KVLayout, KVStorage

__all__ = [
    "ALLOWED_BLOCK_TOKENS",
    "FORMATS",
    "GROUP_SIZES",
    "ROOT",
    "STORAGE_LAYOUTS",
    "UNBOUNDED",
    "Allocation",
    "AttentionMemoryModel",
    "BlockPool",
    "KVBlockAllocator",
    "KVFormat",
    "KVLayout",
    "KVOutOfBlocks",
    "KVStats",
    "KVStorage",
    "KvAdmission",
    "KvStorageModel",
    "OffloadChain",
    "chunk_spans",
    "contiguous_regrowth",
    "dense_attention",
    "growth_sequence",
    "id_block_keys",
    "iteration_kind",
    "make_offload_tiers",
    "max_context_tokens",
    "next_pool_size",
    "num_blocks",
    "paged_decode_attention",
    "split_chunks",
    "token_block_keys",
    "trace_block_keys",
    "validate_chunk_tokens",
]
