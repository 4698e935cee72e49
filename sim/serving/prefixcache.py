"""Prefix caching in a replica: prompt KV blocks named by the trace's block hash ids are kept
and shared, with the engine's allocator (:class:`engine.kv.allocator.KVBlockAllocator`).

A :class:`PrefixCache` takes over :class:`sim.serving.replica.KvAccount`'s ``take``/``give`` (and
``_fits``'s byte count) when the scenario has ``kv.prefix_caching`` on, ``kv.allocator:
engine`` and a workload whose requests carry block hash ids (Mooncake ``hash_ids``). Without
one of these the replica has no ``PrefixCache`` and its KV path is unchanged.

**Keys.** The trace names blocks of ``T`` tokens (Mooncake: 512), the replica's KV blocks hold
``B = kv.block_tokens``. Full replica block ``k`` (tokens ``[k*B, (k+1)*B)``) of a prompt gets
the key ``(hash_ids[t], (k+1)*B - t*T)`` with ``t = ((k+1)*B - 1) // T``
(:func:`engine.kv.prefix.trace_block_keys`); with ``B = 16`` each Mooncake id names 32 replica
blocks. Only full blocks inside the prompt are keyed; the partial last block and generated
tokens never are (a trace gives no ids for them).

**Admission** (``take``): the allocator shares the longest prefix of the prompt's keys held by
used or cached blocks (a cached block leaves the LRU cached set; ref-counted), the rest are
fresh blocks registered under their keys. A shared block is *reused* -- its tokens are not
prefilled -- only if its KV has been computed (vLLM caches a block once the step computing it
has run): the reused prefix is the leading run of *ready* shared blocks, capped at
``(tokens - 1) // B`` blocks so that at least one token is prefilled for the first token's
logits (vLLM's rule). The caller starts the prefill at that offset, so TTFT and the iteration's
token budget see only the tokens left, and attention still covers the reused context.
Shared blocks after a not-ready one are held (memory counted once) but prefilled again.

**Readiness** is kept per physical block: a fresh block is not ready; :meth:`computed` marks
the blocks a prefill chunk has finished. A swapped-in sequence's blocks are ready at once (its
KV is copied back). Blocks freed by their last holder stay *cached* (refcount 0, key kept)
until the allocator needs a block and evicts the least recently freed one (LRU; tail blocks of
a sequence go before its head).

**Bytes.** ``KvAccount.reserved`` counts *used* blocks once however many sequences share them;
cached blocks are free memory to admission (evicted on demand, as vLLM's free queue). With
several models on a replica each has its own allocator: after an admission, cached blocks of
the others are evicted while used + cached bytes of all models exceed the capacity (decode
growth between admissions is not trimmed).

**Counters**: ``query_tokens`` (KV tokens of every prefill admission, first or after a
recompute preemption) and ``hit_tokens`` (tokens reused, not prefilled);
``kv.prefix_hit_rate`` = hit / query tokens (vLLM's prefix-cache hit rate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.kv.allocator import KVBlockAllocator
from engine.kv.prefix import num_blocks, trace_block_keys

if TYPE_CHECKING:
    from engine.sched.scheduler import Prefill
    from sim.serving.replica import KvAccount
    from sim.serving.workload import Workload

Key = tuple[int, int]


class PrefixCache:
    """One replica's prefix cache over its per-model allocators; see the module docstring.

    ``allocators[m]`` is model ``m``'s allocator (``None``: no KV); ``prompt[rid]`` is request
    ``rid``'s prompt length. The constructor does no I/O.
    """

    def __init__(
        self,
        kv: KvAccount,
        allocators: list[KVBlockAllocator | None],
        wl: Workload,
        prompt: list[int],
    ) -> None:
        self.kv = kv
        self.allocators = allocators
        self.wl = wl
        self.prompt = prompt
        self.block_tokens = kv.block_tokens
        #: per model: ready[b] = 1 when block b's KV has been computed
        self.ready: list[bytearray] = [bytearray() for _ in allocators]
        self._keys: dict[int, list[Key]] = {}  # per queued head / live rid: prompt block keys
        self._table: dict[int, list[int]] = {}  # per live prefilling rid: its block table
        self._done: dict[int, int] = {}  # per live prefilling rid: keyed blocks marked ready
        self.query_tokens = 0
        self.hit_tokens = 0
        self.multi = sum(a is not None for a in allocators) > 1

    # -- keys ---------------------------------------------------------------------------------
    def keys(self, rid: int) -> list[Key]:
        """``rid``'s prompt block keys (memoised while the request is on this replica)."""
        k = self._keys.get(rid)
        if k is None:
            wl = self.wl
            k = self._keys[rid] = trace_block_keys(
                wl.block_hash_ids(rid), self.prompt[rid], self.block_tokens, wl.hash_block_tokens
            )
        return k

    # -- KvAccount's operations -----------------------------------------------------------------
    def need(self, rid: int, m: int, tokens: int, bpt: int) -> int:
        """Bytes of the blocks ``take(rid, m, tokens, ...)`` would add to ``kv.reserved`` now:
        every block of ``tokens`` except shared ones some running sequence already holds."""
        a = self.allocators[m]
        nb = num_blocks(tokens, self.block_tokens)
        if a is None:
            return nb * self.block_tokens * bpt
        on_used = sum(1 for b in a.shared_prefix(tokens, self.keys(rid)) if a.refcount(b))
        return (nb - on_used) * self.block_tokens * bpt

    def take(self, rid: int, m: int, tokens: int, bpt: int, prefill: bool = True) -> int:
        """Give ``rid`` (model ``m``) the blocks of ``tokens`` KV tokens, sharing its cached
        prefix; returns the tokens reused (0 unless ``prefill``). Keeps ``KvAccount``'s
        invariant with shared blocks counted once (see :meth:`give`)."""
        kv, bt = self.kv, self.block_tokens
        a = self.allocators[m]
        if a is None:  # a model without KV blocks: KvAccount's own bookkeeping
            nb = num_blocks(tokens, bt)
            kv.seqs[rid] = [m, tokens, nb]
            kv.reserved += nb * bt * bpt
            kv.needed += tokens * bpt
            return 0
        keys = self.keys(rid)
        before = a.num_used_blocks
        res = a.allocate(rid, tokens, hash_ids=keys)
        table = a.block_table(rid)
        new_used = a.num_used_blocks - before
        shared_used = len(table) - new_used
        kv.seqs[rid] = [m, tokens, len(table)]
        kv.reserved += new_used * bt * bpt
        kv.needed += (tokens - shared_used * bt) * bpt
        ready = self.ready[m]
        if len(ready) < a.pool_blocks:
            ready.extend(bytes(a.pool_blocks - len(ready)))
        shared = res.hit_tokens // bt
        for i in range(shared, len(keys)):  # fresh blocks: their KV is not computed yet
            ready[table[i]] = 0
        if self.multi:
            self._trim(m)
        if not prefill:  # swapped in: its KV is copied back, every block is computed
            for i in range(len(keys)):
                ready[table[i]] = 1
            return 0
        limit = min(shared, (tokens - 1) // bt)
        r = 0
        while r < limit and ready[table[r]]:
            r += 1
        self.query_tokens += tokens
        self.hit_tokens += r * bt
        if r < len(keys):
            self._table[rid] = table
            self._done[rid] = r
        return r * bt

    def give(self, rid: int, bpt: int) -> int:
        """Release ``rid``'s blocks (keyed ones whose last holder it was become cached);
        returns its exact KV bytes, as ``KvAccount.give``."""
        kv, bt = self.kv, self.block_tokens
        m, tokens, blocks = kv.seqs.pop(rid)
        self._table.pop(rid, None)
        self._done.pop(rid, None)
        self._keys.pop(rid, None)  # recomputed if it comes back (preemption)
        a = self.allocators[m]
        if a is None:
            kv.reserved -= blocks * bt * bpt
            kv.needed -= tokens * bpt
            return tokens * bpt
        before = a.num_used_blocks
        a.free(rid)
        released = before - a.num_used_blocks
        kept = blocks - released  # full prefix blocks other sequences still hold
        kv.reserved -= released * bt * bpt
        kv.needed -= (tokens - kept * bt) * bpt
        return tokens * bpt

    def computed(self, m: int, chunks: list[tuple[Prefill, int]]) -> None:
        """The prefill ``chunks`` (``(request, tokens)`` after the iteration) ran: mark the
        keyed blocks they completed ready for reuse."""
        ready, bt = self.ready[m], self.block_tokens
        for p, _ in chunks:
            rid = p.request_id
            d = self._done.get(rid)
            if d is None:
                continue
            table, keys = self._table[rid], self._keys[rid]
            upto = min(p.num_computed_tokens // bt, len(keys))
            for i in range(d, upto):
                ready[table[i]] = 1
            if upto >= len(keys):
                del self._done[rid], self._table[rid]
            else:
                self._done[rid] = max(d, upto)

    def _trim(self, m: int) -> None:
        """Evict cached blocks of the other models (then ``m``'s) while used + cached bytes of
        all models exceed the replica's KV capacity."""
        kv = self.kv
        allocs = [(j, a) for j, a in enumerate(self.allocators) if a is not None]
        excess = kv.reserved + sum(a.num_cached_blocks * a.block_bytes for _, a in allocs)
        excess -= kv.capacity
        for _, a in sorted(allocs, key=lambda ja: ja[0] == m):
            if excess <= 0:
                return
            n = a.evict_cached(-(-excess // a.block_bytes))
            excess -= n * a.block_bytes

    # -- report -------------------------------------------------------------------------------
    def cached_blocks(self) -> int:
        return sum(a.num_cached_blocks for a in self.allocators if a is not None)


def make_prefix_cache(
    sc: Any, wl: Workload, kv: KvAccount, prompt: list[int]
) -> PrefixCache | None:
    """The replica's :class:`PrefixCache`, or ``None`` when prefix caching is off, the KV is
    byte-counted only, or no request carries block hash ids (then nothing changes)."""
    allocs = kv.allocators
    if not sc.kv.prefix_caching or allocs is None or not wl.has_block_hashes:
        return None
    return PrefixCache(kv, allocs, wl, prompt)


def prefix_summary(caches: list[PrefixCache | None]) -> dict[str, Any]:
    """``kv.*`` of the summary: whether prefix caching ran, hit rate (tokens reused / KV tokens
    of prefill admissions; ``None`` without admissions), hit and query tokens, cached blocks at
    the end, over every replica and the whole run."""
    live = [c for c in caches if c is not None]
    hit = sum(c.hit_tokens for c in live)
    query = sum(c.query_tokens for c in live)
    return {
        "prefix_caching": bool(live),
        "prefix_hit_rate": hit / query if query else None,
        "prefix_hit_tokens": hit,
        "prefix_query_tokens": query,
        "prefix_cached_blocks": sum(c.cached_blocks() for c in live),
    }
