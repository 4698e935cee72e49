"""Freeing a sequence (``BlockStates._drop``): the fast path (no content key anywhere) against the general loop.

The reference allocator is the same class with a dummy entry in its key map, which forces
``_drop`` down the general tail-first loop while every other method behaves the same
(unkeyed ``allocate`` and ``append`` never read the key map). Both are driven by the same
random length-only calls (the simulator's use); after every call their block tables, refcounts
and free lists (order included: it decides which ids later sequences get) must be equal.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.kv import KVBlockAllocator, KVOutOfBlocks

_OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "append", "free"]), st.integers(0, 200), st.integers()),
    min_size=1,
    max_size=60,
)


def _pair(on_full: str) -> tuple[KVBlockAllocator, KVBlockAllocator]:
    def make() -> KVBlockAllocator:
        return KVBlockAllocator(
            block_tokens=8,
            initial_blocks=4,
            max_bytes=40 * 8,
            on_full=on_full,  # type: ignore[arg-type]
        )

    fast, slow = make(), make()
    slow._kblock[("not-a-block",)] = -1  # type: ignore[index]  # forces the general loop
    return fast, slow


def _state(a: KVBlockAllocator) -> tuple[object, ...]:
    return ({s: list(t) for s, t in a._tables.items()}, list(a._ref), list(a._free), a.pool_blocks)


@pytest.mark.parametrize("on_full", ["fail", "preempt"])
@given(ops=_OPS)
def test_fast_release_equals_the_general_loop(on_full: str, ops: list) -> None:
    fast, slow = _pair(on_full)
    for step, (op, n, pick) in enumerate(ops):
        live = fast.sequences()
        outcomes = []
        for a in (fast, slow):
            try:
                if op == "alloc" or not live:
                    outcomes.append(a.allocate(step, n))
                elif op == "append":
                    outcomes.append(a.append(live[pick % len(live)], n % 20))
                else:
                    outcomes.append(a.free(live[pick % len(live)]))
            except KVOutOfBlocks as err:
                outcomes.append(("out", err.needed, err.available))
        assert outcomes[0] == outcomes[1]
        assert _state(fast) == _state(slow)
        fast.check_invariants()
    # everything released: every block free again, in the same order
    for s in fast.sequences():
        fast.free(s)
        slow.free(s)
    assert _state(fast) == _state(slow)
    assert fast.num_free_blocks == fast.pool_blocks


def test_free_list_order_is_tail_first() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=8)
    a.allocate("x", 24)  # blocks 0, 1, 2
    table = a.block_table("x")
    before = list(a._free)
    a.free("x")
    assert a._free == before + table[::-1]
    assert all(a.refcount(b) == 0 for b in table)


def test_check_invariants_rejects_a_shared_block_without_a_key() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=8)
    a.allocate("x", 8)
    a.allocate("y", 8)
    shared = a.block_table("x")[0]
    a.free("y")
    a._tables["y"] = [shared]  # corrupt: two holders of an unkeyed block
    a._ntok["y"] = 8
    a._ref[shared] = 2
    with pytest.raises(AssertionError, match="no key"):
        a.check_invariants()
