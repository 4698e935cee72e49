"""Colour-aware LRU (R13, "cache colouring"): per-colour capacity reservations.

Every object carries a colour -- the model or tenant it belongs to -- given to ``insert``;
``None`` means the colour ``"default"`` (so a caller's own colour named ``"default"`` shares
that bucket). Each colour may reserve a share of the cache (``shares``, fractions of capacity
summing to at most 1); a colour absent from ``shares`` reserves nothing.

Victim rule (documented contract, tested in ``tests/engine/policy/test_color_lru.py``):

1. A colour is *over share* when its resident bytes exceed its reserved bytes
   (``floor(share * capacity)``, fixed by :meth:`ColorLRUPolicy.attach`).
2. Among the over-share colours, take each one's least recently used unpinned object; the
   victim is the one of these referenced longest ago (global recency decides between
   colours, LRU decides within one).
3. Only when no over-share colour has an unpinned object, fall back to global LRU: the least
   recently used unpinned object of any colour.

Consequence (the isolation invariant): a colour holding no more than its reservation never
loses an object while some over-share colour still has an unpinned object, so one model's
burst cannot flush another model's working set. With ``shares={}`` every colour reserves 0
bytes, every non-empty colour is over share, and the rule is exactly plain LRU.

Cost: a hit is O(1); ``victim`` is O(#colours) plus the pinned objects it skips.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Iterator, Mapping

from engine.policy.base import EvictionPolicy, Key
from engine.policy.registry import register

DEFAULT_COLOR = "default"


def _validated_shares(shares: Mapping[str, float] | None) -> dict[str, float]:
    """Check ``shares`` (each in [0, 1], sum <= 1) and return a plain, sorted dict copy."""
    if shares is None:
        return {}
    if not isinstance(shares, Mapping):
        raise ValueError(f"shares must be a mapping colour -> fraction, got {shares!r}")
    out: dict[str, float] = {}
    for color in sorted(shares, key=str):
        share = shares[color]
        if not isinstance(color, str):
            raise ValueError(f"shares: colour names must be strings, got {color!r}")
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise ValueError(f"shares[{color!r}] must be a number in [0, 1], got {share!r}")
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise ValueError(f"shares[{color!r}] must be in [0, 1], got {share!r}")
        out[color] = float(share)
    total = math.fsum(out.values())
    if total > 1.0 + 1e-9:
        raise ValueError(
            f"shares must sum to at most 1 (fractions of capacity), got {total:g} "
            f"from {', '.join(f'{c}={s:g}' for c, s in out.items())}"
        )
    return out


@register("color-lru")
class ColorLRUPolicy(EvictionPolicy):
    """LRU with a reserved share of capacity per colour; see the module docstring.

    ``shares`` maps colour -> reserved fraction of the capacity (each in [0, 1], sum <= 1);
    invalid shares raise ``ValueError`` (an ``InputError`` through the registry).

    Invariants kept here:

    * ``self._lists[c]`` holds exactly the resident keys of colour ``c``, least recently
      referenced first; an emptied colour's list is deleted, so ``_lists`` never has empty
      values;
    * ``self._last[k]`` is the tick of the last reference to resident ``k``; ticks are unique
      and increase, so comparing the heads of two lists compares global recency;
    * ``self._bytes[c] == sum(size of resident keys of colour c)``.
    """

    def __init__(self, shares: Mapping[str, float] | None = None) -> None:
        self.shares: dict[str, float] = _validated_shares(shares)
        self._reserved: dict[str, int] = {}
        # colour -> (key -> size), least recently used first
        self._lists: dict[str, OrderedDict[Key, int]] = {}
        self._color: dict[Key, str] = {}
        self._last: dict[Key, int] = {}
        self._bytes: dict[str, int] = {}
        self._tick = 0

    def attach(self, capacity: int) -> None:
        self.capacity = capacity
        self._reserved = {c: int(s * capacity) for c, s in self.shares.items()}

    # -- queries used by tests and by owners -----------------------------------------------
    def reserved(self, color: str | None) -> int:
        """Reserved bytes of ``color`` (0 for a colour without a share)."""
        return self._reserved.get(DEFAULT_COLOR if color is None else color, 0)

    def color_bytes(self, color: str | None) -> int:
        """Bytes resident of ``color`` as this policy counts them."""
        return self._bytes.get(DEFAULT_COLOR if color is None else color, 0)

    def over_share(self, color: str | None) -> bool:
        """Whether ``color`` holds more bytes than it reserved (its objects are victims first)."""
        return self.color_bytes(color) > self.reserved(color)

    # -- the policy protocol ----------------------------------------------------------------
    def insert(
        self, key: Key, size: int, now: float, color: str | None = None, cost: float = 0.0
    ) -> None:
        c = DEFAULT_COLOR if color is None else color
        lst = self._lists.get(c)
        if lst is None:
            lst = self._lists[c] = OrderedDict()
        lst[key] = size
        self._color[key] = c
        self._bytes[c] = self._bytes.get(c, 0) + size
        self._tick += 1
        self._last[key] = self._tick

    def hit(self, key: Key, now: float) -> None:
        self._lists[self._color[key]].move_to_end(key)
        self._tick += 1
        self._last[key] = self._tick

    def victim(self, now: float, pinned: Container[Key] = ()) -> Key | None:
        best_over: Key | None = None
        best_over_tick = 0
        best_any: Key | None = None
        best_any_tick = 0
        reserved = self._reserved
        last = self._last
        for c, lst in self._lists.items():
            # The colour's least recently used unpinned key (lists are never empty).
            head: Key | None = None
            for k in lst:
                if k not in pinned:
                    head = k
                    break
            if head is None:
                continue
            t = last[head]
            if self._bytes[c] > reserved.get(c, 0):
                if best_over is None or t < best_over_tick:
                    best_over, best_over_tick = head, t
            elif best_any is None or t < best_any_tick:
                best_any, best_any_tick = head, t
        if best_over is not None:
            return best_over
        # Fallback (rule 3): no over-share colour has an evictable object -> global LRU.
        return best_any

    def remove(self, key: Key, now: float, evicted: bool) -> None:
        c = self._color.pop(key)
        lst = self._lists[c]
        size = lst.pop(key)
        if not lst:
            del self._lists[c]
        self._bytes[c] -= size
        del self._last[key]

    def __contains__(self, key: object) -> bool:
        return key in self._color

    def __len__(self) -> int:
        return len(self._color)

    def __iter__(self) -> Iterator[Key]:
        """Resident keys in global recency order, least recently used first."""
        last = self._last
        return iter(sorted(self._color, key=last.__getitem__))
