"""Prefix-sharing hit rate replayed over Mooncake traces equals the repeated-hash-id fraction.

With an unbounded pool nothing is ever evicted, so a prompt block is a hit exactly when its
hash id was seen before (Mooncake ids are prefix-unique: a repeated id implies a repeated
prefix). The expected figures are computed here directly from the JSON lines, independently of
the allocator. A few sequences stay live at a time and decode a few tokens, so shared blocks
with refcount > 1 and copy-on-write of shared partial last blocks are exercised too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.kv import KVBlockAllocator

BLOCK = 512
FIXTURE = Path(__file__).resolve().parents[2] / "data" / "mooncake_first200.jsonl"
SHARED = (
    Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
)


def load(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_figures(records: list[dict]) -> tuple[int, int, int]:
    """(total ids, ids seen before, tokens covered by those repeated ids)."""
    seen: set[int] = set()
    total = repeated = repeated_tokens = 0
    for r in records:
        for i, hid in enumerate(r["hash_ids"]):
            total += 1
            if hid in seen:
                repeated += 1
                repeated_tokens += min(BLOCK, r["input_length"] - i * BLOCK)
            seen.add(hid)
    return total, repeated, repeated_tokens


def replay(records: list[dict], live: int = 4) -> KVBlockAllocator:
    a = KVBlockAllocator(block_tokens=BLOCK, bytes_per_token=1, max_bytes=None, chunk_tokens=BLOCK)
    for n, r in enumerate(records):
        a.allocate(n, r["input_length"], hash_ids=r["hash_ids"], now=r["timestamp"] / 1000)
        a.append(n, min(r["output_length"], 16), now=r["timestamp"] / 1000)
        if n >= live:
            a.free(n - live, now=r["timestamp"] / 1000)
    return a


def check(records: list[dict]) -> KVBlockAllocator:
    total, repeated, repeated_tokens = expected_figures(records)
    a = replay(records)
    st = a.stats
    assert st.keyed_blocks == total
    assert st.hit_blocks == repeated and st.loaded_blocks == 0 and st.evictions == 0
    assert st.hit_tokens == repeated_tokens
    assert st.prefix_hit_rate == pytest.approx(repeated / total, abs=0)
    a.check_invariants()
    return a


def test_fixture_hit_rate_equals_repeated_id_fraction() -> None:
    records = load(FIXTURE)
    assert len(records) == 200
    a = check(records)
    assert 0.05 < a.stats.prefix_hit_rate < 0.1  # 323 of 5330 ids repeat in this slice


@pytest.mark.skipif(not SHARED.exists(), reason=f"shared trace not present at {SHARED}")
def test_shared_trace_hit_rate_equals_repeated_id_fraction() -> None:
    records = load(SHARED)
    a = check(records)
    assert a.stats.cow_copies > 0  # identical prompts decoding concurrently
    assert a.stats.prefix_hit_rate == pytest.approx(77953 / 121877, abs=0)
