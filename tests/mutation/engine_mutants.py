"""Single-point mutants of ``engine/``: eviction policies, the tier chain, the KV block
allocator and its admission rules, the hash ring (see :mod:`tests.mutation.mutant`).

``tests`` are the test files that target the mutated code; ``python -m tests.mutation
--package engine`` runs each mutant through them.
"""

from __future__ import annotations

from engine.hashring import HashRing
from engine.kv.admission import KvAdmission
from engine.kv.allocator import KVBlockAllocator
from engine.policy.arc import ARCPolicy
from engine.policy.lru import LRUPolicy
from engine.tiers.chain import TierChain
from tests.mutation.mutant import Mutant

LRU_T = ("tests/engine/policy/test_lru.py",)
ARC_T = ("tests/engine/policy/test_arc.py",)
RING_T = ("tests/engine/test_hashring.py",)
ALLOC_T = (
    "tests/engine/kv/test_allocator.py",
    "tests/engine/kv/test_allocator_append_many.py",
    "tests/engine/kv/test_allocator_release.py",
    "tests/engine/kv/test_allocator_stateful.py",
)
ADMIT_T = ("tests/engine/kv/test_admission.py", "tests/engine/runtime/test_scheduler.py")
TIER_T = ("tests/engine/tiers",)

MUTANTS: list[Mutant] = [
    Mutant(
        "lru-hit-does-not-refresh",
        "an LRU hit leaves the key where it was (no move to the most recent end)",
        LRUPolicy,
        "hit",
        "self._order.move_to_end(key)",
        "pass",
        "policy",
        LRU_T,
    ),
    Mutant(
        "lru-victim-ignores-pins",
        "the LRU victim may be a pinned key",
        LRUPolicy,
        "victim",
        "if key not in pinned:",
        "if True:",
        "policy",
        LRU_T,
    ),
    Mutant(
        "arc-hit-stays-in-t1",
        "an ARC hit in T1 moves the bytes to T2's count but keeps the key in T1",
        ARCPolicy,
        "hit",
        "self._t2[key] = size",
        "self._t1[key] = size",
        "policy",
        ARC_T,
    ),
    Mutant(
        "arc-replace-tie-to-t1",
        "ARC's REPLACE evicts from T1 also when |T1| equals the target p",
        ARCPolicy,
        "victim",
        "if self._t1 and self._s1 > self.p",
        "if self._t1 and self._s1 >= self.p",
        "policy",
        ARC_T,
    ),
    Mutant(
        "ring-no-wraparound",
        "a key past the last ring point does not wrap to the first",
        HashRing,
        "_start",
        "return 0 if idx == len(self._points) else idx",
        "return min(idx, len(self._points) - 1)",
        "ring",
        RING_T,
    ),
    Mutant(
        "ring-duplicate-replicas",
        "lookup may return one node twice (replicas not distinct)",
        HashRing,
        "lookup",
        "if owner not in out:",
        "if True:",
        "ring",
        RING_T,
    ),
    Mutant(
        "alloc-append-floor-blocks",
        "append sizes the block table with floor division (a partial block is not taken)",
        KVBlockAllocator,
        "append",
        "grow_by = -(-new // bt) - len(table)",
        "grow_by = new // bt - len(table)",
        "kv",
        ALLOC_T,
    ),
    Mutant(
        "alloc-preempts-oldest",
        "the allocator preempts the oldest sequence instead of the newest",
        KVBlockAllocator,
        "_preempt_newest",
        "victim = next(reversed(self._tables))",
        "victim = next(iter(self._tables))",
        "kv",
        ALLOC_T,
    ),
    Mutant(
        "admit-ignores-watermark",
        "admission does not keep the watermark free while sequences run",
        KvAdmission,
        "fits",
        "spare = self.capacity * self.watermark if running else 0.0",
        "spare = 0.0",
        "kv",
        ADMIT_T,
    ),
    Mutant(
        "budget-strict",
        "an unchunked prompt that exactly fills the token budget is refused",
        KvAdmission,
        "budget_allows",
        "tokens <= budget",
        "tokens < budget",
        "kv",
        ADMIT_T,
    ),
    Mutant(
        "tier-promote-unchecked",
        "promotion reports a copy that a lower admission already evicted",
        TierChain,
        "promote",
        "if admitted[j] and key in levels[j]:",
        "if admitted[j]:",
        "tiers",
        TIER_T,
        equivalent=(
            "within TierChain no lower admission can evict an upper copy: admit makes room "
            "before it inserts, evictions only demote downwards, and neither on_drop callback "
            "(engine.tiers.stack, sim.serving.paramstore) removes keys; the check guards "
            "future callbacks"
        ),
    ),
]
