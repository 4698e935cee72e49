"""Example-based tests of KVBlockAllocator: validation, growth, prefix sharing, out-of-blocks
behaviour, copy-on-write, offload round trips and fragmentation figures."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import InputError
from engine.kv import (
    ALLOWED_BLOCK_TOKENS,
    UNBOUNDED,
    KVBlockAllocator,
    KVOutOfBlocks,
    growth_sequence,
    make_offload_tiers,
)


# -- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize("bt", ALLOWED_BLOCK_TOKENS)
def test_every_power_of_two_from_8_to_512_is_accepted(bt: int) -> None:
    a = KVBlockAllocator(block_tokens=bt, bytes_per_token=2)
    a.allocate("s", 3 * bt + 1)
    assert len(a.block_table("s")) == 4
    assert a.block_bytes == 2 * bt


@pytest.mark.parametrize("bt", [0, 1, 4, 7, 12, 48, 100, 1024, 2048, -64, True, 64.0, "64"])
def test_other_block_sizes_are_refused_with_the_allowed_set(bt: object) -> None:
    with pytest.raises(InputError) as err:
        KVBlockAllocator(block_tokens=bt)  # type: ignore[arg-type]
    msg = str(err.value)
    assert "block_tokens" in msg and "8, 16, 32, 64, 128, 256, 512" in msg
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"bytes_per_token": 0}, "bytes_per_token"),
        ({"growth": 1.0}, "growth"),
        ({"initial_blocks": 0}, "initial_blocks"),
        ({"max_bytes": 10, "bytes_per_token": 1}, "smaller than one block"),
        ({"max_bytes": "12 GBB"}, "max_bytes"),
        ({"on_full": "crash"}, "fail, preempt"),
        ({"chunk_tokens": 100}, "chunk_tokens"),
        ({"chunk_tokens": 32}, "chunk_tokens"),
        ({"cached_policy": "nope"}, "unknown eviction policy"),
    ],
)
def test_bad_configuration_is_an_input_error(kwargs: dict, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        KVBlockAllocator(**kwargs)


def test_max_bytes_accepts_human_units() -> None:
    a = KVBlockAllocator(block_tokens=64, bytes_per_token=1024, max_bytes="1MiB")
    assert a.cap_blocks == 16


# -- growth ------------------------------------------------------------------------------------
def test_growth_sequence_is_geometric_1_5_and_capped() -> None:
    assert growth_sequence(4, 1.5, 30) == [4, 6, 9, 14, 21, 30]
    assert growth_sequence(1, 1.5, 5) == [1, 2, 3, 5]  # at least one block per step
    assert growth_sequence(8, 2.0, 8) == [8]


def test_pool_grows_on_demand_along_the_sequence_and_never_past_the_cap() -> None:
    a = KVBlockAllocator(block_tokens=8, bytes_per_token=1, initial_blocks=4, max_bytes=30 * 8)
    for i in range(30):
        a.allocate(i, 8)
        a.check_invariants()
    assert a.growth_history == [4, 6, 9, 14, 21, 30]
    assert a.snapshot()["growth_events"] == 5
    with pytest.raises(KVOutOfBlocks):
        a.allocate("one-more", 1)
    assert a.pool_blocks == 30 and a.grow() == 0


def test_growth_only_appends_ids_so_tables_stay_valid() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=2)
    a.allocate("x", 16)
    before = a.block_table("x")
    a.allocate("y", 80)  # forces several growth steps
    assert a.block_table("x") == before
    assert sorted(a.block_table("x") + a.block_table("y")) == list(range(12))


def test_unbounded_pool_reports_cap_zero() -> None:
    a = KVBlockAllocator(block_tokens=8)
    assert a.cap_blocks == UNBOUNDED
    assert a.snapshot()["cap_blocks"] == 0


# -- prefix sharing ----------------------------------------------------------------------------
def test_shared_prefix_reuses_full_blocks_with_refcounts() -> None:
    a = KVBlockAllocator(block_tokens=8)
    p = list(range(20))  # 2 full blocks + 4 tokens
    a.allocate("a", p)
    r = a.allocate("b", [*p[:16], 99, 98, 97])
    ta, tb = a.block_table("a"), a.block_table("b")
    assert tb[:2] == ta[:2] and tb[2] != ta[2]
    assert r.hit_tokens == 16 and r.loaded_tokens == 0
    assert [a.refcount(b) for b in ta] == [2, 2, 1]
    a.free("a")  # b still holds the prefix
    assert [a.refcount(b) for b in ta[:2]] == [1, 1]
    assert not any(a.is_cached(b) for b in ta[:2])
    assert a.is_cached(ta[2])  # a's own partial block: keyed, so cached
    a.free("b")
    assert all(a.is_cached(b) for b in tb)
    r = a.allocate("c", p)
    assert r.hit_tokens == 20 and a.block_table("c") == ta
    a.check_invariants()


def test_diverging_token_breaks_the_chain_even_if_later_blocks_repeat() -> None:
    a = KVBlockAllocator(block_tokens=8)
    a.allocate("a", list(range(24)))
    r = a.allocate("b", [100, *range(1, 24)])  # first block differs
    assert r.hit_tokens == 0
    assert set(a.block_table("a")).isdisjoint(a.block_table("b"))


def test_partial_last_block_only_matches_the_same_token_count() -> None:
    a = KVBlockAllocator(block_tokens=8)
    a.allocate("a", 12, hash_ids=[7, 8])
    r = a.allocate("b", 16, hash_ids=[7, 8])  # id 8 as a full block: different content
    assert r.hit_tokens == 8
    r = a.allocate("c", 12, hash_ids=[7, 8])
    assert r.hit_tokens == 12 and a.block_table("c") == a.block_table("a")


def test_too_many_hash_ids_is_an_input_error() -> None:
    a = KVBlockAllocator(block_tokens=8)
    with pytest.raises(InputError, match="hash_ids"):
        a.allocate("a", 9, hash_ids=[1, 2, 3])
    assert a.sequences() == []


def test_chained_hash_ids_only_match_the_same_chain() -> None:
    a = KVBlockAllocator(block_tokens=8, chain_hash_ids=True)
    a.allocate("a", 16, hash_ids=[1, 2])
    assert a.allocate("b", 16, hash_ids=[3, 2]).hit_tokens == 0
    assert a.allocate("c", 16, hash_ids=[1, 2]).hit_tokens == 16


def test_append_into_shared_partial_block_copies_on_write() -> None:
    a = KVBlockAllocator(block_tokens=8, record_moves=True)
    p = list(range(12))
    a.allocate("a", p)
    a.allocate("b", p)
    shared = a.block_table("a")[1]
    assert a.block_table("b")[1] == shared and a.refcount(shared) == 2
    assert a.append("b", 1) == ()
    new = a.block_table("b")[1]
    assert new != shared and a.refcount(shared) == 1 and a.refcount(new) == 1
    assert a.take_copies() == [(shared, new)] and a.take_copies() == []
    a.append("a", 1)  # sole holder now: writes in place
    assert a.block_table("a")[1] == shared and a.take_copies() == []
    a.check_invariants()


def test_append_takes_a_new_block_exactly_when_the_last_fills() -> None:
    a = KVBlockAllocator(block_tokens=8)
    a.allocate("s", 7)
    a.append("s", 1)
    assert len(a.block_table("s")) == 1 and a.num_tokens("s") == 8
    a.append("s", 1)
    assert len(a.block_table("s")) == 2
    a.append("s", 16)
    assert len(a.block_table("s")) == 4 and a.num_tokens("s") == 25


def test_errors_for_misuse() -> None:
    a = KVBlockAllocator(block_tokens=8)
    a.allocate("s", 3)
    with pytest.raises(ValueError, match="already"):
        a.allocate("s", 3)
    with pytest.raises(KeyError):
        a.free("nobody")
    with pytest.raises(ValueError):
        a.append("s", -1)
    with pytest.raises(ValueError):
        a.allocate("t", -1)


# -- out of blocks -----------------------------------------------------------------------------
def test_fail_policy_raises_and_changes_nothing() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=2, max_bytes=4 * 8)
    a.allocate("a", 24)
    table, snap = a.block_table("a"), a.snapshot()
    with pytest.raises(KVOutOfBlocks) as err:
        a.allocate("b", 16)
    assert (err.value.needed, err.value.available) == (2, 1)
    assert a.sequences() == ["a"] and a.block_table("a") == table and a.snapshot() == snap
    a.append("a", 8)
    with pytest.raises(KVOutOfBlocks):
        a.append("a", 1)
    assert a.num_tokens("a") == 32
    a.check_invariants()


def test_cached_blocks_are_evicted_before_failing() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=4, max_bytes=4 * 8)
    a.allocate("a", list(range(32)))
    a.free("a")
    assert a.num_cached_blocks == 4
    a.allocate("b", 16)
    assert a.num_cached_blocks == 2 and a.snapshot()["evictions"] == 2
    # the tail blocks went first, so the head of the prefix is still reusable
    assert a.allocate("c", list(range(16))).hit_tokens == 16


def test_preempt_policy_frees_the_newest_sequences_first() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=6, max_bytes=6 * 8, on_full="preempt")
    for s in ("old", "mid", "new"):
        a.allocate(s, 16)
    r = a.allocate("big", 32)
    assert r.preempted == ("new", "mid")
    assert a.sequences() == ["old", "big"]
    assert a.snapshot()["preemptions"] == 2
    # appending to the newest sequence when full preempts that sequence itself
    assert a.append("big", 8) == ("big",)
    assert a.sequences() == ["old"]
    a.check_invariants()


def test_a_prompt_larger_than_the_cap_fails_even_when_preempting() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=2, max_bytes=2 * 8, on_full="preempt")
    a.allocate("a", 8)
    with pytest.raises(KVOutOfBlocks):
        a.allocate("b", 17)
    assert a.sequences() == ["a"]


# -- offload -----------------------------------------------------------------------------------
def test_offload_round_trip_counts_bytes_per_tier() -> None:
    bb = 8 * 4  # block bytes
    tiers = make_offload_tiers(host_bytes=2 * bb, ssd_bytes=4 * bb)
    a = KVBlockAllocator(
        block_tokens=8,
        bytes_per_token=4,
        initial_blocks=3,
        max_bytes=3 * bb,
        offload_tiers=tiers,
        record_moves=True,
    )
    p = list(range(24))
    a.allocate("a", p)
    a_table, a_keys = a.block_table("a"), [a.key_of(b) for b in a.block_table("a")]
    a.free("a")  # 3 cached blocks
    a.allocate("b", [1000 + t for t in range(24)])  # evicts all 3 to host, host spills 1 to ssd
    s = a.snapshot()
    assert s["evictions"] == 3
    assert (s["host_bytes_in"], s["host_bytes_out"], s["host_resident_bytes"]) == (
        3 * bb,
        bb,
        2 * bb,
    )
    assert (s["ssd_bytes_in"], s["ssd_resident_bytes"]) == (bb, bb)
    # the engine is told to copy each evicted block out before it is rewritten (tail first)
    assert a.take_transfers() == [("offload", a_keys[i], a_table[i], "host") for i in (2, 1, 0)]
    a.free("b")
    r = a.allocate("c", p)  # the prefix comes back from host and ssd, not recomputed
    assert (r.hit_tokens, r.loaded_tokens) == (0, 24)
    moves = a.take_transfers()
    loads = [m for m in moves if m[0] == "load"]
    assert [(m[1], m[2]) for m in loads] == list(zip(a_keys, a.block_table("c"), strict=True))
    assert sorted(m[3] for m in loads) == ["host", "host", "ssd"]
    s = a.snapshot()
    assert s["loaded_blocks"] == 3
    assert s["host_bytes_loaded_back"] + s["ssd_bytes_loaded_back"] == 3 * bb
    for name in ("host", "ssd"):  # bytes in - bytes out == resident, per tier
        assert s[f"{name}_bytes_in"] - s[f"{name}_bytes_out"] == s[f"{name}_resident_bytes"]
    assert s["prefix_hit_rate"] == 3 / 9
    a.check_invariants()


def test_blocks_dropped_from_the_last_tier_are_recomputed() -> None:
    bb = 8
    a = KVBlockAllocator(
        block_tokens=8,
        initial_blocks=1,
        max_bytes=bb,
        offload_tiers=make_offload_tiers(host_bytes=bb),
    )
    a.allocate("a", list(range(8)))
    a.free("a")
    a.allocate("b", list(range(100, 108)))  # a's block -> host
    a.free("b")
    a.allocate("c", list(range(200, 208)))  # b's block -> host, a's dropped
    a.free("c")
    s = a.snapshot()
    assert s["host_bytes_dropped"] == bb
    assert a.allocate("d", list(range(8))).loaded_tokens == 0
    a.free("d")
    assert a.allocate("e", list(range(100, 108))).loaded_tokens == 0  # c's block evicted it
    a.check_invariants()


# -- fragmentation and chunks ------------------------------------------------------------------
def test_snapshot_fragmentation_figures() -> None:
    a = KVBlockAllocator(block_tokens=8, initial_blocks=8, max_bytes=8 * 8)
    a.allocate("a", 10)  # blocks 0,1 -> 6 slots wasted
    a.allocate("b", 3)  # block 2 -> 5 wasted
    a.allocate("c", 16)  # blocks 3,4 -> 0 wasted
    a.free("b")
    s = a.snapshot()
    assert a.block_table("a") == [0, 1] and a.block_table("c") == [3, 4]
    assert s["slot_waste_tokens"] == 6
    assert s["slot_waste_fraction"] == 6 / 32
    assert s["used_blocks"] == 4 and s["free_blocks"] == 4 and s["cached_blocks"] == 0
    assert s["pool_free_fraction"] == 0.5
    assert s["largest_contiguous_free_run"] == 3  # ids 5, 6, 7 (2 is alone)
    assert s["pool_bytes"] == 64 and s["used_bytes"] == 32


def test_shared_blocks_count_once_in_slot_waste() -> None:
    a = KVBlockAllocator(block_tokens=8)
    a.allocate("a", list(range(12)))
    a.allocate("b", list(range(12)))
    assert a.snapshot()["slot_waste_tokens"] == 4


def test_chunks_split_the_table_into_whole_chunk_block_lists() -> None:
    a = KVBlockAllocator(block_tokens=64, chunk_tokens=256)
    a.allocate("s", 64 * 9 + 1)
    table, chunks = a.block_table("s"), a.chunks("s")
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert [b for c in chunks for b in c] == table


# -- every registered eviction policy can rank cached blocks -----------------------------------
def _buildable_policies() -> list[str]:
    from engine.policy import make_policy, policy_names

    names = []
    for name in policy_names():
        try:
            make_policy(name)
        except InputError:  # needs parameters (e.g. opt needs the future trace)
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("policy", _buildable_policies())
def test_random_workload_keeps_invariants_with_every_policy(policy: str) -> None:
    rng = np.random.default_rng(7)
    bb = 8 * 2
    a = KVBlockAllocator(
        block_tokens=8,
        bytes_per_token=2,
        initial_blocks=2,
        max_bytes=10 * bb,
        cached_policy=policy,
        offload_tiers=make_offload_tiers(host_bytes=3 * bb, ssd_bytes=3 * bb),
        on_full="preempt",
    )
    prompts = [list(rng.integers(0, 2, size=int(rng.integers(1, 30)))) for _ in range(6)]
    live: list[int] = []
    hits = 0
    for step in range(400):
        op = rng.integers(0, 3)
        if op == 0 or not live:
            r = a.allocate(step, prompts[int(rng.integers(0, 6))], now=float(step))
            hits += r.hit_tokens + r.loaded_tokens
            live = [s for s in live if s not in r.preempted] + [step]
        elif op == 1:
            s = live[int(rng.integers(0, len(live)))]
            gone = a.append(s, int(rng.integers(1, 9)), now=float(step))
            live = [x for x in live if x not in gone]
        else:
            a.free(live.pop(int(rng.integers(0, len(live)))), now=float(step))
        a.check_invariants()
        assert a.sequences() == live
    assert hits > 0 and a.stats.evictions > 0


def test_same_calls_give_the_same_block_ids_and_figures() -> None:
    def run() -> tuple[dict, dict]:
        a = KVBlockAllocator(block_tokens=8, initial_blocks=2, max_bytes=12 * 8, on_full="preempt")
        rng = np.random.default_rng(3)
        for s in range(200):
            a.allocate(s, list(rng.integers(0, 3, size=int(rng.integers(1, 40)))), now=s)
            if s % 3 == 0:
                a.free(a.sequences()[0], now=s)
        return {s: a.block_table(s) for s in a.sequences()}, a.snapshot()

    assert run() == run()


def test_a_key_repeated_inside_one_prompt_gets_its_own_block() -> None:
    """hash_ids [7, 7] (not chained): the first block reuses the cached block of id 7, the
    second stops sharing there and takes a fresh block -- never the same block twice in one
    table, which would make the second block's writes overwrite the first's."""
    from engine.kv.allocator import KVBlockAllocator

    a = KVBlockAllocator(block_tokens=16, bytes_per_token=1, initial_blocks=8)
    a.allocate("x", 16, hash_ids=[7])
    (cached,) = a.block_table("x")
    a.free("x")
    got = a.allocate("y", 32, hash_ids=[7, 7])
    table = a.block_table("y")
    assert table[0] == cached and table[1] != cached
    assert got.hit_tokens == 16  # one block reused, the second computed
