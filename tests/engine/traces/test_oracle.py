"""oracleGeneral binary reader: round trips, truncated files and corrupt records by offset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.traces import next_access_indices, read_oracle, write_oracle
from engine.traces.oracle import RECORD


@st.composite
def records(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    times = np.cumsum(gaps).tolist()
    ids = draw(st.lists(st.sampled_from([0, 7, 2**40, 2**64 - 1, 99]), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
    return times, ids, sizes


def reference_next(ids: list[int]) -> list[int]:
    """Brute force: index of the next equal id, -1 if none."""
    out = []
    for i, k in enumerate(ids):
        nxt = [j for j in range(i + 1, len(ids)) if ids[j] == k]
        out.append(nxt[0] if nxt else -1)
    return out


def first_seen_ids(keys: list[int]) -> list[int]:
    ids: dict[int, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def test_record_layout_is_24_packed_little_endian_bytes() -> None:
    assert RECORD.itemsize == 24
    rec = np.zeros(1, dtype=RECORD)
    rec[0] = (1, 2, 3, -1)
    assert rec.tobytes() == (
        (1).to_bytes(4, "little")
        + (2).to_bytes(8, "little")
        + (3).to_bytes(4, "little")
        + (-1).to_bytes(8, "little", signed=True)
    )


@given(recs=records())
def test_round_trip(
    tmp_path_factory: pytest.TempPathFactory, recs: tuple[list[int], list[int], list[int]]
) -> None:
    times, ids, sizes = recs
    path = tmp_path_factory.mktemp("bin") / "t.oracleGeneral"
    write_oracle(path, times, ids, sizes)
    tr = read_oracle(path)
    assert tr.time.tolist() == [float(t) for t in times]
    assert tr.key.tolist() == first_seen_ids(ids)
    assert tr.size.tolist() == sizes
    assert tr.next_access is not None
    assert tr.next_access.tolist() == reference_next(ids)
    assert next_access_indices(ids).tolist() == reference_next(ids)


def test_limit_reads_only_the_first_records(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_oracle(path, [0, 1, 2, 3], [5, 6, 5, 7], [1, 1, 1, 1])
    tr = read_oracle(path, limit=2)
    assert tr.key.tolist() == [0, 1]


def test_int64_max_next_access_means_never(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_oracle(path, [0, 1], [5, 6], [1, 1], next_access=[2**63 - 1, -1])
    tr = read_oracle(path)
    assert tr.next_access is not None and tr.next_access.tolist() == [-1, -1]


@pytest.mark.parametrize("extra", [1, 12, 23])
def test_truncated_file_reports_offset_of_last_record(tmp_path: Path, extra: int) -> None:
    path = tmp_path / "t.bin"
    write_oracle(path, [0, 1, 2], [1, 2, 3], [4, 4, 4])
    with path.open("ab") as fh:
        fh.write(b"\x01" * extra)
    with pytest.raises(InputError) as exc:
        read_oracle(path)
    msg = str(exc.value)
    assert str(path) in msg
    assert "byte offset 72" in msg
    assert f"{extra} of 24 bytes" in msg


def test_time_going_backwards_reports_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_oracle(path, [0, 5, 6, 3, 9], [1, 2, 3, 4, 5], [1, 1, 1, 1, 1])
    with pytest.raises(InputError, match=r"byte offset 72 \(record 3\).*time order"):
        read_oracle(path)


def test_bad_next_access_reports_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_oracle(path, [0, 1, 2], [1, 2, 3], [1, 1, 1], next_access=[-1, -7, -1])
    with pytest.raises(InputError, match=r"byte offset 24 \(record 1\): next access -7"):
        read_oracle(path)


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"")
    with pytest.raises(InputError, match="no records"):
        read_oracle(path)
