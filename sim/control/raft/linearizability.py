"""Linearizability check of a key-value register history (Wing & Gong 1993, with the
memoisation of Lowe 2017).

A history is a list of :class:`sim.control.raft.client.HistoryOp`. Linearizability is *local*, so the
history is split by key and each key's sub-history is checked alone as a single register
(initial value ``None``). For one key the search linearizes operations one at a time: an
operation may go next when no other remaining operation *responded* before it was *invoked*;
a ``put`` sets the register, a ``get`` must return the register's value. A state
``(set of linearized ops, register value)`` that failed once is never explored again.

Operations whose outcome is unknown (``response is None``, the client gave up): a ``put`` may
or may not have taken effect at any time after its invocation, so it is optional with an
infinite response time; an unknown ``get`` constrains nothing and is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sim.control.raft.client import HistoryOp


class SearchBudgetExceeded(RuntimeError):
    """The search visited more states than allowed; the answer is unknown."""


@dataclass(frozen=True, slots=True)
class _Op:
    kind: str
    value: Any
    invoke: float
    response: float  # math.inf when unknown
    result: Any
    required: bool


def _freeze(v: Any) -> Hashable:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v  # type: ignore[no-any-return]


def check_register(ops: Sequence[HistoryOp], max_states: int = 200_000, max_ops: int = 400) -> bool:
    """Is this single-key history linearizable? Raises :class:`SearchBudgetExceeded` when
    the search needs more than ``max_states`` memoised states, or the key has more than
    ``max_ops`` operations (the search recurses once per operation) -- meant for the client
    histories of small runs."""
    items: list[_Op] = []
    for h in sorted(ops, key=lambda h: (h.invoke, h.client)):
        if h.op not in ("put", "get"):
            continue
        if h.response is None:
            if h.op == "put":
                items.append(_Op("put", _freeze(h.value), h.invoke, math.inf, None, False))
            continue
        items.append(_Op(h.op, _freeze(h.value), h.invoke, h.response, _freeze(h.result), True))
    n = len(items)
    if n > max_ops:
        raise SearchBudgetExceeded(f"{n} operations on one key; the limit is {max_ops}")
    required_mask = sum(1 << i for i, o in enumerate(items) if o.required)
    failed: set[tuple[int, Hashable]] = set()

    def search(done: int, value: Hashable) -> bool:
        if done & required_mask == required_mask:
            return True
        key = (done, value)
        if key in failed:
            return False
        if len(failed) >= max_states:
            raise SearchBudgetExceeded(f"more than {max_states} states")
        # earliest response among remaining ops bounds which ops may go next
        horizon = min(
            (o.response for i, o in enumerate(items) if not done >> i & 1), default=math.inf
        )
        for i, o in enumerate(items):
            if done >> i & 1 or o.invoke > horizon:
                continue
            if o.kind == "put":
                if search(done | 1 << i, o.value):
                    return True
            elif o.result == value and search(done | 1 << i, value):
                return True
        failed.add(key)
        return False

    return search(0, None) if n else True


def check_history(history: Iterable[HistoryOp], max_states: int = 200_000) -> list[str]:
    """Check every key of a KV history; return the keys (sorted) that are NOT linearizable."""
    by_key: dict[str, list[HistoryOp]] = {}
    for h in history:
        by_key.setdefault(h.key, []).append(h)
    return [k for k in sorted(by_key) if not check_register(by_key[k], max_states)]
