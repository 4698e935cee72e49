"""``KVBlockAllocator.append_many`` (the simulator's bulk KV growth) against one ``append`` call
per item, in order: the reference model.

Two allocators get the same random calls; one appends a batch with ``append_many``, the other
with a loop of ``append``. After every call their block tables, token counts, refcounts, free
lists (order included: it decides which ids later sequences get), pool sizes, preemptions and
errors must be equal. Batches are long enough to outgrow the free list (pool growth, and under
``on_full="preempt"`` preemption, take the general path part-way), and some prompts carry
hash ids so the keyed path (shared blocks, copy-on-write) is covered too.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv import KVBlockAllocator, KVOutOfBlocks

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 90), st.booleans()),
        st.tuples(
            st.just("bulk"),
            st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 40)), max_size=12),
            st.just(False),
        ),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(False)),
    ),
    min_size=1,
    max_size=50,
)


def _make(on_full: str) -> KVBlockAllocator:
    return KVBlockAllocator(
        block_tokens=8,
        initial_blocks=4,
        max_bytes=48 * 8,
        on_full=on_full,  # type: ignore[arg-type]
    )


def _state(a: KVBlockAllocator) -> tuple[object, ...]:
    return (
        {s: list(t) for s, t in a._tables.items()},
        dict(a._ntok),
        list(a._ref),
        list(a._free),
        a.pool_blocks,
        a.stats,
    )


@pytest.mark.parametrize("on_full", ["fail", "preempt"])
@settings(max_examples=150)
@given(ops=_OPS)
def test_append_many_equals_one_append_per_item(on_full: str, ops: list) -> None:
    bulk, ref = _make(on_full), _make(on_full)
    for step, (op, arg, keyed) in enumerate(ops):
        live = bulk.sequences()
        assert live == ref.sequences()
        outcomes = []
        for a in (bulk, ref):
            try:
                if op == "alloc" or not live:
                    n = arg if isinstance(arg, int) else 5
                    ids = [f"p{i}" for i in range(-(-n // 8))] if keyed else None
                    outcomes.append(a.allocate(step, n, hash_ids=ids))
                elif op == "bulk":
                    items = [(live[p % len(live)], n) for p, n in arg]
                    if a is bulk:
                        outcomes.append(a.append_many(items))
                    else:
                        got: list[object] = []
                        for s, n in items:
                            got.extend(a.append(s, n))
                        outcomes.append(tuple(got))
                else:
                    outcomes.append(a.free(live[arg % len(live)]))
            except KVOutOfBlocks as err:
                outcomes.append(("out", err.needed, err.available))
            except KeyError as err:  # an item naming a sequence preempted earlier in the batch
                outcomes.append(("gone", str(err)))
        assert outcomes[0] == outcomes[1]
        assert _state(bulk) == _state(ref)
        bulk.check_invariants()


def test_append_many_takes_one_block_per_crossed_boundary() -> None:
    a = KVBlockAllocator(block_tokens=16, initial_blocks=64)
    a.allocate("x", 16)  # one full block
    a.allocate("y", 5)
    assert a.append_many([("x", 1), ("y", 11), ("x", 15)]) == ()
    assert a.num_tokens("x") == 32 and len(a.block_table("x")) == 2
    assert a.num_tokens("y") == 16 and len(a.block_table("y")) == 1
    assert a.num_used_blocks == 3
    with pytest.raises(ValueError, match="cannot append -1"):
        a.append_many([("x", -1)])


_GROWTH = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 90), st.booleans()),
        st.tuples(
            st.just("extend"),
            st.lists(st.tuples(st.integers(0, 1000), st.integers(-2, 40)), max_size=12),
            st.integers(0, 50),
        ),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(False)),
    ),
    min_size=1,
    max_size=50,
)


@pytest.mark.parametrize("on_full", ["fail", "preempt"])
@settings(max_examples=150)
@given(ops=_GROWTH)
def test_extend_to_equals_one_append_per_sequence(on_full: str, ops: list) -> None:
    """``extend_to(seq_ids, base, step)`` against ``append(s, base[s] + step - tokens)`` per
    sequence, in order (targets a few tokens below the count too: the shrink error)."""
    bulk, ref = _make(on_full), _make(on_full)
    for n_op, (op, arg, extra) in enumerate(ops):
        live = bulk.sequences()
        assert live == ref.sequences()
        outcomes = []
        if op == "extend" and live:
            seqs = [live[p % len(live)] for p, _ in arg]
            step = extra
            base = {s: bulk.num_tokens(s) + d - step for s, (_, d) in zip(seqs, arg, strict=True)}
        for a in (bulk, ref):
            try:
                if op == "alloc" or not live:
                    n = arg if isinstance(arg, int) else 5
                    ids = [f"p{i}" for i in range(-(-n // 8))] if extra is True else None
                    outcomes.append(a.allocate(n_op, n, hash_ids=ids))
                elif op == "extend":
                    if a is bulk:
                        outcomes.append(a.extend_to(seqs, base, step))
                    else:
                        got: list[object] = []
                        for s in seqs:
                            got.extend(a.append(s, base[s] + step - a.num_tokens(s)))
                        outcomes.append(tuple(got))
                else:
                    outcomes.append(a.free(live[arg % len(live)]))
            except KVOutOfBlocks as err:
                outcomes.append(("out", err.needed, err.available))
            except KeyError as err:  # a sequence preempted earlier in the batch
                outcomes.append(("gone", str(err)))
            except ValueError:  # a target below the sequence's count
                outcomes.append("shrink")
        assert outcomes[0] == outcomes[1]
        assert _state(bulk) == _state(ref)
        bulk.check_invariants()


def test_extend_to_refuses_to_shrink() -> None:
    a = KVBlockAllocator(block_tokens=16, initial_blocks=64)
    a.allocate("x", 20)
    assert a.extend_to(["x"], {"x": 30}, 2) == ()
    assert a.num_tokens("x") == 32 and len(a.block_table("x")) == 2
    with pytest.raises(ValueError, match="cannot shrink to 31"):
        a.extend_to(["x"], {"x": 30}, 1)
