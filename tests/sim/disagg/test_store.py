"""The KV store tier: prefix lookups against a reference model, and a hit skipping its
prefill tokens in a run (TTFT = store read + the prefill of the tokens left, by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from sim.disagg.store import KvStore

from .conftest import KV_BYTES_PER_TOKEN, run, scenario


def _reference_prefix(resident: set[int], blocks: list[int]) -> int:
    n = 0
    for b in blocks:
        if b not in resident:
            break
        n += 1
    return n


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=6), min_size=1, max_size=25))
def test_store_with_room_for_everything_finds_the_longest_kept_prefix(
    requests: list[list[int]],
) -> None:
    # capacity for every block: nothing is evicted, so the store is a set of admitted blocks
    store = KvStore((10**6, 0, 0), (1.0, 1.0, 1.0), block_tokens=4)
    kept: set[int] = set()
    accesses = hits = 0
    for t, blocks in enumerate(requests):
        found = store.lookup(0, blocks, float(t))
        want = _reference_prefix(kept, blocks)
        assert found == [want]
        accesses += len(blocks)
        hits += want
        store.admit(0, blocks, 10, float(t))
        kept |= set(blocks)
    assert store.accesses == accesses and store.hits["host"] == hits


def test_store_demotes_host_victims_to_ssd_and_keys_are_per_model() -> None:
    store = KvStore((20, 30, 0), (1.0, 2.0, 1.0), block_tokens=4)
    store.admit(0, [1, 2], 10, 0.0)
    store.admit(0, [3], 10, 1.0)  # host holds 2 blocks: LRU block 1 moves to the SSD
    assert store.lookup(0, [1, 2, 3], 2.0) == [2, 1]  # 2 and 3 in host, 1 in SSD
    assert store.lookup(1, [1], 3.0) == [0, 0]  # another model's block 1 is not there
    assert store.load_seconds([2, 1], 10) == pytest.approx(2 * 10 / 1.0 + 10 / 2.0)
    rates = store.hit_rates()  # 4 blocks looked up, 3 found
    assert rates["host"] == 2 / 4 and rates["ssd"] == 1 / 4 and rates["total"] == 3 / 4


def _trace(path: Path, recs: list[tuple[int, int, list[int]]]) -> Path:
    lines = [
        json.dumps({"timestamp": t, "input_length": n, "output_length": 8, "hash_ids": h})
        for t, n, h in recs
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_prefix_hit_skips_its_prefill_tokens(tmp_path: Path) -> None:
    # request 1 computes blocks 0..3; request 2 repeats them (all but its last token skip);
    # request 3 shares the first two blocks only. Arrivals 5 s apart: each runs alone.
    trace = _trace(
        tmp_path / "t.jsonl",
        [(0, 2048, [0, 1, 2, 3]), (5000, 2048, [0, 1, 2, 3]), (10000, 2048, [0, 1, 9, 10])],
    )
    wl = {"kind": "trace", "trace": str(trace), "requests": 3}
    pools = {"prefill": {"replicas": 1, "tp": 1}, "decode": {"replicas": 1, "tp": 1}}
    store = {"enabled": True, "block_tokens": 512, "host": "8GiB", "ssd": 0}
    # the replicas' own HBM prefix caches off: the store alone is under test
    kv = {"prefix_caching": False}
    on = run(scenario(workload=wl, kv=kv, disaggregation={**pools, "store": store}))
    off = run(scenario(workload=wl, kv=kv, disaggregation=pools))
    co = on.ctx.disagg
    assert co.skipped.tolist() == [0, 2047, 1024]
    assert off.ctx.disagg.skipped.tolist() == [0, 0, 0]
    # the one decode replica still holds blocks 0..3 of request 1: request 2 sends nothing,
    # request 3 only the two blocks it does not share
    assert co.bytes_moved.tolist() == [2048 * KV_BYTES_PER_TOKEN, 0, 1024 * KV_BYTES_PER_TOKEN]
    mr = co.prefill[0].ctx.models[0]
    bw = co.store.bandwidth[0]
    bb = 512 * KV_BYTES_PER_TOKEN
    met = on.ctx.metrics
    for rid, (blocks_hit, skip) in enumerate([(0, 0), (4, 2047), (2, 1024)]):
        c = 2048 - skip  # tokens the prefill replica computes, after `skip` of context
        t_iter = mr.iter_cost(c, c * c + 2.0 * c * skip, 1, 0, 0.0)[0]
        ttft = met.first[rid] - met.arrival[rid]
        assert ttft == pytest.approx(blocks_hit * bb / bw + t_iter, rel=1e-9)
    # without the store every request prefills its whole prompt
    full = mr.iter_cost(2048, 2048.0 * 2048, 1, 0, 0.0)[0]
    ttft_off = off.ctx.metrics.first - off.ctx.metrics.arrival
    assert ttft_off.tolist() == pytest.approx([full] * 3, rel=1e-9)
    s = co.summary()["store"]
    assert s["accesses"] == 4 + 4 + 4 and s["hits"]["host"] == 6


def test_unknown_store_policy_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"disaggregation\.store\.policy.*allowed"):
        scenario(disaggregation={"store": {"policy": "nope"}})
