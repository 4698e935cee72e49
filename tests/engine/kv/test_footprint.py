"""KV storage footprint by layout (R12): hand computations and a slot-by-slot reference."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from engine.kv import AttentionMemoryModel, KvStorageModel, contiguous_regrowth


def _reference_high_water(context: int, initial: int, growth: float) -> int:
    """First fit written out on a slot map: a buffer goes at the lowest address whose
    ``need`` slots are all free (slots past the top are free); the old buffer is freed after
    the copy. Independent of the free-range bookkeeping of the module under test."""
    used: list[bool] = []

    def place(need: int) -> int:
        s = 0
        while True:
            window = used[s : s + need]
            if not any(window):
                used.extend([False] * max(0, s + need - len(used)))
                for i in range(s, s + need):
                    used[i] = True
                return s
            s += 1 + max(i for i, u in enumerate(window) if u)

    cap = initial
    start = place(cap)
    high = len(used)
    while cap < context:
        new = max(cap + 1, math.ceil(cap * growth))
        new_start = place(new)
        high = max(high, len(used))
        for i in range(start, start + cap):
            used[i] = False
        start, cap = new_start, new
    return high


def test_the_docstring_example_by_hand() -> None:
    r = contiguous_regrowth(21, 4, 1.5)
    assert r.placements == ((0, 4), (4, 6), (10, 9), (19, 14), (33, 21))
    assert r.high_water == 54 and r.copied == 4 + 6 + 9 + 14
    assert KvStorageModel("chunked", chunk_tokens=4).slots(21) == 24


#: 512-token start, 1.5x regrowth: capacities 512, 768, 1152, 1728, 2592, 3888, 5832, 8748,
#: 13122, 19683, 29525, 44288, 66432. Worked on paper: 3888 fits the coalesced free
#: [0, 4160) (no new top: 6752 stays), 5832 starts in the free range touching the top at
#: 3888 (top 9720), 29525 fits the free [0, 31590) (top stays 51273), 44288 starts at 29525
#: (top 73813), 66432 fits nowhere below (top 140245).
HAND_512 = [
    (1, 512),
    (512, 512),
    (513, 1280),
    (769, 2432),
    (1153, 4160),
    (1729, 6752),
    (2593, 6752),
    (3889, 9720),
    (5833, 18468),
    (8749, 31590),
    (13123, 51273),
    (19684, 51273),
    (29526, 73813),
    (44288, 73813),
    (44289, 140245),
]


@pytest.mark.parametrize(("context", "slots"), HAND_512)
def test_contiguous_high_water_by_hand(context: int, slots: int) -> None:
    m = KvStorageModel("contiguous", chunk_tokens=512, growth=1.5)
    assert m.slots(context) == slots
    assert m.bytes(context, 131072) == slots * 131072


@settings(max_examples=150)
@given(
    context=st.integers(0, 3000),
    initial=st.integers(1, 64),
    growth=st.sampled_from([1.25, 1.5, 1.618, 2.0, 3.0]),
)
def test_contiguous_matches_the_slot_map_reference(
    context: int, initial: int, growth: float
) -> None:
    r = contiguous_regrowth(context, initial, growth)
    assert r.high_water == _reference_high_water(context, initial, growth)
    assert r.capacity >= context
    # the old and the new buffer of every regrowth are disjoint (both live during the copy)
    for (s0, c0), (s1, c1) in zip(r.placements, r.placements[1:], strict=False):
        assert s0 + c0 <= s1 or s1 + c1 <= s0
    # never less than the live pair at the last regrowth, never more than all buffers
    if len(r.placements) > 1:
        assert r.high_water >= r.placements[-2][1] + r.placements[-1][1]
    assert r.high_water <= sum(c for _, c in r.placements)


@given(
    layout=st.sampled_from(["paged", "chunked", "contiguous"]),
    a=st.integers(0, 20000),
    b=st.integers(0, 20000),
)
def test_slots_hold_the_context_and_never_shrink(layout: str, a: int, b: int) -> None:
    m = KvStorageModel(layout, block_tokens=64, chunk_tokens=512)  # type: ignore[arg-type]
    lo, hi = sorted((a, b))
    assert m.slots(hi) >= hi
    assert m.slots(lo) <= m.slots(hi)


def test_chunked_and_paged_are_whole_pieces() -> None:
    assert KvStorageModel("chunked", chunk_tokens=512).slots(1100) == 1536
    assert KvStorageModel("paged", block_tokens=64).slots(1100) == 1152
    assert KvStorageModel("paged").slots(0) == 0


def test_max_context_with_contiguous_storage_by_hand() -> None:
    # Llama-3.1-8B-shaped: 128 KiB of KV per token, chunked attention scratch
    bpt, gather, score = 131072, 2 * 8 * 128 * 4, 32 * 4
    scratch = 512 * gather + 512 * 512 * score
    budget = 73813 * bpt + scratch  # exactly what 44,288 tokens need (HAND_512)
    cont = AttentionMemoryModel(bpt, gather, score, storage=KvStorageModel("contiguous"))
    chunk = AttentionMemoryModel(bpt, gather, score, storage=KvStorageModel("chunked"))
    assert cont.max_context(budget, chunked=True) == 44288
    assert cont.max_context(budget - 1, chunked=True) == 29525
    # chunked storage: whole 512-token chunks of the same budget (73813 * bpt + scratch)
    assert chunk.max_context(budget, chunked=True) == (73813 // 512) * 512


def test_bad_storage_parameters_are_input_errors() -> None:
    with pytest.raises(InputError, match="layout"):
        KvStorageModel("ring")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="growth"):
        KvStorageModel("contiguous", growth=1.0)
    with pytest.raises(InputError, match="chunk_tokens"):
        KvStorageModel("chunked", chunk_tokens=0)
    with pytest.raises(InputError, match="initial_tokens"):
        contiguous_regrowth(10, 0)
