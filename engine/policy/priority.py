"""Priority-score eviction (R24): evict the object with the lowest score.

``score(now) = w_f * log(freq + 1) - w_s * staleness - w_c * transfer_cost`` where

* ``freq`` -- references to the object *during its current residency*, the admitting one
  included (a freshly inserted object has ``freq == 1``). No history is kept for evicted
  objects: an object that comes back starts again at 1, so memory stays bounded by the
  resident set;
* ``staleness = (now - last_reference) / staleness_unit`` -- seconds divided by the
  ``staleness_unit`` knob (default 1 s, so staleness is in seconds);
* ``transfer_cost`` -- seconds to fetch the object again: the ``cost`` argument of
  ``insert``; when that is 0 and the ``bandwidth`` knob (bytes/s) is set, ``size / bandwidth``.

Defaults are the article's weights ``w_f=0.6, w_s=0.3, w_c=0.1``; each is a knob (any finite
real). Note the article's sign: with ``w_c > 0`` an object that is *more* expensive to fetch
again scores lower and is evicted earlier; a negative ``w_c`` protects expensive objects
instead. Ties break by older last reference, then by earlier insertion.

Exact and fast: with ``a = w_s / staleness_unit``,
``score(now) = [w_f*log(f+1) + a*last - w_c*cost] - a*now``. The bracket (the *rank key*)
does not depend on ``now`` and the ``- a*now`` term is common to every object, so ranking by
rank key at any ``now`` is exactly ranking by score. Heap entries are ordered by
``(rank key, last reference, insertion number)``.

* Usual case, ``w_f >= 0`` and ``w_s >= 0``: a reference can only *raise* an object's
  ``(rank key, last)`` (floating-point rounding is monotone too), so ``hit`` is O(1): it
  updates the object's record and marks its heap entry *dirty*; a dirty entry is a lower
  bound of the object's true position. ``victim`` re-pushes dirty entries it meets at the top
  with their current key and stops at the first clean one, which is then the true minimum.
* Negative ``w_f`` or ``w_s``: a reference can lower the key, so ``hit`` pushes a fresh entry
  at once and the old one goes stale (lazy invalidation).

Stale entries (of removed objects) are dropped when they reach the top, and the heap is
rebuilt when it holds more than twice the live objects. ``victim`` is O(log n) amortised per
dirty entry it meets, plus the pinned objects it skips.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Container, Iterator
from typing import Any

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register

# heap entry: (rank key, last reference, insertion number, entry number, key)
_Entry = tuple[float, float, int, int, Key]
# fields of a per-key record
_FREQ, _COST, _INS, _LIVE, _LAST, _DIRTY = range(6)


def _check_knob(name: str, value: float, *, positive: bool = False) -> float:
    """``value`` as a float: finite, and > 0 when ``positive``; else a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or (positive and v <= 0):
        allowed = "finite number > 0" if positive else "finite number"
        raise ValueError(f"{name} must be a {allowed}, got {value!r}")
    return v


