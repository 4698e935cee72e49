"""The eviction-policy contract shared by the simulator and the real engine.

A policy keeps only *metadata* about the keys resident in one cache (recency, frequency,
history) and chooses victims. It never stores bytes and never reads a clock:

* clock-agnostic -- every call that depends on time takes ``now`` (seconds, any origin, never
  decreasing across calls);
* data-agnostic -- it sees keys (hashable: ints, strings or tuples), sizes in bytes and an
  optional colour, never arrays;
* deterministic -- ties break by insertion order or by key, never by ``id()`` or set order.

The owning cache (:class:`engine.cache.TierCache`) drives it with exactly this protocol:

``insert(key, size, now, color=None, cost=0.0)``
    ``key`` just became resident (it was not). ``cost`` is the time in seconds it would take to
    fetch the object again (policies that weigh transfer cost use it; the others ignore it).
``hit(key, now)``
    a resident ``key`` was referenced again.
``victim(now, pinned)``
    return the resident key the policy would evict next, skipping every key in ``pinned``
    (objects in use), or ``None`` when no resident key may be evicted. It does *not* remove
    the key: the cache then calls ``remove(key, now, evicted=True)``.
``remove(key, now, evicted)``
    ``key`` leaves the cache: chosen by ``victim`` (``evicted=True``) or invalidated by the
    owner (``evicted=False``). Policies that keep history of non-resident keys (LRU-K, ARC)
    keep it for evicted keys.

``evict(now, pinned)``
    ``victim`` then, if it found a key, ``remove(key, now, evicted=True)``, in one call;
    returns the key (or ``None``). The base class does exactly that; a policy may override
    it to share work between the two steps, never to choose differently. The cache's
    trace-replay loop (:meth:`engine.cache.TierCache.access_many`) evicts with it.

``attach(capacity)`` is called once by the cache before any other call, with its capacity in
bytes (colour reservations and size-aware policies need it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Iterator
from typing import ClassVar

Key = Hashable


class EvictionPolicy(ABC):
    """Base class of every eviction policy; see the module docstring for the protocol."""

    #: registry name, e.g. ``"lru"``; set by :func:`engine.policy.registry.register`.
    name: ClassVar[str] = ""

    capacity: int = 0

    def attach(self, capacity: int) -> None:
        """Tell the policy the byte capacity of the cache that owns it."""
        self.capacity = capacity

    @abstractmethod
    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        """Record that ``key`` (not resident before) is now resident."""

    @abstractmethod
    def hit(self, key: Key, now: float) -> None:
        """Record a reference to resident ``key``."""

    @abstractmethod
    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        """The key to evict next, never one in ``pinned``; ``None`` if none may be evicted."""

    def evict(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        """Evict the key ``victim`` would choose (``remove(key, now, True)``) and return it."""
        key = self.victim(now, pinned)
        if key is not None:
            self.remove(key, now, True)
        return key

    @abstractmethod
    def remove(self, key: Key, now: float, evicted: bool) -> None:
        """Forget resident ``key`` (keep history of it if the policy does and ``evicted``)."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident as far as the policy knows."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident keys."""

    @abstractmethod
    def __iter__(self) -> Iterator[Key]:
        """Resident keys, in the policy's own eviction-candidate order where it has one."""
