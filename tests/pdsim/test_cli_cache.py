"""End-to-end tests of ``pdsim cache replay`` through typer's CliRunner."""

from __future__ import annotations

import json
from heapq import heappop, heappush
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from engine.errors import InputError
from engine.policy import policy_names
from engine.traces import example_trace, read_trace, write_oracle
from pdsim.cli import app
from pdsim.cli.cache import parse_cache_sizes

runner = CliRunner()
POLICIES = [p for p in policy_names() if p != "none"]


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["cache", "replay", *args])
    return result.exit_code, result.output


def test_default_run_uses_the_shipped_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = run()
    assert code == 0, out
    assert "shipped example trace" in out and "mooncake_slice.jsonl" in out
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("cache-replay-")
    assert (folder / "mrc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    df = pd.read_csv(folder / "replay.csv")
    assert len(df) == 6 * len(POLICIES)
    assert sorted(df["policy"].unique()) == sorted(POLICIES)
    assert (df["requests"] == 23_787).all()
    assert (df["hits"] + df["misses"] == df["requests"]).all()
    assert sorted(df["cache_fraction"].round(6).unique()) == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5]
    if "opt" in POLICIES:  # uniform block sizes: Belady is optimal at every size
        best = df.groupby("cache_bytes")["misses"].min()
        opt = df[df["policy"] == "opt"].set_index("cache_bytes")["misses"]
        assert (opt == best.loc[opt.index]).all()


def test_csv_trace_with_options(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time,key,size\n0,a,10\n1,b,20\n2,a,10\n3,c,30\n4,b,20\n")
    out = tmp_path / "out"
    code, text = run(str(trace), "-p", "lru", "-s", "30,20", "-o", str(out))
    assert code == 0, text
    df = pd.read_csv(out / "replay.csv")
    assert df[["cache_bytes", "hits", "misses"]].values.tolist() == [[20, 0, 5], [30, 1, 4]]
    assert "byte miss ratio" in text


def test_same_inputs_reuse_the_default_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("0,a,10\n1,b,20\n2,a,10\n")
    assert run("t.csv", "-p", "lru", "-s", "10,30", "-q")[0] == 0
    (first,) = (tmp_path / "runs").iterdir()
    code, text = run("t.csv", "-p", "lru", "-s", "30,10", "-q")  # same sizes, other order
    assert code == 0
    assert text.strip() == str(Path("runs") / first.name)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [first.name]
    assert run("t.csv", "-p", "lru", "-s", "20", "-q")[0] == 0  # other inputs: a new folder
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_oracle_binary_trace_is_detected(tmp_path: Path) -> None:
    trace = tmp_path / "t.oracleGeneral"
    write_oracle(trace, [0, 1, 2, 3], [70, 80, 70, 90], [100, 100, 100, 100])
    out = tmp_path / "o"
    code, text = run(str(trace), "-p", "lru", "-s", "100%", "-o", str(out))
    assert code == 0, text
    assert "oracle, 4 accesses, 3 objects" in text
    df = pd.read_csv(out / "replay.csv")
    assert df[["cache_bytes", "hits", "misses"]].values.tolist() == [[300, 1, 3]]


def test_limit_and_unit_sizes(tmp_path: Path) -> None:
    out = tmp_path / "o"
    code, text = run("-p", "lru", "-n", "500", "--unit-sizes", "-s", "10,100", "-o", str(out))
    assert code == 0, text
    df = pd.read_csv(out / "replay.csv")
    assert (df["requests"] == 500).all()
    assert df["cache_bytes"].tolist() == [10, 100]
    assert (df["bytes_requested"] == 500).all()  # unit sizes: one byte per block


def test_corrupt_trace_exits_2_with_line_and_writes_nothing(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"timestamp": 0, "hash_ids": [1, 2]}\n{"timestamp": 1, "hash_ids": [3]}\n{oops\n'
    )
    out = tmp_path / "runs" / "out"
    code, text = run(str(trace), "-o", str(out))
    assert code == 2
    assert "line 3" in text and str(trace) in text
    assert not (tmp_path / "runs").exists()


def test_corrupt_trace_with_default_out_creates_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text("0,a,1\n1,b,2\n2,c,x\n")
    code, text = run("bad.csv")
    assert code == 2
    assert "line 3" in text
    assert not (tmp_path / "runs").exists()


def test_unknown_policy_exits_2_listing_allowed(tmp_path: Path) -> None:
    code, text = run("-p", "lru,belady2", "-o", str(tmp_path / "o"))
    assert code == 2
    assert "belady2" in text
    assert "allowed: " + ", ".join(sorted(policy_names())) in text
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["-s", "5x"], "--sizes: '5x'"),
        (["-s", "0"], "not >= 1 byte"),
        (["-f", "parquet"], "allowed: auto, csv, oracle, mooncake"),
        (["--param", "lru-k"], "POLICY.NAME=VALUE"),
        (["--kv-bytes-per-token", "lots"], "--kv-bytes-per-token"),
        (["--limit", "0"], "limit"),
        (["--clock", "wall"], "allowed: time, references"),
        (["--precision", "18"], "--precision"),
        (["missing.jsonl"], "missing.jsonl"),
    ],
)
def test_bad_options_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    code, text = run(*args, "-o", str(tmp_path / "o"))
    assert code == 2, text
    assert words in text
    assert not (tmp_path / "o").exists()


