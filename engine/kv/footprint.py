"""Device memory one sequence's KV storage needs, by storage layout (R12).

A pure function of sizes: how many token slots of device address space a sequence must have
had reserved by the time its context reaches ``L`` tokens (multiply by the KV bytes per token
for bytes). Three layouts:

* ``paged`` -- fixed blocks of ``block_tokens`` from a shared pool (the simulator's and the
  engine's allocator): ``ceil(L / block_tokens) * block_tokens``. Freed blocks are all one
  size, so any freed block serves any later request: no external fragmentation.
* ``chunked`` -- the article's ``ChunkedKVCache``: K/V appended into separately allocated
  chunks of ``chunk_tokens`` (512); a full chunk is kept and a new one started, nothing is
  copied: ``ceil(L / chunk_tokens) * chunk_tokens``.
* ``contiguous`` -- the article's "before": one contiguous buffer per sequence, first
  ``initial_tokens`` long; when it is full a buffer of ``max(cap + 1, ceil(cap * growth))``
  tokens (``growth`` 1.5, the article's "几何增长（1.5倍）") is allocated, the old one is copied
  into it and only then freed, so old and new coexist during the copy. The buffers live in one
  address space managed first fit with coalescing of adjacent free ranges (a caching
  allocator's segment): a new buffer takes the lowest free range it fits in, or extends the
  top of the space (starting in the free range that touches the top, if there is one). A
  freed buffer is reusable only by a buffer that fits in it together with its free
  neighbours; what is freed and too small to reuse is *external fragmentation*. The footprint
  is the high-water mark of the space.

Invariants (:func:`contiguous_regrowth`): the live buffers never overlap; a buffer's capacity
is at least the context it holds; the high-water mark never decreases, so the footprint is
non-decreasing in ``L`` (what makes a largest fitting context well defined).

Example, ``initial_tokens`` 4, growth 1.5 (capacities 4, 6, 9, 14, 21): the buffers land at
``[0, 4)``, ``[4, 10)``, ``[10, 19)``, ``[19, 33)`` (the free ``[0, 10)`` is too small for 14)
and ``[33, 54)`` (the free ``[0, 19)`` is too small for 21): 21 tokens of context need 54 token
slots of address space (2.57x), while ``chunked`` with 4-token chunks needs 24.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from engine.errors import InputError

StorageLayout = Literal["paged", "chunked", "contiguous"]
STORAGE_LAYOUTS: tuple[str, ...] = ("paged", "chunked", "contiguous")
DEFAULT_GROWTH = 1.5


@dataclass(frozen=True)
class Regrowth:
    """The contiguous buffers of one sequence up to some context: ``placements[i]`` is the
    ``(start, capacity)`` of the i-th buffer in token slots, ``high_water`` the top of the
    address space ever used, ``copied`` the token slots copied by regrowths."""

    placements: tuple[tuple[int, int], ...]
    high_water: int
    copied: int

    @property
    def capacity(self) -> int:
        """Capacity of the live (last) buffer."""
        return self.placements[-1][1]


def _first_fit(holes: list[list[int]], need: int, top: int) -> int:
    """Start of a ``need``-slot buffer: the lowest free range that holds it, else the top of
    the space (from the free range touching the top, if any). ``holes`` are ``[start, end)``
    ranges in address order, coalesced; the chosen range is taken out of them."""
    for i, (s, e) in enumerate(holes):
        if e - s >= need:
            if e - s == need:
                del holes[i]
            else:
                holes[i][0] = s + need
            return s
    if holes and holes[-1][1] == top:
        return holes.pop()[0]
    return top


def _free(holes: list[list[int]], start: int, end: int) -> None:
    """Return ``[start, end)`` to the free ranges, merging it with adjacent ones."""
    i = 0
    while i < len(holes) and holes[i][0] < start:
        i += 1
    holes.insert(i, [start, end])
    if i + 1 < len(holes) and holes[i][1] == holes[i + 1][0]:
        holes[i][1] = holes.pop(i + 1)[1]
    if i > 0 and holes[i - 1][1] == holes[i][0]:
        holes[i - 1][1] = holes.pop(i)[1]


def contiguous_regrowth(
    context: int, initial_tokens: int, growth: float = DEFAULT_GROWTH
) -> Regrowth:
    """The buffers a sequence growing to ``context`` tokens goes through (module docstring);
    the first buffer of ``initial_tokens`` exists even for ``context`` 0."""
    if initial_tokens < 1 or not growth > 1.0:
        raise InputError(
            f"initial_tokens={initial_tokens}, growth={growth}: need initial_tokens >= 1 "
            "and growth > 1",
            where="growth",
        )
    cap = initial_tokens
    placements = [(0, cap)]
    holes: list[list[int]] = []
    top = high = cap
    copied = 0
    while cap < context:
        new = max(cap + 1, math.ceil(cap * growth))
        start = _first_fit(holes, new, top)
        top = max(top, start + new)
        high = max(high, top)
        old_start, old_cap = placements[-1]
        copied += old_cap  # old and new coexist while the old one is copied
        _free(holes, old_start, old_start + old_cap)
        placements.append((start, new))
        cap = new
    return Regrowth(tuple(placements), high, copied)


@dataclass(frozen=True)
class KvStorageModel:
    """Token slots of device memory one sequence's KV reserves under ``layout`` (module
    docstring). ``initial_tokens`` (``contiguous``): the first buffer; 0 means
    ``chunk_tokens``, so the two designs start from the same allocation."""

    layout: StorageLayout = "paged"
    block_tokens: int = 64
    chunk_tokens: int = 512
    growth: float = DEFAULT_GROWTH
    initial_tokens: int = 0

    def __post_init__(self) -> None:
        if self.layout not in STORAGE_LAYOUTS:
            raise InputError(
                f"layout {self.layout!r} is unknown; allowed: {', '.join(STORAGE_LAYOUTS)}",
                where="layout",
            )
        for name in ("block_tokens", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}", where=name)
        if not self.growth > 1.0:
            raise InputError(f"growth must be > 1, got {self.growth}", where="growth")

    def slots(self, context: int) -> int:
        """Token slots reserved by the time the sequence holds ``context`` tokens (for
        ``contiguous`` the address-space high-water mark, old + new copies and freed
        fragments included); non-decreasing in ``context``."""
        if self.layout == "paged":
            return -(-context // self.block_tokens) * self.block_tokens
        if self.layout == "chunked":
            return -(-context // self.chunk_tokens) * self.chunk_tokens
        init = self.initial_tokens or self.chunk_tokens
        return contiguous_regrowth(context, init, self.growth).high_water

    def bytes(self, context: int, bytes_per_token: int) -> int:
        """Device bytes: :meth:`slots` times ``bytes_per_token``."""
        return self.slots(context) * bytes_per_token
