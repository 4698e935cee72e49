"""Access heat map and prefetch planner (R7, R27, R30), shared by the simulator and the engine.

Both are policy objects in the sense of ``ARCHITECTURE.md``: clock-agnostic (every call that
depends on time takes ``now``, seconds, never decreasing), data-agnostic (they see keys and
byte sizes only) and deterministic (ties break by key order, never by hashing or set order).
Keys must be hashable and mutually orderable (ints, strings, or tuples such as
``(model, chunk_id)``).

:class:`HeatMap` keeps an exponentially decayed access count per key: every access adds 1 and
the count halves every ``half_life`` seconds, so ``heat(key, now) = sum over accesses at t_i of
2 ** (-(now - t_i) / half_life)``.

:class:`PrefetchPlanner` turns the keys the next batches will need into a fetch order:
``upcoming[d]`` holds the keys batch (or layer) ``d`` steps ahead needs; a key's priority is the
smallest ``d`` it appears at (0 = needed next = critical, R27). Within one priority hotter keys
go first, then key order. Resident and in-flight keys are skipped, only the first
``window_batches`` entries are looked at (R30: 3-5), and the plan stops before the first key
that would take the planned bytes over ``budget_bytes``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Hashable, Iterable, Sequence

Key = Hashable


class HeatMap:
    """Exponentially decayed access counts per key; see the module docstring."""

    def __init__(self, half_life: float = 10.0) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 seconds, got {half_life}")
        self.half_life = float(half_life)
        # Invariant: _count[k] is k's heat at time _stamp[k]; it decays lazily on access.
        self._count: dict[Key, float] = {}
        self._stamp: dict[Key, float] = {}
        self._now = float("-inf")  # latest `now` seen; time never runs backwards

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, key: object) -> bool:
        return key in self._count

    def _clock(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"now={now} is earlier than a previous call's now={self._now}")
        self._now = now

    def _decayed(self, key: Key, now: float) -> float:
        count = self._count.get(key)
        if count is None:
            return 0.0
        return float(count * 2.0 ** (-(now - self._stamp[key]) / self.half_life))

    def record(self, keys: Iterable[Key], now: float) -> None:
        """Count one access to each key in ``keys`` (a key listed twice counts twice)."""
        self._clock(now)
        for key in keys:
            self._count[key] = self._decayed(key, now) + 1.0
            self._stamp[key] = now

    def heat(self, key: Key, now: float) -> float:
        """Decayed access count of ``key`` at ``now`` (0.0 for a key never recorded)."""
        self._clock(now)
        return self._decayed(key, now)

    def hottest(self, n: int, now: float) -> list[Key]:
        """The ``n`` hottest keys at ``now``, hottest first, ties by key order."""
        self._clock(now)
        if n <= 0:
            return []
        items = ((-self._decayed(k, now), k) for k in self._count)
        return [k for _, k in heapq.nsmallest(n, items)]

    def prune(self, now: float, below: float = 1e-3) -> int:
        """Forget keys whose heat at ``now`` is under ``below``; return how many were dropped."""
        self._clock(now)
        cold = [k for k in self._count if self._decayed(k, now) < below]
        for key in cold:
            del self._count[key]
            del self._stamp[key]
        return len(cold)


class PrefetchPlanner:
    """Orders the fetches of the keys the next ``window_batches`` batches need."""

    def __init__(self, window_batches: int = 3, heat: HeatMap | None = None) -> None:
        if window_batches < 1:
            raise ValueError(f"window_batches must be >= 1, got {window_batches}")
        self.window_batches = window_batches
        self.heat = heat if heat is not None else HeatMap()

    def plan(
        self,
        upcoming: Sequence[Sequence[Key]],
        resident: Container[Key],
        in_flight: Container[Key],
        now: float,
        budget_bytes: int | None = None,
        size_of: Callable[[Key], int] | None = None,
    ) -> list[tuple[int, Key]]:
        """``(priority, key)`` pairs in fetch order; see the module docstring.

        ``budget_bytes`` needs ``size_of`` (bytes of a key). Planned keys are distinct, none
        resident or in flight; priorities are non-decreasing along the list.
        """
        if budget_bytes is not None and size_of is None:
            raise ValueError("budget_bytes needs size_of to know each key's bytes")
        planned: list[tuple[int, Key]] = []
        seen: set[Key] = set()  # membership only; never iterated
        spent = 0
        for distance, batch in enumerate(upcoming[: self.window_batches]):
            fresh: list[Key] = []
            for key in batch:
                if key in seen or key in resident or key in in_flight:
                    continue
                seen.add(key)
                fresh.append(key)
            fresh.sort(key=lambda k: (-self.heat.heat(k, now), k))
            for key in fresh:
                if budget_bytes is not None:
                    assert size_of is not None
                    size = size_of(key)
                    if spent + size > budget_bytes:
                        return planned  # stop before the first key that does not fit
                    spent += size
                planned.append((distance, key))
        return planned
