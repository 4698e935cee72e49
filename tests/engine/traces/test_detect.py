"""Format detection and the single read_trace entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import InputError
from engine.traces import detect_format, read_trace, write_oracle

CSV = "0,a,10\n1,b,20\n2,a,10\n"
JSONL = '{"timestamp": 0, "hash_ids": [4, 5]}\n{"timestamp": 10, "hash_ids": [4]}\n'


def make(tmp_path: Path, name: str, kind: str) -> Path:
    path = tmp_path / name
    if kind == "csv":
        path.write_text(CSV)
    elif kind == "mooncake":
        path.write_text(JSONL)
    else:
        write_oracle(path, [0, 1, 2], [9, 8, 9], [10, 20, 10])
    return path


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("t.csv", "csv"),
        ("t.CSV", "csv"),
        ("t.jsonl", "mooncake"),
        ("t.json", "mooncake"),
        ("t.bin", "oracle"),
        ("t.oracleGeneral", "oracle"),
        ("no_ext_csv", "csv"),
        ("no_ext_json", "mooncake"),
        ("no_ext_bin", "oracle"),
        ("t.trace", "oracle"),
    ],
)
def test_detect(tmp_path: Path, name: str, kind: str) -> None:
    path = make(tmp_path, name, kind)
    assert detect_format(path) == kind
    tr = read_trace(path)
    assert tr.meta["format"] == kind
    assert tr.key.tolist() == [0, 1, 0]


def test_explicit_format_overrides_the_extension(tmp_path: Path) -> None:
    path = tmp_path / "looks.bin"
    path.write_text(CSV)
    assert read_trace(path, "csv").size.tolist() == [10, 20, 10]


def test_limit(tmp_path: Path) -> None:
    for kind in ("csv", "mooncake", "oracle"):
        assert len(read_trace(make(tmp_path, f"t-{kind}", kind), kind, limit=2)) == 2


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_trace(tmp_path / "missing.csv")
    path = make(tmp_path, "t.csv", "csv")
    with pytest.raises(InputError, match="allowed: auto, csv, oracle, mooncake"):
        read_trace(path, "parquet")
    with pytest.raises(InputError, match="limit"):
        read_trace(path, limit=0)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        read_trace(empty)
    zst = tmp_path / "t.oracleGeneral.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    with pytest.raises(InputError, match="decompress first"):
        read_trace(zst)
