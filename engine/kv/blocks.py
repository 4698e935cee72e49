"""The state of every block of a paged KV pool, the base of
:class:`engine.kv.allocator.KVBlockAllocator` (which adds the per-sequence block tables).

Data-agnostic: block ids, content keys and byte counts, never arrays. Every block id of the
pool (:class:`engine.kv.pool.BlockPool`) is in exactly one state:

* **used** -- ``ref[b] > 0``: held by ``ref[b]`` sequences (several only for shared prefixes);
* **cached** -- ``ref[b] == 0`` and the block has a content key: nobody holds it, but its KV is
  reusable by a later sequence with the same prefix; ranked for eviction by an
  :class:`engine.policy.EvictionPolicy` keyed by the block's content key;
* **free** -- ``ref[b] == 0`` and no key: on the free list.

So ``used + cached + free == pool size``. Invariant (kept in ``_take_block``, ``_drop`` and
``_evict``): **a block with refcount > 0 is never in the cached set or on the free list, is
never evicted and never handed out as a fresh block.** A block gets a key from
``_register`` and loses it only when evicted; an evicted block's content goes to the offload
tiers (:mod:`engine.kv.offload`) if there are any.

Taking a block when none is free grows the pool (geometric, up to the cap), else evicts the
cached block the policy ranks first. With ``record_moves`` the device<->offload moves are
logged for the real engine (:meth:`BlockStates.take_transfers`), and so are copy-on-write
copies, which the allocator makes (:meth:`BlockStates.take_copies`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass

from engine.cache import TierCache
from engine.kv.offload import OffloadChain
from engine.kv.pool import UNBOUNDED, BlockPool
from engine.kv.prefix import BlockKey
from engine.policy import EvictionPolicy


@dataclass
class KVStats:
    """Counters since construction. ``keyed_blocks`` = prompt blocks that had a content key."""

    allocations: int = 0
    keyed_blocks: int = 0
    hit_blocks: int = 0
    loaded_blocks: int = 0
    hit_tokens: int = 0
    loaded_tokens: int = 0
    evictions: int = 0
    preemptions: int = 0
    cow_copies: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        """(hit + loaded-back blocks) / keyed prompt blocks."""
        n = self.keyed_blocks
        return (self.hit_blocks + self.loaded_blocks) / n if n else 0.0


class BlockStates:
    """Used, cached and free blocks of ``pool``, each ``block_bytes`` bytes; see the module
    docstring.

    ``policy`` ranks the cached blocks (it is attached here with the pool's byte cap; sizes
    given to it are ``block_bytes``). ``offload_tiers`` are lower tiers, highest first.
    ``record_moves`` logs moves for :meth:`take_transfers` and :meth:`take_copies`. The
    constructor does no I/O.
    """

    def __init__(
        self,
        block_tokens: int,
        block_bytes: int,
        pool: BlockPool,
        policy: EvictionPolicy,
        offload_tiers: Sequence[TierCache] | None,
        record_moves: bool,
    ) -> None:
        #: tokens per block
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.record_moves = record_moves
        self._pool = pool
        self._policy = policy
        cap_blocks = pool.cap_blocks
        bounded_bytes = cap_blocks * block_bytes if cap_blocks < UNBOUNDED else UNBOUNDED
        policy.attach(bounded_bytes)
        self._offload = OffloadChain(offload_tiers) if offload_tiers else None
        # Hot-path aliases (the pool extends these lists in place when it grows). ``_refs`` is
        # the raw refcount list: while ``_ref_stale`` it may be out of date (see ``_ref``).
        self._refs: list[int] = pool.ref
        self._ref_stale = False
        self._free: list[int] = pool.free
        self._bkey: list[BlockKey | None] = [None] * pool.size  # block id -> content key
        self._kblock: dict[BlockKey, int] = {}  # content key -> block id (used or cached)
        self._copies: list[tuple[int, int]] = []
        self._transfers: list[tuple[str, BlockKey, int, str]] = []
        self.stats = KVStats()

    # -- refcounts ----------------------------------------------------------------------------
    @property
    def _ref(self) -> list[int]:
        """Refcount per block id, up to date (the pool's list, brought up to date in place).

        The fast paths taken while no block has a content key (so every held block has
        refcount 1 and none is cached) skip their per-block refcount writes and mark the list
        stale instead; everything else reads refcounts through this property, which then
        recounts them from the holders (:meth:`_held`). Lazy, not different: the refcounts
        read are always those the eager writes would have left."""
        if self._ref_stale:
            refs = self._refs
            refs[:] = [0] * len(refs)
            for table in self._held():
                for b in table:
                    refs[b] += 1
            self._ref_stale = False
        return self._refs

    def _held(self) -> Iterable[list[int]]:
        """The block tables holding blocks (one hold per entry); the allocator's tables."""
        return ()

    def _sequence_tables(self) -> list[tuple[Hashable, list[int], int]]:
        """Each live sequence's id, block table and token count, oldest first; the
        allocator's (none here)."""
        return []

    # -- queries ------------------------------------------------------------------------------
    @property
    def pool_blocks(self) -> int:
        return self._pool.size

    @property
    def cap_blocks(self) -> int:
        """Most blocks the pool may reach (``engine.kv.pool.UNBOUNDED`` when uncapped)."""
        return self._pool.cap_blocks

    @property
    def growth_history(self) -> list[int]:
        """Pool sizes so far, the initial one first."""
        return list(self._pool.growth_history)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._policy)

    @property
    def num_used_blocks(self) -> int:
        return self._pool.size - len(self._free) - len(self._policy)

    def refcount(self, block: int) -> int:
        return self._ref[block]

    def key_of(self, block: int) -> BlockKey | None:
        """The content key of ``block`` (``None`` if it has none)."""
        return self._bkey[block]

    def is_cached(self, block: int) -> bool:
        key = self._bkey[block]
        return key is not None and self._ref[block] == 0

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write copies ``(src, dst)`` since the last call; the engine copies the rows."""
        out, self._copies = self._copies, []
        return out

    def take_transfers(self) -> list[tuple[str, BlockKey, int, str]]:
        """Device<->offload moves since the last call, in order, for the engine to carry out.

        ``("offload", key, block, tier)``: copy block ``block`` out to ``tier`` under ``key``
        (before the block is rewritten: it is free again). ``("load", key, block, tier)``: copy
        ``key`` from ``tier`` into block ``block``. Moves between lower tiers are the tiers'
        own business (their ``TierCache`` evictions).
        """
        out, self._transfers = self._transfers, []
        return out

    # -- pool maintenance (also exposed for tests and the simulator) --------------------------
    def grow(self) -> int:
        """Grow the pool by one geometric step now; returns blocks added (0 at the cap)."""
        added = self._pool.grow()
        self._bkey.extend([None] * added)
        return added

    def evict_cached(self, n: int, now: float = 0.0) -> int:
        """Evict up to ``n`` cached blocks in policy order (offloading them); returns how many."""
        done = 0
        while done < n:
            key = self._policy.victim(now)
            if key is None:
                break
            self._evict(key, now)
            done += 1
        return done

    # -- transitions --------------------------------------------------------------------------
    def _take_block(self, now: float) -> int:
        """A block id with ref 0 and no key, off the free list. Caller checked availability."""
        free = self._free
        if not free:
            if self._pool.can_grow:
                self.grow()
            else:
                key = self._policy.victim(now)
                if key is None:
                    raise RuntimeError("allocator bug: no free, growable or cached block")
                self._evict(key, now)
        return free.pop()

    def _evict(self, key: BlockKey, now: float) -> None:
        """Evict cached ``key``: its block goes to the free list, its content to offload."""
        b = self._kblock.pop(key)
        # Invariant: only cached blocks (ref 0) are ever evicted.
        assert self._ref[b] == 0, f"evicting block {b} with refcount {self._ref[b]}"
        self._policy.remove(key, now, True)
        self._bkey[b] = None
        self._free.append(b)
        self.stats.evictions += 1
        if self._offload is not None:
            tier = self._offload.offer(key, self.block_bytes, now)
            if tier is not None and self.record_moves:
                self._transfers.append(("offload", key, b, self._offload.tiers[tier].name))

    def _register(self, b: int, key: BlockKey, now: float) -> None:
        """Give used block ``b`` the content ``key`` (any offloaded copy is now stale)."""
        self._bkey[b] = key
        self._kblock[key] = b
        if self._offload is not None:
            self._offload.discard(key, now)

    def _drop(self, table: list[int], now: float) -> None:
        """Release one hold on each block of ``table`` (a sequence's table, which it may
        reorder): a keyed block whose last holder this was becomes cached, an unkeyed one
        free."""
        free = self._free
        if not self._kblock:
            # Fast path (the simulator never passes keys). No block has a key, and a block is
            # shared (ref > 1) only if it has one (see the allocator's check_invariants), so
            # every block of ``table`` has ref 1 and goes to the free list -- in the same order
            # as the tail-first loop below would append them. Their refcounts (now 0) are
            # left to ``_ref`` to recount.
            self._ref_stale = True
            table.reverse()
            free.extend(table)
            return
        ref, bkey = self._ref, self._bkey
        size = self.block_bytes
        for b in reversed(table):  # tail first: the policy then evicts tails before heads
            r = ref[b] - 1
            ref[b] = r
            if r == 0:  # last holder gone: cached if it has a key, else free
                key = bkey[b]
                if key is None:
                    free.append(b)
                else:
                    self._policy.insert(key, size, now)

    # -- figures and invariants ----------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        """Fragmentation and traffic figures (R10, R20): one flat dict of numbers, ready for a
        time series (O(total table entries)). Keys:

        * pool: ``pool_blocks``, ``cap_blocks`` (0 = unbounded), ``used_blocks``,
          ``free_blocks``, ``cached_blocks`` (used + free + cached == pool), ``sequences``,
          ``growth_events``;
        * fragmentation: ``slot_waste_tokens`` -- token slots of used blocks that hold no
          token (the partial last blocks; a shared block counts once, filled as far as its
          fullest holder); ``slot_waste_fraction`` -- that over all token slots of used
          blocks; ``pool_free_fraction`` = free / pool blocks; ``pool_reclaimable_fraction``
          = (free + cached) / pool blocks; ``largest_contiguous_free_run`` -- longest run of
          consecutive free block ids;
        * bytes: ``block_bytes``, ``pool_bytes``, ``used_bytes``, ``cached_bytes``;
        * counters: ``prefix_hit_rate`` and every :class:`engine.kv.blocks.KVStats` field;
        * per offload tier ``<name>_bytes_in``, ``_bytes_out``, ``_bytes_loaded_back``,
          ``_bytes_dropped``, ``_blocks_loaded_back``, ``_resident_bytes``
          (see :mod:`engine.kv.offload`).
        """
        bt = self.block_tokens
        fill: dict[int, int] = {}
        tables = self._sequence_tables()
        for _, table, n in tables:
            for i, b in enumerate(table):
                f = min(bt, n - i * bt)
                if f > fill.get(b, -1):
                    fill[b] = f
        used = self.num_used_blocks
        waste = sum(bt - f for f in fill.values())
        pool = self.pool_blocks
        free = self.num_free_blocks
        cached = self.num_cached_blocks
        out: dict[str, float] = {
            "pool_blocks": pool,
            "cap_blocks": 0 if self.cap_blocks == UNBOUNDED else self.cap_blocks,
            "used_blocks": used,
            "free_blocks": free,
            "cached_blocks": cached,
            "sequences": len(tables),
            "growth_events": self._pool.growth_events,
            "slot_waste_tokens": waste,
            "slot_waste_fraction": waste / (used * bt) if used else 0.0,
            "pool_free_fraction": free / pool,
            "pool_reclaimable_fraction": (free + cached) / pool,
            "largest_contiguous_free_run": self._pool.largest_free_run(),
            "block_bytes": self.block_bytes,
            "pool_bytes": pool * self.block_bytes,
            "used_bytes": used * self.block_bytes,
            "cached_bytes": cached * self.block_bytes,
            "prefix_hit_rate": self.stats.prefix_hit_rate,
        }
        out.update(asdict(self.stats))
        if self._offload is not None:
            resident = self._offload.resident_bytes()
            for name, counters in self._offload.moved.items():
                for k, v in counters.items():
                    out[f"{name}_{k}"] = v
                out[f"{name}_resident_bytes"] = resident[name]
        return out

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (O(pool); for tests;
        explicit raises, so the check also runs under ``python -O``).

        Checked: pool size within the cap; each table as long as its tokens need, holding
        no block twice; refcount = number of tables holding the block; the free list without
        duplicates; the key maps inverse to each other; a used block never free nor cached, an
        idle unkeyed block free, an idle keyed block cached; used + free + cached == pool. And
        a block held by more than one sequence has a content key (sharing happens only
        through ``_kblock``; a key is dropped only by ``_evict``, at refcount 0):
        ``_drop``'s fast path relies on it.
        """
        ref, bkey, size = self._ref, self._bkey, self.pool_blocks
        _ensure(len(ref) == size == len(bkey) <= self.cap_blocks, "pool size / cap")
        holders = [0] * size
        for seq, table, n in self._sequence_tables():
            need = -(-n // self.block_tokens)
            _ensure(len(table) == need, f"{seq!r}: table length")
            _ensure(len(set(table)) == len(table), f"{seq!r} holds a block twice")
            for b in table:
                holders[b] += 1
        _ensure(holders == ref, "refcount != number of sequences holding the block")
        free = set(self._free)  # membership only
        _ensure(len(free) == len(self._free), "a block is on the free list twice")
        policy = self._policy
        for b in range(size):
            key = bkey[b]
            if key is not None:
                _ensure(self._kblock.get(key) == b, f"key map broken at block {b}")
            if ref[b] > 0:  # used: never free, never cached
                idle = b in free or (key is not None and key in policy)
                _ensure(not idle, f"used block {b} idle")
            elif key is None:
                _ensure(b in free, f"unkeyed idle block {b} is not free")
            else:
                _ensure(key in policy and b not in free, f"keyed idle block {b} is not cached")
        _ensure(len(self._kblock) == sum(k is not None for k in bkey), "key map has stale keys")
        used = sum(r > 0 for r in ref)
        _ensure(used == self.num_used_blocks, "used count")
        _ensure(used + len(self._free) + len(policy) == size, "used + free + cached != pool")
        for b, r in enumerate(ref):
            if r > 1 and bkey[b] is None:
                raise AssertionError(f"block {b} is shared by {r} sequences but has no key")


def _ensure(ok: bool, what: str) -> None:
    """Raise ``AssertionError`` for a broken allocator invariant ``what`` unless ``ok``."""
    if not ok:
        raise AssertionError(f"KV allocator invariant broken: {what}")
