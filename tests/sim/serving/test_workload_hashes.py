"""Trace workloads carry each request's prompt block hash ids (Mooncake ``hash_ids``) in
request order; bad ids are input errors naming the line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from sim.scenario import WorkloadCfg
from sim.serving.workload import make_workload

RNG = np.random.default_rng(0)


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(1, 3000), st.lists(st.integers(-5, 5))),
        min_size=1,
        max_size=12,
    )
)
def test_each_request_keeps_its_own_ids_after_sorting_by_arrival(
    tmp_path_factory: pytest.TempPathFactory, recs: list[tuple[int, int, list[int]]]
) -> None:
    rows = [
        {"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": ids[: -(-n // 512)]}
        for t, n, ids in recs
    ]
    path = write(tmp_path_factory.mktemp("w") / "t.jsonl", rows)
    wl = make_workload(WorkloadCfg(kind="trace", trace=str(path), requests=100), [1.0], RNG)
    order = sorted(range(len(rows)), key=lambda i: rows[i]["timestamp"])  # stable
    assert wl.n == len(rows)
    for rid, i in enumerate(order):
        assert wl.inp[rid] == rows[i]["input_length"]
        assert wl.block_hash_ids(rid).tolist() == rows[i]["hash_ids"]
    assert wl.has_block_hashes == any(r["hash_ids"] for r in rows)


def test_a_duration_bound_keeps_the_ids_of_the_requests_it_keeps(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000 * i, "input_length": 1024, "output_length": 1, "hash_ids": [i, 7]}
        for i in range(5)
    ]
    path = write(tmp_path / "t.jsonl", rows)
    cfg = WorkloadCfg(kind="trace", trace=str(path), duration=2.5)
    wl = make_workload(cfg, [1.0], RNG)
    assert wl.n == 3
    assert [wl.block_hash_ids(i).tolist() for i in range(3)] == [[0, 7], [1, 7], [2, 7]]
    assert wl.hash_flat is not None and wl.hash_flat.size == 6


@pytest.mark.parametrize(
    ("ids", "what"),
    [
        ([1, "2"], "not a list of integers"),
        ([1, 2, 3], "3 hash ids for input_length 1024"),
        ("12", "not a list of integers"),
        ([True], "not a list of integers"),
    ],
)
def test_bad_hash_ids_name_the_line_and_what_is_allowed(
    tmp_path: Path, ids: object, what: str
) -> None:
    rows = [
        {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": ids},
    ]
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InputError) as err:
        make_workload(WorkloadCfg(kind="trace", trace=str(path), requests=9), [1.0], RNG)
    msg = str(err.value)
    assert what in msg and "line 2: hash_ids" in msg and "allowed" in msg


def test_synthetic_and_csv_workloads_have_no_ids(tmp_path: Path) -> None:
    wl = make_workload(WorkloadCfg(kind="poisson", requests=5, rate=1.0), [1.0], RNG)
    assert not wl.has_block_hashes and wl.block_hash_ids(0).size == 0
    csv = tmp_path / "t.csv"
    csv.write_text("time,input_tokens,output_tokens\n0,5,5\n")
    cfg = WorkloadCfg(kind="trace", trace=str(csv), trace_format="csv", requests=5)
    assert not make_workload(cfg, [1.0], RNG).has_block_hashes
