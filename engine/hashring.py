"""Consistent-hash ring with virtual nodes, replication and an optional bounded-load cap (R1, R8).

Contract
--------
* Every node owns ``vnodes`` points on a 64-bit ring. A point is the first 8 bytes of
  ``blake2b(f"{node}#{i}")``, read big-endian; a key's point is the same hash of a stable
  byte encoding of the key (:func:`stable_hash`). Python's ``hash()`` is never used, so the
  placement is identical across processes and machines.
* ``lookup(key, n)`` walks clockwise from the key's point and returns the first ``n``
  *distinct* nodes met (primary first). Ties between equal points (practically impossible
  with 64-bit hashes) break by node name, then vnode index.
* Adding a node moves only the keys whose primary becomes the new node; removing one moves
  only the keys it held. The expected fraction that moves is ``1/(N+1)`` resp. ``1/N``.
* ``assign(keys)`` maps a whole key set at once. With ``load_factor`` set it implements
  consistent hashing with bounded loads (Mirrokni, Thorup & Zadimoghaddam, 2018): each node
  takes at most ``ceil(load_factor * len(keys) * replication / N)`` replicas; a key skips full
  nodes and continues clockwise. When the cap would trap the last replicas of a key on nodes
  already holding it, one earlier replica is moved to make room (see ``_make_room``), so the
  cap always holds for ``load_factor >= 1``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Hashable, Sequence

import numpy as np

RingKey = Hashable  # ints, strings, bytes or tuples of them


def _encode(key: object) -> bytes:
    """Stable byte encoding of a key: type-tagged so ``1`` and ``"1"`` differ."""
    if isinstance(key, bool):
        return b"b1" if key else b"b0"
    if isinstance(key, int):
        return b"i" + str(key).encode()
    if isinstance(key, str):
        return b"s" + key.encode("utf-8")
    if isinstance(key, bytes):
        return b"y" + key
    if isinstance(key, tuple):
        parts = [_encode(part) for part in key]
        return b"t" + b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    raise TypeError(f"cannot hash key of type {type(key).__name__}; use int, str, bytes or tuple")


def stable_hash(key: object) -> int:
    """64-bit unsigned hash of ``key``: blake2b (8-byte digest) of its stable encoding."""
    return int.from_bytes(hashlib.blake2b(_encode(key), digest_size=8).digest(), "big")


def _vnode_point(node: str, index: int) -> int:
    return int.from_bytes(
        hashlib.blake2b(f"{node}#{index}".encode(), digest_size=8).digest(), "big"
    )


class HashRing:
    """Consistent-hash ring of named nodes; see the module docstring for the contract."""

    def __init__(
        self,
        nodes: Sequence[str],
        vnodes: int = 128,
        replication: int = 1,
        load_factor: float | None = None,
    ) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        if replication < 1:
            raise ValueError(f"replication must be >= 1, got {replication}")
        if load_factor is not None and load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1.0 (or None), got {load_factor}")
        self.vnodes = vnodes
        self.replication = replication
        self.load_factor = load_factor
        # Invariant: _points is sorted ascending; _owners[i] owns _points[i]; _entries holds the
        # same (point, node, vnode index) triples, sorted, so ties break by node name.
        self._entries: list[tuple[int, str, int]] = []
        self._points: list[int] = []
        self._owners: list[str] = []
        self._nodes: list[str] = []
        for name in nodes:
            self._insert_node(name)
        self._rebuild()

    # -- membership ---------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        """Member node names, sorted."""
        return list(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def _insert_node(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"node names must be non-empty strings, got {name!r}")
        if name in self._nodes:
            raise ValueError(f"node {name!r} is already on the ring")
        bisect.insort(self._nodes, name)
        self._entries.extend((_vnode_point(name, i), name, i) for i in range(self.vnodes))

    def _rebuild(self) -> None:
        self._entries.sort()
        self._points = [e[0] for e in self._entries]
        self._owners = [e[1] for e in self._entries]

    def add_node(self, name: str) -> None:
        """Add ``name`` with ``vnodes`` points; raise ``ValueError`` if it is already present."""
        self._insert_node(name)
        self._rebuild()

    def remove_node(self, name: str) -> None:
        """Remove ``name`` and its points; raise ``KeyError`` if it is not on the ring."""
        if name not in self._nodes:
            raise KeyError(f"node {name!r} is not on the ring")
        self._nodes.remove(name)
        self._entries = [e for e in self._entries if e[1] != name]
        self._rebuild()

    # -- lookups ------------------------------------------------------------------------------
    def _start(self, key: RingKey) -> int:
        """Index of the first ring point clockwise from the key's point (wrapping to 0)."""
        idx = bisect.bisect_right(self._points, stable_hash(key))
        return 0 if idx == len(self._points) else idx

    def lookup(self, key: RingKey, n: int | None = None) -> list[str]:
        """First ``n`` distinct nodes clockwise from ``key`` (primary first).

        ``n`` defaults to ``replication`` and is capped at the number of nodes; an empty ring
        raises ``LookupError``.
        """
        if not self._nodes:
            raise LookupError("the hash ring has no nodes")
        want = min(self.replication if n is None else n, len(self._nodes))
        if want < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        out: list[str] = []
        i = self._start(key)
        m = len(self._owners)
        while len(out) < want:
            owner = self._owners[i]
            if owner not in out:
                out.append(owner)
            i = i + 1 if i + 1 < m else 0
        return out

    def primaries(self, keys: Sequence[RingKey]) -> list[str]:
        """Primary node of each key (vectorised ``lookup(key, 1)[0]``), in input order."""
        if not self._nodes:
            raise LookupError("the hash ring has no nodes")
        points = np.fromiter((stable_hash(k) for k in keys), dtype=np.uint64, count=len(keys))
        idx = np.searchsorted(np.asarray(self._points, dtype=np.uint64), points, side="right")
        idx[idx == len(self._points)] = 0
        return [self._owners[i] for i in idx.tolist()]

    def capacity(self, n_keys: int) -> int | None:
        """Bounded-load cap per node for ``n_keys`` keys, or ``None`` without ``load_factor``."""
        if self.load_factor is None or not self._nodes:
            return None
        r = min(self.replication, len(self._nodes))
        return math.ceil(self.load_factor * n_keys * r / len(self._nodes))

    def assign(self, keys: Sequence[RingKey]) -> dict[RingKey, list[str]]:
        """Replica lists for every (distinct) key, in input order.

        Without ``load_factor`` this equals ``{k: lookup(k)}``. With it, no node receives more
        than :meth:`capacity` replicas; keys are placed in input order, so the same key
        sequence always yields the same assignment.
        """
        unique = list(dict.fromkeys(keys))
        if self.load_factor is None:
            return {k: self.lookup(k) for k in unique}
        if not self._nodes:
            raise LookupError("the hash ring has no nodes")
        cap = self.capacity(len(unique))
        assert cap is not None
        r = min(self.replication, len(self._nodes))
        load = dict.fromkeys(self._nodes, 0)
        holders: dict[str, list[RingKey]] = {name: [] for name in self._nodes}
        out: dict[RingKey, list[str]] = {}
        m = len(self._owners)
        for key in unique:
            chosen: list[str] = []
            out[key] = chosen
            i = self._start(key)
            steps = 0
            while len(chosen) < r and steps < m:
                owner = self._owners[i]
                if owner not in chosen and load[owner] < cap:
                    chosen.append(owner)
                    load[owner] += 1
                    holders[owner].append(key)
                i = i + 1 if i + 1 < m else 0
                steps += 1
            while len(chosen) < r:
                # Every node not in `chosen` is full; free a slot (keeps load <= cap).
                self._make_room(key, chosen, out, load, holders, cap)
        return out

    @staticmethod
    def _make_room(
        key: RingKey,
        chosen: list[str],
        out: dict[RingKey, list[str]],
        load: dict[str, int],
        holders: dict[str, list[RingKey]],
        cap: int,
    ) -> None:
        """Move one replica of an earlier key from a full node ``y`` (not in ``chosen``) to a
        node ``x`` in ``chosen`` with spare room, then give ``y``'s freed slot to ``key``.

        Such a pair exists whenever total capacity suffices: ``x`` holds fewer than ``cap``
        keys and ``y`` holds ``cap``, so some key on ``y`` is not on ``x``.
        """
        spare = [x for x in chosen if load[x] < cap]
        for y in sorted(load):
            if y in chosen or load[y] < cap:
                continue
            for x in spare:
                for other in holders[y]:
                    replicas = out[other]
                    if x in replicas:
                        continue
                    replicas[replicas.index(y)] = x
                    holders[y].remove(other)
                    holders[x].append(other)
                    load[x] += 1
                    chosen.append(y)
                    holders[y].append(key)
                    return
        raise RuntimeError("bounded-load assignment found no room; load_factor must be >= 1")