@register("priority")
class PriorityPolicy(EvictionPolicy):
    """Lowest-score-first eviction; see the module docstring for the score and its units.

    Per resident key ``k`` the policy keeps ``self._rec[k] = [freq, w_c * transfer_cost,
    insertion number, live entry number, last reference, dirty]``.

    Invariants kept here:

    * every resident ``k`` has exactly one *live* heap entry, the one whose entry number is
      ``self._rec[k][_LIVE]``; every other entry of ``k`` (and every entry of a removed key)
      is stale and is dropped when met;
    * a clean live entry (``dirty`` false) carries ``k``'s current rank key, last reference
      and insertion number; a dirty one carries a tuple lexicographically <= the current one
      (only in the monotone case, where references never lower the key);
    * hence the first clean live unpinned entry in heap order is the victim.
    """

    def __init__(
        self,
        w_f: float = 0.6,
        w_s: float = 0.3,
        w_c: float = 0.1,
        staleness_unit: float = 1.0,
        bandwidth: float | None = None,
    ) -> None:
        self.w_f = _check_knob("w_f", w_f)
        self.w_s = _check_knob("w_s", w_s)
        self.w_c = _check_knob("w_c", w_c)
        self.staleness_unit = _check_knob("staleness_unit", staleness_unit, positive=True)
        self.bandwidth = (
            None if bandwidth is None else _check_knob("bandwidth", bandwidth, positive=True)
        )
        self._a = self.w_s / self.staleness_unit
        # references never lower a key -> lazy (dirty-flag) updates are exact
        self._monotone = self.w_f >= 0 and self._a >= 0
        self._heap: list[_Entry] = []
        self._rec: dict[Key, list[Any]] = {}
        self._n_ins = 0
        self._n_entries = 0
        # Times enter rank keys relative to the first one seen, to keep a*last small and precise.
        self._t0 = 0.0

    # -- score helpers -----------------------------------------------------------------------
    def transfer_cost(self, size: int, cost: float) -> float:
        """Transfer cost in seconds used for an object of ``size`` bytes given ``cost``."""
        if cost == 0 and self.bandwidth is not None:
            return size / self.bandwidth
        return float(cost)

    def score(self, key: Key, now: float) -> float:
        """The score of resident ``key`` at ``now`` (the formula, for inspection and tests)."""
        r = self._rec[key]
        return float(
            self.w_f * math.log(r[_FREQ] + 1)
            - self.w_s * (now - r[_LAST]) / self.staleness_unit
            - r[_COST]
        )

    def frequency(self, key: Key) -> int:
        """References to resident ``key`` during its current residency (insert included)."""
        return int(self._rec[key][_FREQ])

    def _entry(self, key: Key, r: list[Any]) -> _Entry:
        """A new live, clean entry for ``key`` from its record (updates the record)."""
        # time-and-cost part first, then the frequency term: objects with equal frequency
        # then compare exactly when their (last, cost) terms tie.
        rank = self.w_f * math.log(r[_FREQ] + 1) + (self._a * (r[_LAST] - self._t0) - r[_COST])
        self._n_entries = n = self._n_entries + 1
        r[_LIVE] = n
        r[_DIRTY] = False
        return (rank, r[_LAST], r[_INS], n, key)

    def _push(self, key: Key, r: list[Any]) -> None:
        heap = self._heap
        heapq.heappush(heap, self._entry(key, r))
        if len(heap) > 2 * len(self._rec) + 64:
            self._compact()

    def _compact(self) -> None:
        rec = self._rec
        self._heap = [
            e for e in self._heap if (r := rec.get(e[4])) is not None and r[_LIVE] == e[3]
        ]
        heapq.heapify(self._heap)

    # -- the policy protocol ---------------------------------------------------------------
    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        if self._n_ins == 0:
            self._t0 = now
        self._n_ins += 1
        r = [1, self.w_c * self.transfer_cost(size, cost), self._n_ins, 0, now, False]
        self._rec[key] = r
        self._push(key, r)

    def hit(self, key: Key, now: float) -> None:
        r = self._rec[key]
        r[_FREQ] += 1
        r[_LAST] = now
        if self._monotone:
            r[_DIRTY] = True  # the live entry is now a lower bound; victim() refreshes it
        else:
            self._push(key, r)

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        heap = self._heap
        rec = self._rec
        aside: list[_Entry] = []
        found: Key | None = None
        while heap:
            e = heap[0]
            k = e[4]
            r = rec.get(k)
            if r is None or r[_LIVE] != e[3]:
                heapq.heappop(heap)  # stale: can never be live again
            elif r[_DIRTY]:
                heapq.heapreplace(heap, self._entry(k, r))
            elif k in pinned:
                # clean, pinned: set aside; put back below (the multiset is unchanged)
                aside.append(heapq.heappop(heap))
            else:
                found = k
                break
        for e in aside:
            heapq.heappush(heap, e)
        return found

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        del self._rec[key]
        if not self._rec:
            self._heap.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._rec

    def __len__(self) -> int:
        return len(self._rec)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in eviction order (lowest score first)."""
        # refresh every dirty live entry first, so that heap order is the true order
        self._heap = [
            self._entry(e[4], r) if r[_DIRTY] else e
            for e in self._heap
            if (r := self._rec.get(e[4])) is not None and r[_LIVE] == e[3]
        ]
        heapq.heapify(self._heap)
        return iter([e[4] for e in sorted(self._heap)])
