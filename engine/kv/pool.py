"""A growable pool of fixed-size KV block ids (data-agnostic: ids only, no bytes).

The pool hands out integer block ids ``0 .. size-1``. It starts at ``initial_blocks`` and grows
geometrically -- ``size -> min(cap, max(size + 1, ceil(size * growth)))`` -- until it reaches
``cap_blocks``. Growth only *appends* ids, so an id, once handed out, means the same slot for
the life of the pool (the real engine maps ids to array rows and grows its arrays the same way).

The pool keeps the per-block reference counts and the free list; which blocks are *cached*
(refcount 0 but still holding reusable content) is decided by the allocator above it.

Invariants kept here:

* ``len(ref) == size`` and ``size <= cap_blocks`` always;
* every id in ``free`` has ``ref[id] == 0`` and appears in ``free`` once;
* ``growth_events == len(growth_history) - 1``.
"""

from __future__ import annotations

import math
import sys
from itertools import pairwise

from engine.errors import InputError

#: "no cap": the pool may grow without bound (used for unbounded-pool experiments).
UNBOUNDED = sys.maxsize


def next_pool_size(size: int, growth: float, cap_blocks: int) -> int:
    """The pool size after one growth step from ``size`` (at least one more block, at most cap)."""
    return min(cap_blocks, max(size + 1, math.ceil(size * growth)))


def growth_sequence(initial_blocks: int, growth: float, cap_blocks: int) -> list[int]:
    """Every pool size from ``initial_blocks`` up to ``cap_blocks`` (the cap must be finite)."""
    if cap_blocks >= UNBOUNDED:
        raise ValueError("growth_sequence needs a finite cap")
    sizes = [min(initial_blocks, cap_blocks)]
    while sizes[-1] < cap_blocks:
        sizes.append(next_pool_size(sizes[-1], growth, cap_blocks))
    return sizes


class BlockPool:
    """Reference counts and a LIFO free list over block ids that grow geometrically.

    ``ref`` and ``free`` are plain lists that the allocator reads and updates directly on its
    hot path (the same list objects for the pool's whole life; growth extends them in place).
    """

    __slots__ = ("cap_blocks", "free", "growth", "growth_events", "growth_history", "ref", "size")

    def __init__(self, initial_blocks: int, growth: float, cap_blocks: int) -> None:
        if cap_blocks < 1:
            raise InputError(f"the KV pool cap must hold at least one block, got {cap_blocks}")
        if initial_blocks < 1:
            raise InputError(f"initial_blocks must be >= 1, got {initial_blocks}")
        if not growth > 1.0:
            raise InputError(f"growth must be a factor > 1.0 (e.g. 1.5), got {growth}")
        self.cap_blocks = cap_blocks
        self.growth = float(growth)
        self.size = min(initial_blocks, cap_blocks)
        self.ref: list[int] = [0] * self.size
        # LIFO stack: the id on top (end) is handed out next; lowest ids first at the start.
        self.free: list[int] = list(range(self.size - 1, -1, -1))
        self.growth_events = 0
        self.growth_history: list[int] = [self.size]

    @property
    def can_grow(self) -> bool:
        """Whether the pool is still below its cap."""
        return self.size < self.cap_blocks

    @property
    def headroom(self) -> int:
        """Blocks the pool may still add by growing."""
        return self.cap_blocks - self.size

    def grow(self) -> int:
        """Grow by one geometric step; return the number of ids added (0 at the cap).

        New ids are pushed on the free list with the lowest new id on top.
        """
        if self.size >= self.cap_blocks:
            return 0
        old = self.size
        new = next_pool_size(old, self.growth, self.cap_blocks)
        self.ref.extend([0] * (new - old))
        self.free.extend(range(new - 1, old - 1, -1))
        self.size = new
        self.growth_events += 1
        self.growth_history.append(new)
        return new - old

    def largest_free_run(self) -> int:
        """Length of the longest run of consecutive block ids that are all on the free list."""
        if not self.free:
            return 0
        ids = sorted(self.free)
        best = run = 1
        for prev, cur in pairwise(ids):
            run = run + 1 if cur == prev + 1 else 1
            if run > best:
                best = run
        return best
