"""`pin`: a fixed set of streamed weights stays resident; the rest stream through an LRU region.

Why not LRU. In PD mode a replica reads its model's layers in the same order every iteration
(layer 0, 1, ..., L-1, then layer 0 again): a cyclic scan. When the weight cache holds ``C``
bytes of a model of ``M > C`` bytes, every chunk's LRU stack distance is ``M`` (all the model's
other bytes are referenced between two uses of it), which exceeds ``C``, so LRU has evicted it
by the time it is needed again: **zero hits, the whole model streams every iteration**, however
close ``C`` is to ``M``. FIFO, CLOCK-like and most recency policies do the same. Belady's MIN
keeps a fixed ``C``-byte subset resident and streams the rest through one chunk of space,
reaching a hit ratio of about ``C / M``. This policy gets most of that online: it keeps the
first ``budget`` bytes admitted (on a cold cyclic scan, the first layers) for good, so each
iteration hits ``pinned / M`` of its bytes, and the other keys share the remaining
``capacity - budget`` bytes under LRU. That region must hold a layer being computed plus the
layers the prefetcher fetches ahead; size ``fraction`` so it does.

Rules (the reference model of ``tests/engine/policy/test_pin.py`` states them the same way):

* **Joining.** A key joins the *pinned set* when it is inserted and the set's bytes plus its
  size are at most ``budget``; otherwise it goes to the *stream region*. Membership is decided
  once, at insertion; a hit never moves a key between the two.
* **Victims.** The least recently used stream key not pinned by the cache; only when every
  stream key is pinned by the cache (in use) does a pinned-set key go, newest member first, so
  an admission that would fit under LRU is never refused and the set stays the oldest members.
  A pinned-set key that leaves (evicted or invalidated) frees its budget for the next key
  inserted that fits.
* **Budget.** ``pinned_bytes`` if given, else ``fraction`` x the cache capacity (rounded down);
  capped at the capacity. ``fraction=0`` is plain LRU. With R30 watermarks below 1, keep the
  budget under ``low_watermark`` x capacity, or the watermark eviction reaches the pinned set.

Which keys are pinned depends only on the order of insertion, so the policy needs no knowledge
of layers and works for any key type (simulator chunk ids, engine ``(model, chunk)`` tuples).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register
from engine.units import parse_size


@register("pin")
class PinPolicy(EvictionPolicy):
    """First keys admitted (up to `fraction` of the cache) stay; the rest stream through LRU.

    ``fraction`` (0..1, default 0.75): share of the cache capacity reserved for the pinned set.
    ``pinned_bytes`` (bytes or a size like ``"30GiB"``; default none): the pinned set's budget
    in bytes, used instead of ``fraction`` (e.g. the bytes of the first N layers).

    Invariants: ``_pinned`` (admission order) and ``_stream`` (LRU order, oldest first) are
    disjoint and together hold every resident key exactly once; ``_pinned_used`` is the sum of
    ``_pinned``'s sizes and never exceeds ``_budget``.
    """

    def __init__(self, fraction: float = 0.75, pinned_bytes: int | str | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        self.fraction = float(fraction)
        self.pinned_bytes = None if pinned_bytes is None else parse_size(pinned_bytes)
        if self.pinned_bytes is not None and self.pinned_bytes < 0:
            raise ValueError(f"pinned_bytes must be >= 0, got {pinned_bytes}")
        self._budget = self._budget_for(0)
        self._pinned: OrderedDict[Key, int] = OrderedDict()  # key -> size, oldest first
        self._pinned_used = 0
        self._stream: OrderedDict[Key, None] = OrderedDict()  # least recently used first

    def _budget_for(self, capacity: int) -> int:
        if self.pinned_bytes is not None:
            return min(self.pinned_bytes, capacity) if capacity else self.pinned_bytes
        return int(self.fraction * capacity)

    def attach(self, capacity: int) -> None:
        super().attach(capacity)
        self._budget = self._budget_for(capacity)

    @property
    def budget(self) -> int:
        """Bytes the pinned set may hold."""
        return self._budget

    @property
    def pinned_used(self) -> int:
        """Bytes of the keys now in the pinned set."""
        return self._pinned_used

    def in_pinned_set(self, key: Key) -> bool:
        """Whether resident ``key`` belongs to the pinned set (else it streams)."""
        return key in self._pinned

    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        if self._pinned_used + size <= self._budget:
            self._pinned[key] = size
            self._pinned_used += size
        else:
            self._stream[key] = None

    def hit(self, key: Key, now: float) -> None:
        if key in self._stream:
            self._stream.move_to_end(key)

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        for key in self._stream:
            if key not in pinned:
                return key
        for key in reversed(self._pinned):
            if key not in pinned:
                return key
        return None

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        size = self._pinned.pop(key, None)
        if size is None:
            del self._stream[key]
        else:
            self._pinned_used -= size

    def __contains__(self, key: object) -> bool:
        return key in self._stream or key in self._pinned

    def __len__(self) -> int:
        return len(self._stream) + len(self._pinned)

    def __iter__(self) -> Iterator[Key]:
        """Stream keys least recently used first, then the pinned set newest first."""
        yield from self._stream
        yield from reversed(self._pinned)
