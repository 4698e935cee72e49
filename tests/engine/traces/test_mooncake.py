"""Mooncake JSONL reader: expansion into KV-block accesses and bad lines by number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from engine.traces import DEFAULT_KV_BYTES_PER_TOKEN, example_trace, read_mooncake


@st.composite
def requests(draw: st.DrawFn) -> list[dict[str, object]]:
    n = draw(st.integers(1, 25))
    out = []
    ts = 0
    for _ in range(n):
        ts += draw(st.integers(0, 500))
        hids = draw(st.lists(st.integers(0, 30), max_size=12))
        out.append(
            {
                "timestamp": ts,
                "input_length": 512 * len(hids),
                "output_length": draw(st.integers(0, 100)),
                "hash_ids": hids,
            }
        )
    return out


def write_jsonl(path: Path, reqs: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return path


def test_default_bytes_per_token_is_llama2_7b_fp16() -> None:
    assert DEFAULT_KV_BYTES_PER_TOKEN == 2 * 32 * 32 * 128 * 2 == 524_288


@given(reqs=requests(), block_tokens=st.integers(1, 1024), unit=st.booleans())
def test_expansion(
    tmp_path_factory: pytest.TempPathFactory,
    reqs: list[dict[str, object]],
    block_tokens: int,
    unit: bool,
) -> None:
    if not any(r["hash_ids"] for r in reqs):
        reqs[0]["hash_ids"] = [3]
    path = write_jsonl(tmp_path_factory.mktemp("mc") / "t.jsonl", reqs)
    tr = read_mooncake(path, block_tokens=block_tokens, kv_bytes_per_token=10, unit=unit)
    flat = [h for r in reqs for h in r["hash_ids"]]  # type: ignore[attr-defined]
    assert len(tr) == len(flat) == sum(len(r["hash_ids"]) for r in reqs)  # type: ignore[arg-type]
    times = [r["timestamp"] / 1000 for r in reqs for _ in r["hash_ids"]]  # type: ignore[operator, attr-defined]
    assert tr.time.tolist() == times
    seen: dict[int, int] = {}
    assert tr.key.tolist() == [seen.setdefault(h, len(seen)) for h in flat]
    assert set(tr.size.tolist()) == {1 if unit else block_tokens * 10}
    assert tr.meta["requests"] == len(reqs)


def test_limit_counts_accesses(tmp_path: Path) -> None:
    reqs = [{"timestamp": 0, "hash_ids": [1, 2, 3]}, {"timestamp": 5, "hash_ids": [1, 4]}]
    tr = read_mooncake(write_jsonl(tmp_path / "t.jsonl", reqs), limit=4)
    assert tr.key.tolist() == [0, 1, 2, 0]
    assert tr.time.tolist() == [0, 0, 0, 0.005]


def test_shipped_slice_expands_to_its_hash_ids() -> None:
    path = example_trace()
    lines = path.read_text().splitlines()
    tr = read_mooncake(path)
    assert len(lines) == 1000
    assert len(tr) == sum(len(json.loads(line)["hash_ids"]) for line in lines) == 23_787
    assert tr.n_objects == 19_780
    assert path.stat().st_size < 300_000


GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("{not json}\n", "not valid JSON"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"timestamp": 5}\n', "missing field 'hash_ids'"),
        ('{"hash_ids": [1]}\n', "missing field 'timestamp'"),
        ('{"timestamp": "5", "hash_ids": [1]}\n', "timestamp '5'"),
        ('{"timestamp": -1, "hash_ids": [1]}\n', "timestamp -1"),
        ('{"timestamp": 5, "hash_ids": [1, "x"]}\n', "hash_ids"),
        ('{"timestamp": 5, "hash_ids": [1.5]}\n', "hash_ids"),
        ('{"timestamp": 5, "hash_ids": [1], "input_length": -3}\n', "input_length -3"),
        ('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 0, "hash_ids": [2]}\n', None),
    ],
)
def test_bad_line_names_file_and_line(tmp_path: Path, bad: str, words: str | None) -> None:
    # line 1 good at t=1 s, line 2 blank (still counted), the bad record on line 3
    text = GOOD.replace('"timestamp": 0', '"timestamp": 1000') + "\n" + bad
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        read_mooncake(path)
    msg = str(exc.value)
    assert f"{path}: line 3:" in msg
    assert (words or "time order") in msg


def test_no_accesses_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"timestamp": 0, "hash_ids": []}\n')
    with pytest.raises(InputError, match="no KV-block accesses"):
        read_mooncake(path)


@pytest.mark.parametrize("kw", [{"block_tokens": 0}, {"kv_bytes_per_token": 0}])
def test_bad_parameters(tmp_path: Path, kw: dict[str, int]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD)
    with pytest.raises(InputError, match=">= 1"):
        read_mooncake(path, **kw)
