"""CSV trace reader: round trips, header detection, and bad records reported by line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.traces import NO_COLOR, read_csv

KEYS = st.sampled_from(["a", "b", "c", "obj-7", "42", "x y"])
COLORS = st.sampled_from(["", "m1", "m2"])


@st.composite
def records(draw: st.DrawFn) -> list[tuple[float, str, int, str]]:
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0, 5, allow_nan=False), min_size=n, max_size=n))
    times = np.cumsum(gaps).tolist()
    return [(t, draw(KEYS), draw(st.integers(0, 10**12)), draw(COLORS)) for t in times]


def first_seen_ids(keys: list[str]) -> list[int]:
    ids: dict[str, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@given(recs=records(), header=st.booleans(), with_color=st.booleans())
def test_round_trip(
    tmp_path_factory: pytest.TempPathFactory,
    recs: list[tuple[float, str, int, str]],
    header: bool,
    with_color: bool,
) -> None:
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    lines = ["time,key,size,color" if with_color else "time,key,size"] if header else []
    for t, k, s, c in recs:
        lines.append(f"{t!r},{k},{s},{c}" if with_color else f"{t!r},{k},{s}")
    path.write_text("\n".join(lines) + "\n")
    tr = read_csv(path)
    assert tr.time.tolist() == [r[0] for r in recs]
    assert tr.key.tolist() == first_seen_ids([r[1] for r in recs])
    assert tr.size.tolist() == [r[2] for r in recs]
    if with_color:
        assert tr.colors() == [r[3] or None for r in recs]
    else:
        assert tr.color is None
    assert tr.source == str(path)


def test_header_any_column_order(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "size,color,key,time\n10,red,k1,0.5\n20,,k2,1\n")
    tr = read_csv(path)
    assert tr.time.tolist() == [0.5, 1.0]
    assert tr.size.tolist() == [10, 20]
    assert tr.color is not None and tr.color.tolist() == [0, NO_COLOR]
    assert tr.color_names == ("red",)


def test_missing_last_colour_field_means_no_colour(tmp_path: Path) -> None:
    tr = read_csv(write(tmp_path / "t.csv", "time,key,size,color\n0,a,1,red\n1,b,2\n2,a,1,\n"))
    assert tr.colors() == ["red", None, None]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    tr = read_csv(write(tmp_path / "t.csv", "0,a,1\n\n1,b,2\n\n"))
    assert tr.key.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("0,a,1\n1,b,2\n2,c,lots\n", 3, "size 'lots'"),
        ("0,a,1\n1,b,-5\n", 2, "size '-5'"),
        ("0,a,1\n1,b,2.5\n", 2, "size '2.5'"),
        ("0,a,1\n\nsoon,b,2\n", 3, "time 'soon'"),
        ("0,a,1\n1,b,2,red,extra\n", 2, "5 fields"),
        ("0,a,1\n1,b\n", 2, "2 fields"),
        ("5,a,1\n6,b,1\n4,c,1\n", 3, "time order"),
        ("time,key,size\n0,a,1\n1,b,x\n", 3, "size 'x'"),
        ("0,a\n", 1, "2 fields"),
        ("time,key,bytes\n0,a,1\n", 1, "columns must be"),
        ("0,a,1\n1, ,2\n", 2, "key is empty"),
    ],
)
def test_bad_record_names_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(InputError) as exc:
        read_csv(path)
    msg = str(exc.value)
    assert str(path) in msg
    assert f"line {line}:" in msg
    assert words in msg


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no accesses"):
        read_csv(write(tmp_path / "e.csv", "time,key,size\n"))
