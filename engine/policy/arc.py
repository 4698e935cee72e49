"""ARC, Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), measured in bytes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterator

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register


@register("arc")
class ARCPolicy(EvictionPolicy):
    """ARC over four LRU lists, generalised from pages to bytes; no knobs.

    ``T1`` holds resident keys seen once recently, ``T2`` resident keys seen at least twice;
    ``B1``/``B2`` are the ghost (history-only) lists of keys evicted from ``T1``/``T2``. Every
    list is LRU-ordered (oldest first). ``c`` is the cache capacity and ``p`` the adaptive
    target size of ``T1``. **All sizes are bytes**: ``|X|`` below is the sum of the sizes of
    the keys in list ``X``, ``p`` is in bytes and the ghost lists are trimmed by bytes. With
    unit sizes (every object 1 byte) this is the paper's algorithm, up to the two ordering
    points listed below.

    * ``hit(x)`` (case I): move ``x`` to the MRU end of ``T2``.
    * ``insert(x)`` of a key in ``B1`` (case II, ghost hit): ``p = min(c, p + s*max(1,
      |B2|/|B1|))`` with ``s`` the size of ``x`` (the paper's delta times the object size);
      ``x`` goes to the MRU end of ``T2``.
    * ``insert(x)`` of a key in ``B2`` (case III): ``p = max(0, p - s*max(1, |B1|/|B2|))``;
      ``x`` goes to the MRU end of ``T2``.
    * ``insert(x)`` of a new key (case IV): ``x`` goes to the MRU end of ``T1``; then ghosts
      are trimmed, LRU first: ``B1`` while ``|T1| + |B1| > c``, then ``B2`` (then ``B1``)
      while ``|T1| + |T2| + |B1| + |B2| > 2c`` -- the paper's "delete LRU of B1/B2".
    * ``victim()`` is REPLACE: the LRU unpinned key of ``T1`` if ``|T1| > p`` (and ``T1``
      has one), else the LRU unpinned key of ``T2``; if the chosen list has only pinned keys,
      the other list's. ``remove(x, evicted=True)`` then moves ``x`` to the MRU end of ``B1``
      (from ``T1``) or ``B2`` (from ``T2``).
    * ``remove(x, evicted=False)`` (invalidation) forgets ``x``: no ghost is kept.

    Differences forced by the cache protocol (the owning cache asks for victims *before* it
    tells the policy which key is coming): (1) on a ghost hit the paper adapts ``p`` and then
    runs REPLACE; here REPLACE runs first with the previous ``p``; (2) REPLACE's tie rule
    "evict from ``T1`` also when ``x`` is in ``B2`` and ``|T1| = p``" cannot see ``x``, so
    at ``|T1| = p`` it evicts from ``T2``. The ghost trimming of case IV happens after REPLACE
    instead of before, which gives the same lists (REPLACE only adds at MRU ends, trimming
    removes LRU ends; when ``|T1| = c`` the T1 victim lands in an empty ``B1`` and is trimmed
    at once, as the paper deletes it without a ghost).

    Invariants after every call (``c`` = capacity, sizes in bytes): ``|T1| + |B1| <= c``,
    ``|T1| + |T2| + |B1| + |B2| <= 2c`` (given the cache keeps ``|T1| + |T2| <= c``),
    ``0 <= p <= c``, and the four lists are pairwise disjoint.
    """

    def __init__(self) -> None:
        self._t1: OrderedDict[Key, int] = OrderedDict()  # key -> size, LRU first
        self._t2: OrderedDict[Key, int] = OrderedDict()
        self._b1: OrderedDict[Key, int] = OrderedDict()
        self._b2: OrderedDict[Key, int] = OrderedDict()
        # Byte totals; invariant: self._sX == sum(self._X.values()) for each list X.
        self._s1 = self._s2 = self._g1 = self._g2 = 0
        self.p = 0.0  # target bytes of T1; 0 <= p <= capacity

    # -- introspection -------------------------------------------------------------------
    @property
    def t1(self) -> tuple[Key, ...]:
        """Resident keys seen once recently, LRU first."""
        return tuple(self._t1)

    @property
    def t2(self) -> tuple[Key, ...]:
        """Resident keys seen at least twice, LRU first."""
        return tuple(self._t2)

    @property
    def b1(self) -> tuple[Key, ...]:
        """Ghosts evicted from T1, LRU first."""
        return tuple(self._b1)

    @property
    def b2(self) -> tuple[Key, ...]:
        """Ghosts evicted from T2, LRU first."""
        return tuple(self._b2)

    def list_bytes(self) -> tuple[int, int, int, int]:
        """``(|T1|, |T2|, |B1|, |B2|)`` in bytes."""
        return self._s1, self._s2, self._g1, self._g2

    # -- protocol ------------------------------------------------------------------------
    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        c = self.capacity
        if key in self._b1:  # case II: recency was worth more -- grow T1's target
            # delta = max(1, |B2|/|B1|), with |B1| still counting x as in the paper.
            ratio = self._g2 / self._g1 if self._g2 > self._g1 > 0 else 1.0
            self.p = min(float(c), self.p + size * ratio)
            self._g1 -= self._b1.pop(key)
            self._t2[key] = size
            self._s2 += size
        elif key in self._b2:  # case III: frequency was worth more -- shrink T1's target
            ratio = self._g1 / self._g2 if self._g1 > self._g2 > 0 else 1.0
            self.p = max(0.0, self.p - size * ratio)
            self._g2 -= self._b2.pop(key)
            self._t2[key] = size
            self._s2 += size
        else:  # case IV
            self._t1[key] = size
            self._s1 += size
        self._trim()

    def hit(self, key: Key, now: float) -> None:
        size = self._t1.pop(key, None)
        if size is not None:
            self._s1 -= size
            self._s2 += size
            self._t2[key] = size
        else:
            self._t2.move_to_end(key)

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        first, second = (
            (self._t1, self._t2)
            if self._t1 and self._s1 > self.p
            else (
                self._t2,
                self._t1,
            )
        )
        for lst in (first, second):
            for key in lst:
                if key not in pinned:
                    return key
        return None

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        size = self._t1.pop(key, None)
        if size is not None:
            self._s1 -= size
            if evicted:
                self._b1[key] = size
                self._g1 += size
        else:
            size = self._t2.pop(key)
            self._s2 -= size
            if evicted:
                self._b2[key] = size
                self._g2 += size
        self._trim()

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys: ``T1`` then ``T2``, each LRU first."""
        return iter(list(self._t1) + list(self._t2))

    # -- internals -----------------------------------------------------------------------
    def _trim(self) -> None:
        """Delete LRU ghosts until ``|T1|+|B1| <= c`` and the total is ``<= 2c``."""
        c = self.capacity
        b1, b2 = self._b1, self._b2
        while b1 and self._s1 + self._g1 > c:
            self._g1 -= b1.pop(next(iter(b1)))
        while b2 and self._s1 + self._s2 + self._g1 + self._g2 > 2 * c:
            self._g2 -= b2.pop(next(iter(b2)))
        while b1 and self._s1 + self._s2 + self._g1 + self._g2 > 2 * c:
            self._g1 -= b1.pop(next(iter(b1)))