def test_parse_cache_sizes() -> None:
    assert parse_cache_sizes("10%, 0.5, 64KiB, 1kB, 1000", 2000) == [200, 1000, 65536]
    # percents and fractions truncate (libCacheSim), exactly: 489.74 -> 489, 0.29 * 100 -> 29
    assert parse_cache_sizes("1%", 48_974) == [489]
    assert parse_cache_sizes("29%, 0.29", 100) == [29]
    assert parse_cache_sizes("0.999", 1000) == [999]
    assert parse_cache_sizes("1%", 10) == [1]  # never below one byte
    with pytest.raises(InputError):
        parse_cache_sizes(" , ", 100)
    with pytest.raises(InputError):
        parse_cache_sizes("-5%", 100)


def test_help_documents_every_option() -> None:
    result = runner.invoke(app, ["cache", "replay", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for opt in (
        "--format",
        "--policy",
        "--sizes",
        "--block-tokens",
        "--kv-bytes-per-token",
        "--unit-sizes",
        "--param",
        "--out",
        "--limit",
        "--quiet",
        "--clock",
        "--precision",
    ):
        assert opt in result.output


# -- O'Neil's LRU-K, written independently: the must-show check of issue 18 ----------------


def oneil_lru2_misses(keys: list[int], capacity: int) -> int:
    """LRU-2 as in O'Neil, O'Neil & Weikum (1993), time counted in references.

    CRP = 0 (every reference uncorrelated), RIP unbounded (history of every page kept). The
    victim has the largest backward 2-distance: the smallest HIST(p,2), where a page seen
    once has HIST(p,2) = 0 and those go first, least recent HIST(p,1) first. Ranks are
    pushed eagerly on every reference; popped entries that no longer match are skipped.
    """
    hist: dict[int, tuple[int, int]] = {}  # key -> (HIST(p,1), HIST(p,2))
    resident: set[int] = set()
    heap: list[tuple[int, int, int]] = []
    misses = 0
    for t, key in enumerate(keys, start=1):
        old = hist.get(key)
        if key in resident:
            assert old is not None
            hist[key] = (t, old[0])
            heappush(heap, (old[0], t, key))
            continue
        misses += 1
        if len(resident) >= capacity:
            while True:
                h2, h1, victim = heappop(heap)
                if victim in resident and hist[victim] == (h1, h2):
                    break
            resident.remove(victim)
        hist[key] = (t, old[0] if old else 0)
        resident.add(key)
        heappush(heap, (hist[key][1], t, key))
    return misses


def test_lru2_references_clock_matches_oneil_on_the_shipped_trace(tmp_path: Path) -> None:
    """The shipped Mooncake slice (real; every block of a request shares one timestamp)."""
    keys = read_trace(example_trace(), unit=True).key.tolist()
    out = tmp_path / "o"
    code, text = run(
        "-p", "lru-k", "--clock", "references", "--unit-sizes", "-s", "1%,5%,20%", "-o", str(out)
    )
    assert code == 0, text
    df = pd.read_csv(out / "replay.csv")
    assert df["cache_bytes"].tolist() == [197, 989, 3956]  # 19,780 objects, truncated
    for row in df.itertuples():
        assert row.misses == oneil_lru2_misses(keys, int(row.cache_bytes)), row.cache_bytes
    assert json.loads((out / "inputs.json").read_text())["clock"] == "references"
    # With the reference-order tie-break the time clock agrees exactly, also when timestamps
    # tie far more: the same accesses as an oracleGeneral trace in whole 10-second steps
    # (breaking ties by HIST(p,1) instead gave 23,324 misses at 5%, O'Neil 23,352).
    assert_time_clock_matches_oneil(example_trace(), 10.0, "1%,5%,20%", tmp_path)


def assert_time_clock_matches_oneil(path: Path, step_s: float, sizes: str, tmp: Path) -> None:
    """Replay ``path``'s accesses with times cut to whole ``step_s`` seconds, written as an
    oracleGeneral trace (``--clock time``), against O'Neil's LRU-2 counted in references."""
    src = read_trace(path)
    oracle = tmp / "coarse.oracleGeneral"
    write_oracle(oracle, (src.time // step_s).astype("int64"), src.key, [1] * len(src))
    out = tmp / "coarse"
    code, text = run(str(oracle), "-p", "lru-k", "--unit-sizes", "-s", sizes, "-o", str(out))
    assert code == 0, text
    keys = src.key.tolist()
    for row in pd.read_csv(out / "replay.csv").itertuples():
        assert row.misses == oneil_lru2_misses(keys, int(row.cache_bytes)), row.cache_bytes


def test_unit_sizes_work_for_every_format(tmp_path: Path) -> None:
    csv_trace = tmp_path / "t.csv"
    csv_trace.write_text("time,key,size\n0,a,10\n1,b,20\n2,a,10\n3,c,30\n4,b,20\n")
    oracle = tmp_path / "t.bin"
    write_oracle(oracle, [0, 1, 2, 3, 4], [1, 2, 1, 3, 2], [10, 20, 10, 30, 20])
    for trace in (csv_trace, oracle):
        out = tmp_path / f"o-{trace.suffix[1:]}"
        code, text = run(str(trace), "-p", "lru", "--unit-sizes", "-s", "2,67%", "-o", str(out))
        assert code == 0, text
        df = pd.read_csv(out / "replay.csv")
        # 3 unit objects; 67% truncates to 2: a b a(hit) c(evicts b) b(miss) -> 1 hit
        assert df[["cache_bytes", "hits", "misses"]].values.tolist() == [[2, 1, 4]]
        assert (df["bytes_requested"] == 5).all()
        inputs = json.loads((out / "inputs.json").read_text())
        assert inputs["unit_sizes"] is True
        assert "block_tokens" not in inputs and "kv_bytes_per_token" not in inputs
        assert "cache sizes (objects): 2" in text
        assert "KiB" not in text and "warning" not in text


def test_objects_larger_than_the_cache_are_counted_in_a_warning(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,a,10\n1,b,500\n2,c,600\n3,b,500\n4,a,10\n")
    out = tmp_path / "o"
    code, text = run(str(trace), "-p", "lru", "-s", "100", "--precision", "3", "-o", str(out))
    assert code == 0, text
    assert "cache of 100 B: 2 objects (3 accesses) are larger than the whole" in text
    df = pd.read_csv(out / "replay.csv")
    assert df[["hits", "misses", "too_large_objects", "too_large_accesses"]].values.tolist() == [
        [1, 4, 2, 3]
    ]
    assert "0.800" in text and "0.8000" not in text  # --precision 3


SHARED_MOONCAKE = (
    Path(__file__).resolve().parents[2].parent / "shared/traces/mooncake_synthetic_trace.jsonl"
)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_MOONCAKE.is_file(), reason="no ../shared Mooncake trace")
def test_lru2_time_clock_matches_oneil_on_the_whole_mooncake_trace(tmp_path: Path) -> None:
    """3,993 requests in whole seconds (as block traces are): ties follow reference order."""
    assert_time_clock_matches_oneil(SHARED_MOONCAKE, 1.0, "1%,5%,20%", tmp_path)
