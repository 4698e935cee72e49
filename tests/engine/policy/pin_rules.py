"""Pin/unpin rules shared by the policy state machines.

A machine mixes in :class:`PinRules` and has ``self.cache`` (a ``TierCache``). It may override
``pin_counts`` (where the reference model keeps its pin counts), ``pinnable`` (the resident
keys of the model) and ``mirror_pin``/``mirror_unpin`` (a second cache to keep in step).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule


class PinRules:
    cache: Any
    pins: dict[int, int]

    def pin_counts(self) -> dict[int, int]:
        return self.pins

    def pinnable(self) -> list[int]:
        return sorted(self.cache)

    def mirror_pin(self, key: int) -> None:
        """Pin ``key`` in a second cache that must stay in step (none by default)."""

    def mirror_unpin(self, key: int) -> None:
        """Unpin ``key`` in that second cache (none by default)."""

    @precondition(lambda self: len(self.pinnable()) > 0)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.pinnable()))
        self.cache.pin(key)
        self.mirror_pin(key)
        pins = self.pin_counts()
        pins[key] = pins.get(key, 0) + 1

    @precondition(lambda self: len(self.pin_counts()) > 0)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        pins = self.pin_counts()
        key = data.draw(st.sampled_from(sorted(pins)))
        self.cache.unpin(key)
        self.mirror_unpin(key)
        pins[key] -= 1
        if not pins[key]:
            del pins[key]
