"""Paged KV block allocator with prefix sharing, cached blocks, preemption and offload (R9, R10).

Data-agnostic: it deals in block ids, token counts and content keys, never arrays, so the
simulator and the real engine run the same allocator (the engine maps block ids to array rows).

Blocks are used, cached or free, and the invariant that a block held by a sequence is never
cached, free, evicted or handed out again is kept by the base class
(:class:`engine.kv.blocks.BlockStates`, with the counters :class:`engine.kv.blocks.KVStats`);
this module adds the per-sequence block tables.

Prefix sharing: blocks have content keys (:mod:`engine.kv.prefix`) computed from token ids or
given hash ids. ``allocate`` walks the prompt's keys from the start: a key held by a pool block
is a *hit* (refcount + 1; a cached block leaves the cached set), a key held by an offload tier
is a *load-back* (a fresh block, the tier's copy is taken), and the first key found nowhere
ends the shared prefix. The remaining blocks are fresh and their keys are registered at once
(a sequence that reuses them is assumed to wait for, or to be scheduled after, their prefill).
A partial last block may be shared too; a sequence appending into a *shared* partial last
block gets a private copy first (copy-on-write, reported by :meth:`take_copies`). A key vouches
only for the tokens it covers, so the sole holder of a keyed partial block appends in place.

Running out of blocks: take a free block; else grow the pool (geometric, up to the byte cap);
else evict a cached block (to the offload tiers if any); else ``on_full``: ``"fail"`` raises
:class:`KVOutOfBlocks` and changes nothing, ``"preempt"`` frees the most recently started
sequences (vLLM-style recompute preemption) until the request fits and reports them.
A preempted sequence is released like ``free``: its keyed blocks become cached, so under
further pressure they are evicted to the offload tiers and can be loaded back when the
sequence is resubmitted; its unkeyed (decoded) blocks are recomputed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np

from engine.cache import TierCache
from engine.errors import InputError, KVOutOfBlocks
from engine.kv.blocks import BlockStates, KVStats
from engine.kv.longctx import DEFAULT_CHUNK_TOKENS, split_chunks, validate_chunk_tokens
from engine.kv.pool import UNBOUNDED, BlockPool
from engine.kv.prefix import BlockKey, id_block_keys, token_block_keys
from engine.policy import make_policy
from engine.units import parse_size

__all__ = [
    "ALLOWED_BLOCK_TOKENS",
    "Allocation",
    "KVBlockAllocator",
    "KVOutOfBlocks",
    "KVStats",
    "OnFull",
    "SeqId",
]

#: the block sizes (tokens) accepted: powers of two from 8 to 512.
ALLOWED_BLOCK_TOKENS: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)

SeqId = Hashable
OnFull = Literal["fail", "preempt"]


class Allocation(NamedTuple):
    """What ``allocate`` did: prefix tokens found in the pool / loaded back, and preemptions.

    ``hit_tokens + loaded_tokens`` may equal the whole prompt; whether to recompute the last
    token anyway (for its logits) is the caller's choice.
    """

    hit_tokens: int
    loaded_tokens: int
    preempted: tuple[SeqId, ...]


_NOTHING = Allocation(0, 0, ())


class KVBlockAllocator(BlockStates):
    """Per-sequence block tables over a growable pool; see the module docstring.

    ``block_tokens``: one of :data:`ALLOWED_BLOCK_TOKENS`. ``bytes_per_token``: KV bytes of one
    token (all layers, K and V); a block holds ``block_bytes = block_tokens * bytes_per_token``.
    ``max_bytes`` (int or a size like ``"4GiB"``; ``None`` = unbounded) caps the pool at
    ``max_bytes // block_bytes`` blocks. ``cached_policy`` names the eviction policy that ranks
    cached blocks (sizes given to it are ``block_bytes``). ``offload_tiers`` are lower tiers,
    highest first (see :mod:`engine.kv.offload`). ``chain_hash_ids``: see
    :func:`engine.kv.prefix.id_block_keys`. ``chunk_tokens`` is the chunk of :meth:`chunks`.
    ``record_moves`` logs copy-on-write copies and offload/load-back moves for the real engine
    (:meth:`take_copies`, :meth:`take_transfers`); the simulator leaves it off (no log grows).
    The constructor does no I/O.
    """

    def __init__(
        self,
        block_tokens: int = 64,
        bytes_per_token: int = 1,
        initial_blocks: int = 16,
        growth: float = 1.5,
        max_bytes: int | str | None = None,
        cached_policy: str = "lru",
        offload_tiers: Sequence[TierCache] | None = None,
        on_full: OnFull = "fail",
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        chain_hash_ids: bool = False,
        policy_params: dict[str, object] | None = None,
        record_moves: bool = False,
    ) -> None:
        if type(block_tokens) is not int or block_tokens not in ALLOWED_BLOCK_TOKENS:
            allowed = ", ".join(map(str, ALLOWED_BLOCK_TOKENS))
            raise InputError(
                f"block_tokens={block_tokens!r} is not allowed; allowed: {allowed}",
                where="block_tokens",
            )
        if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, int | np.integer):
            raise InputError(f"bytes_per_token must be an int, got {bytes_per_token!r}")
        if bytes_per_token < 1:
            raise InputError(f"bytes_per_token must be >= 1, got {bytes_per_token}")
        if on_full not in ("fail", "preempt"):
            raise InputError(f"on_full={on_full!r} is not allowed; allowed: fail, preempt")
        self.bytes_per_token = int(bytes_per_token)
        self.block_bytes = block_tokens * self.bytes_per_token
        if max_bytes is None:
            cap_blocks = UNBOUNDED
        else:
            try:
                cap = parse_size(max_bytes)
            except ValueError as err:
                raise InputError(str(err), where="max_bytes") from None
            cap_blocks = cap // self.block_bytes
            if cap_blocks < 1:
                raise InputError(
                    f"max_bytes={max_bytes!r} is smaller than one block of {self.block_bytes} B",
                    where="max_bytes",
                )
        self.on_full: OnFull = on_full
        self.chunk_tokens = validate_chunk_tokens(chunk_tokens, block_tokens)
        self.chain_hash_ids = chain_hash_ids
        pool = BlockPool(initial_blocks, growth, cap_blocks)
        policy = make_policy(cached_policy, **(policy_params or {}))
        super().__init__(block_tokens, self.block_bytes, pool, policy, offload_tiers, record_moves)
        self._tables: dict[SeqId, list[int]] = {}  # insertion order = start order
        self._ntok: dict[SeqId, int] = {}

    def _held(self) -> Iterable[list[int]]:
        return self._tables.values()

    def _sequence_tables(self) -> list[tuple[SeqId, list[int], int]]:
        return [(seq, table, self._ntok[seq]) for seq, table in self._tables.items()]

    # -- queries ------------------------------------------------------------------------------
    def sequences(self) -> list[SeqId]:
        """Live sequence ids, oldest start first."""
        return list(self._tables)

    def block_table(self, seq_id: SeqId) -> list[int]:
        """A copy of ``seq_id``'s block table (block ``i`` holds tokens ``[i*B, (i+1)*B)``)."""
        return list(self._tables[seq_id])

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._ntok[seq_id]

    def shared_prefix(self, num_tokens: int, hash_ids: Sequence[Hashable]) -> list[int]:
        """Pool blocks that ``allocate(seq, num_tokens, hash_ids=hash_ids)`` would share now
        (the longest prefix of the prompt's keys held by used or cached blocks), without
        changing anything. Prefix blocks held only by an offload tier end the list (they
        would be loaded, not shared)."""
        keys = id_block_keys(hash_ids, num_tokens, self.block_tokens, self.chain_hash_ids)
        plan, _ = self._plan(keys)  # allocate's own matching rule, read-only
        for i, b in enumerate(plan):
            if b < 0:
                return plan[:i]
        return plan

    def chunks(self, seq_id: SeqId) -> list[list[int]]:
        """``seq_id``'s block table split into chunks of ``chunk_tokens`` (R12)."""
        return split_chunks(self._tables[seq_id], self.block_tokens, self.chunk_tokens)

    # -- allocation ---------------------------------------------------------------------------
    def allocate(
        self,
        seq_id: SeqId,
        tokens: int | Sequence[int] | np.ndarray,
        hash_ids: Sequence[Hashable] | None = None,
        now: float = 0.0,
    ) -> Allocation:
        """Give a new sequence blocks for its prompt, reusing prefix blocks where keys match.

        ``tokens`` is the prompt's token ids (keys are chained hashes of them) or just its
        length (then only ``hash_ids`` give keys; with neither, nothing is shared).
        When both are given, ``hash_ids`` give the keys.
        Raises :class:`KVOutOfBlocks` (state unchanged) when it cannot fit under
        ``on_full="fail"``, or when the prompt alone exceeds the pool cap.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks; free it first")
        bt = self.block_tokens
        keys: list[BlockKey] | None = None
        if type(tokens) is int or isinstance(tokens, int | np.integer):
            n = int(tokens)
            if n < 0:
                raise ValueError(f"sequence {seq_id!r}: negative token count {n}")
        else:
            n = len(tokens)
            if hash_ids is None:
                keys = list(token_block_keys(tokens, bt))
        if hash_ids is not None:
            keys = id_block_keys(hash_ids, n, bt, self.chain_hash_ids)
        nb = -(-n // bt)
        free = self._free
        if not keys and nb <= len(free):  # fast path: nothing to share, enough free blocks
            table = free[len(free) - nb :]
            del free[len(free) - nb :]
            table.reverse()  # top of the stack first: ascending ids from a fresh pool
            if self._kblock:
                ref = self._ref
                for b in table:
                    ref[b] = 1
            else:  # no key anywhere: refcounts are recounted when read (BlockStates._ref)
                self._ref_stale = True
            self._tables[seq_id] = table
            self._ntok[seq_id] = n
            self.stats.allocations += 1
            return _NOTHING
        return self._allocate_general(seq_id, n, nb, keys or [], now)

    def _plan(self, keys: list[BlockKey]) -> tuple[list[int], int]:
        """Matched prefix: pool block per key (``-1`` = load back), and how many are cached."""
        plan: list[int] = []
        seen: set[int] = set()  # membership only, never iterated
        cached = 0
        kblock, ref, offload = self._kblock, self._ref, self._offload
        for key in keys:
            b = kblock.get(key)
            if b is not None:
                if b in seen:
                    break  # a key repeated inside one prompt: stop sharing there
                seen.add(b)
                if ref[b] == 0:
                    cached += 1
                plan.append(b)
            elif offload is not None and offload.locate(key) is not None:
                if key in keys[: len(plan)]:
                    break
                plan.append(-1)
            else:
                break
        return plan, cached

    def _allocate_general(
        self, seq_id: SeqId, n: int, nb: int, keys: list[BlockKey], now: float
    ) -> Allocation:
        pool = self._pool
        if nb > pool.cap_blocks:
            raise KVOutOfBlocks(
                f"sequence {seq_id!r} needs {nb} blocks; the pool cap is {pool.cap_blocks}",
                nb,
                pool.cap_blocks,
            )
        preempted: list[SeqId] = []
        while True:
            plan, cached_matched = self._plan(keys)
            in_pool = len(plan) - plan.count(-1)
            fresh = nb - in_pool
            available = len(self._free) + pool.headroom + len(self._policy) - cached_matched
            if fresh <= available:
                break
            if self.on_full == "fail" or not self._tables:
                raise KVOutOfBlocks(
                    f"sequence {seq_id!r} needs {fresh} new blocks; {available} are free, "
                    f"growable or evictable",
                    fresh,
                    available,
                )
            preempted.append(self._preempt_newest(now))
        # Execute. First claim the matched pool blocks, so no eviction below can touch them.
        bt, ref, policy = self.block_tokens, self._ref, self._policy
        table: list[int] = []
        hit_tokens = loaded_tokens = hit_blocks = loaded_blocks = 0
        loads: list[int] = []
        load_tiers: list[str] = []
        for i, b in enumerate(plan):
            covered = min(bt, n - i * bt)
            if b >= 0:
                if ref[b] == 0:  # cached -> used: leaves the cached set before it is held
                    policy.remove(keys[i], now, False)
                ref[b] += 1
                hit_tokens += covered
                hit_blocks += 1
            else:
                assert self._offload is not None
                tier = self._offload.take(keys[i], now)  # before any eviction can push it out
                assert tier is not None
                loads.append(i)
                load_tiers.append(self._offload.tiers[tier].name)
                loaded_tokens += covered
                loaded_blocks += 1
            table.append(b)
        for i, tier_name in zip(loads, load_tiers, strict=True):
            table[i] = self._take_block(now)
            ref[table[i]] = 1
            self._register(table[i], keys[i], now)
            if self.record_moves:
                self._transfers.append(("load", keys[i], table[i], tier_name))
        for i in range(len(plan), nb):
            b = self._take_block(now)
            ref[b] = 1
            table.append(b)
            if i < len(keys) and keys[i] not in self._kblock:
                self._register(b, keys[i], now)
        self._tables[seq_id] = table
        self._ntok[seq_id] = n
        st = self.stats
        st.allocations += 1
        st.keyed_blocks += len(keys)
        st.hit_blocks += hit_blocks
        st.loaded_blocks += loaded_blocks
        st.hit_tokens += hit_tokens
        st.loaded_tokens += loaded_tokens
        if not (hit_tokens or loaded_tokens or preempted):
            return _NOTHING
        return Allocation(hit_tokens, loaded_tokens, tuple(preempted))

    def append(self, seq_id: SeqId, n_tokens: int = 1, now: float = 0.0) -> tuple[SeqId, ...]:
        """Add ``n_tokens`` decoded tokens to ``seq_id``; returns the sequences preempted.

        A new block is taken when the last one fills. If ``seq_id`` itself is preempted (it was
        the most recently started) it is in the returned tuple and was not extended.
        Raises :class:`KVOutOfBlocks` (state unchanged) when out of blocks under ``"fail"``.
        """
        if n_tokens < 0:
            raise ValueError(f"sequence {seq_id!r}: cannot append {n_tokens} tokens")
        table = self._tables[seq_id]
        old = self._ntok[seq_id]
        new = old + n_tokens
        bt = self.block_tokens
        grow_by = -(-new // bt) - len(table)
        lazy = not self._kblock  # no key anywhere: no sharing, so no copy-on-write
        cow = not lazy and n_tokens > 0 and old % bt != 0 and self._ref[table[-1]] > 1
        if not cow and grow_by <= len(self._free):  # fast path
            free = self._free
            if lazy:  # refcounts are recounted when read (BlockStates._ref)
                self._ref_stale = self._ref_stale or grow_by > 0
                for _ in range(grow_by):
                    table.append(free.pop())
            else:
                ref = self._ref
                for _ in range(grow_by):
                    b = free.pop()
                    ref[b] = 1
                    table.append(b)
            self._ntok[seq_id] = new
            return ()
        ref = self._ref
        preempted: list[SeqId] = []
        while True:
            need = grow_by + cow
            available = len(self._free) + self._pool.headroom + len(self._policy)
            if need <= available:
                break
            if self.on_full == "fail":
                raise KVOutOfBlocks(
                    f"sequence {seq_id!r} needs {need} new blocks to append {n_tokens} tokens; "
                    f"{available} are free, growable or evictable",
                    need,
                    available,
                )
            victim = self._preempt_newest(now)
            preempted.append(victim)
            if victim == seq_id:
                return tuple(preempted)
            cow = n_tokens > 0 and old % bt != 0 and ref[table[-1]] > 1
        if cow:  # the shared partial last block gets a private copy before it is written
            src = table[-1]
            dst = self._take_block(now)
            ref[dst] = 1
            ref[src] -= 1  # still > 0: another sequence holds it
            table[-1] = dst
            if self.record_moves:
                self._copies.append((src, dst))
            self.stats.cow_copies += 1
        for _ in range(grow_by):
            b = self._take_block(now)
            ref[b] = 1
            table.append(b)
        self._ntok[seq_id] = new
        return tuple(preempted)

    def append_many(
        self, items: Sequence[tuple[SeqId, int]], now: float = 0.0
    ) -> tuple[SeqId, ...]:
        """``append(seq_id, n_tokens, now)`` for each ``(seq_id, n_tokens)`` of ``items``, in
        order, as one call; returns the sequences preempted (in order).

        The same state as those calls in every case (a :class:`KVOutOfBlocks` leaves the items
        before the failing one appended). Fast path while no block has a content key (so no
        copy-on-write) and the free list holds each item's new blocks: no per-item call.
        """
        if self._kblock:
            return tuple(p for s, n in items for p in self.append(s, n, now))
        # no key anywhere: refcounts are recounted when read (BlockStates._ref)
        self._ref_stale = True
        tables, ntok, free = self._tables, self._ntok, self._free
        bt = self.block_tokens
        pop = free.pop
        for i, (seq_id, n_tokens) in enumerate(items):
            if n_tokens < 0:
                raise ValueError(f"sequence {seq_id!r}: cannot append {n_tokens} tokens")
            table = tables[seq_id]
            new = ntok[seq_id] + n_tokens
            grow_by = -(-new // bt) - len(table)
            if grow_by == 1 and free:  # the common case: one boundary crossed
                table.append(pop())
            elif grow_by > 0:
                if grow_by > len(free):  # pool growth, eviction or preemption: general path
                    return tuple(p for s, n in items[i:] for p in self.append(s, n, now))
                for _ in range(grow_by):
                    table.append(pop())
            ntok[seq_id] = new
        return ()

    def extend_to(
        self, seq_ids: Iterable[SeqId], base: Mapping[SeqId, int], step: int, now: float = 0.0
    ) -> tuple[SeqId, ...]:
        """``append_many([(s, base[s] + step - num_tokens(s)) for s in seq_ids], now)``: each
        of ``seq_ids`` grows to ``base[s] + step`` tokens (never fewer than it holds), in
        order, without building the items; returns the sequences preempted (in order).

        Fast path as :meth:`append_many`'s; a sequence that takes one block there needs no
        check that it grows (its new count needs more blocks than it holds)."""
        if self._kblock:
            return tuple(
                p for s in seq_ids for p in self.append(s, base[s] + step - self._ntok[s], now)
            )
        # no key anywhere: refcounts are recounted when read (BlockStates._ref)
        self._ref_stale = True
        tables, ntok, free = self._tables, self._ntok, self._free
        bt = self.block_tokens
        pop = free.pop
        slow: list[SeqId] = []
        for s in seq_ids:
            new = base[s] + step
            if slow:  # pool growth, eviction or preemption: the general path from here on
                slow.append(s)
                continue
            table = tables[s]
            grow_by = -(-new // bt) - len(table)
            if grow_by == 1 and free:  # the common case: one boundary crossed
                table.append(pop())
            elif grow_by > 0 and grow_by <= len(free):
                for _ in range(grow_by):
                    table.append(pop())
            elif grow_by > 0:
                slow.append(s)
                continue
            elif new < ntok[s]:
                raise ValueError(f"sequence {s!r}: cannot shrink to {new} tokens")
            ntok[s] = new
        if not slow:
            return ()
        return tuple(p for s in slow for p in self.append(s, base[s] + step - ntok[s], now))

    def free(self, seq_id: SeqId, now: float = 0.0) -> None:
        """Release ``seq_id``'s blocks: keyed ones whose last holder this was become cached."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            raise KeyError(f"sequence {seq_id!r} has no blocks")
        del self._ntok[seq_id]
        self._drop(table, now)

    # -- internals ----------------------------------------------------------------------------
    def _preempt_newest(self, now: float) -> SeqId:
        """Release the most recently started sequence like ``free``; returns its id."""
        victim = next(reversed(self._tables))
        del self._ntok[victim]
        self._drop(self._tables.pop(victim), now)
        self.stats.preemptions += 1
        return victim

    # -- reporting ----------------------------------------------------------------------------
