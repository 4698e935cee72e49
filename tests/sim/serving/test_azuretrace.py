"""The Azure LLM inference trace format: the shipped copy, a hand-written file, format
detection, and one-line errors for every kind of bad record."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from engine.limits import MAX_TOKENS
from sim.scenario import WorkloadCfg
from sim.serving.azuretrace import read_azure_csv
from sim.serving.traceformat import detect_request_format
from sim.serving.workload import make_workload, trace_path

SHIPPED = trace_path("shipped:AzureLLMInferenceTrace_conv.csv")
SHARED = Path(__file__).resolve().parents[4] / "shared" / "traces" / SHIPPED.name
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_the_shipped_trace_reads_19366_requests_with_the_first_and_last_read_by_hand() -> None:
    t, inp, out = read_azure_csv(SHIPPED, 10**9)
    assert t.size == inp.size == out.size == 19_366
    # line 2: 2023-11-16 18:15:46.6805900,374,44 (the first request: time 0)
    # line 3: 2023-11-16 18:15:50.9951690,396,109 -> 4.3145790 s later
    # line 19367: 2023-11-16 19:14:08.4025270,197,183 -> 58 min 21.7219370 s after the first
    assert (t[0], int(inp[0]), int(out[0])) == (0.0, 374, 44)
    assert (t[1], int(inp[1]), int(out[1])) == (4.314579, 396, 109)
    assert (t[-1], int(inp[-1]), int(out[-1])) == (58 * 60 + 21.721937, 197, 183)
    assert bool(np.all(np.diff(t) >= 0))
    assert detect_request_format(SHIPPED) == "azure"


def test_a_scenario_reads_the_shipped_trace_by_name_with_the_format_detected() -> None:
    cfg = WorkloadCfg(kind="trace", trace="shipped:AzureLLMInferenceTrace_conv.csv", requests=10**7)
    wl = make_workload(cfg, [1.0], np.random.default_rng(0))
    assert wl.n == 19_366 and wl.arrival[-1] == 3501.721937
    assert (int(wl.inp[-1]), int(wl.out[-1])) == (197, 183)


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared trace folder is not present")
def test_the_shipped_copy_is_the_published_file_unchanged() -> None:
    assert (
        hashlib.sha256(SHIPPED.read_bytes()).digest()
        == hashlib.sha256(SHARED.read_bytes()).digest()
    )


def test_a_hand_written_file_in_any_column_order_case_and_fraction_length(tmp_path: Path) -> None:
    p = tmp_path / "tiny.csv"
    p.write_text(
        "generatedtokens , TIMESTAMP,contextTokens\n"
        "5,2024-02-28 23:59:59.9,100\n"
        "\n"
        "0,2024-02-29T00:00:00,7\n"  # leap day, T separator, no fraction
        "12,2024-02-29 00:00:01.000000001,0\n"  # 1 ns resolution
        "3,2024-02-29 01:00:01.5+01:00,1\n",  # 00:00:01.5 UTC
        encoding="utf-8",
    )
    t, inp, out = read_azure_csv(p, 100)
    assert t.tolist() == [0.0, 0.1, 1.100000001, 1.6]
    assert inp.tolist() == [100, 7, 0, 1]
    assert out.tolist() == [5, 0, 12, 3]
    assert read_azure_csv(p, 2)[0].tolist() == [0.0, 0.1]


@given(
    st.lists(st.integers(0, 10**12), min_size=1, max_size=30),
    st.integers(0, MAX_TOKENS),
    st.integers(0, 10**6),
)
@settings(max_examples=40, deadline=None)
def test_times_round_trip_through_the_text_to_the_nanosecond(
    tmp_path_factory: pytest.TempPathFactory, gaps_ns: list[int], n_in: int, n_out: int
) -> None:
    base = dt.datetime(2023, 11, 16, 18, 15, 46)
    offsets = np.cumsum(gaps_ns).tolist()
    lines = [HEADER]
    for off in offsets:
        stamp = base + dt.timedelta(seconds=off // 10**9)
        lines.append(f"{stamp:%Y-%m-%d %H:%M:%S}.{off % 10**9:09d},{n_in},{n_out}\n")
    p = tmp_path_factory.mktemp("az") / "t.csv"
    p.write_text("".join(lines), encoding="utf-8")
    t, inp, out = read_azure_csv(p, 10**6)
    assert t.tolist() == [(o - offsets[0]) / 1e9 for o in offsets]
    assert set(inp.tolist()) == {n_in} and set(out.tolist()) == {n_out}


@pytest.mark.parametrize(
    ("record", "where", "what"),
    [
        ("2023-11-16 18:15:47.0,12,nan", "line 3: GeneratedTokens", "not a whole number"),
        ("2023-11-16 18:15:47.0,-12,3", "line 3: ContextTokens", "not a whole number"),
        ("2023-11-16 18:15:47.0,1.5,3", "line 3: ContextTokens", "not a whole number"),
        ("2023-11-16 18:15:47.0," + "9" * 5000 + ",3", "line 3: ContextTokens", "0..1,000"),
        (f"2023-11-16 18:15:47.0,{MAX_TOKENS + 1},3", "line 3: ContextTokens", "0..1,000"),
        ("2023-11-16 18:15:45.9999999,1,3", "line 3: TIMESTAMP", "earlier than the previous"),
        ("NaN,1,3", "line 3: TIMESTAMP", "not a date and time"),
        ("1700000000,1,3", "line 3: TIMESTAMP", "not a date and time"),
        ("2023-13-16 18:15:47,1,3", "line 3: TIMESTAMP", "month must be in 1..12"),
        ("2023-11-16 25:15:47,1,3", "line 3: TIMESTAMP", "hour, minute or second"),
        ("2023-11-16 18:15:47,1", "line 3", "2 fields"),
        ("2023-11-16 18:15:47,1,2,3", "line 3", "4 fields"),
        ("2023-11-16 18:15:47,1," + "7" * 200_000, "line 3", "fields of at most"),
    ],
)
def test_a_bad_record_is_one_error_naming_the_file_line_and_field(
    tmp_path: Path, record: str, where: str, what: str
) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(HEADER + "2023-11-16 18:15:46.0,1,1\n" + record + "\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_azure_csv(p, 100)
    msg = str(err.value)
    assert msg.startswith(f"{p}: {where}: "), msg
    assert what in msg and "\n" not in msg and len(msg) < 400, msg


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("TIMESTAMP,ContextTokens\n", "header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n", "header"),
        ("", "no header and no requests"),
    ],
)
def test_a_bad_header_or_an_empty_file_is_refused(tmp_path: Path, text: str, what: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=what):
        read_azure_csv(p, 100)


def test_a_byte_order_mark_is_skipped_in_detection_and_reading(tmp_path: Path) -> None:
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + b"2023-11-16 18:15:46.0,3,4\n")
    assert detect_request_format(p) == "azure"
    t, inp, out = read_azure_csv(p, 10)
    assert (t.tolist(), inp.tolist(), out.tolist()) == ([0.0], [3], [4])


def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_bytes(HEADER.encode() + b"2023-11-16 18:15:46.0,1,\xff\xfe\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_azure_csv(p, 100)


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("a.csv", HEADER + "2023-11-16 18:15:46.0,1,1\n", "azure"),
        ("a.txt", "\n timestamp , generatedtokens,CONTEXTTOKENS\n", "azure"),
        ("a.csv", "time,input_tokens,output_tokens\n0,1,1\n", "csv"),
        ("a.log", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n', "mooncake"),
        ("a.jsonl", "time,input_tokens,output_tokens\n", "mooncake"),  # the extension wins
    ],
)
def test_the_format_is_detected_from_the_extension_then_the_first_line(
    tmp_path: Path, name: str, text: str, fmt: str
) -> None:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    assert detect_request_format(p) == fmt


def test_detection_refuses_an_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "e.csv"
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="empty file"):
        detect_request_format(p)
