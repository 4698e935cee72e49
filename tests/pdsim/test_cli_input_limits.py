"""Inputs that crashed, hung or were silently accepted (issue 41) end in exit 2 with one line.

Each case is a reproducer from the issue's fuzzing run, given to the CLI in-process: the exit
status is 2, stderr is one line starting ``error:`` that names the option or field (and the
line of a file), and nothing is written. Every case fails on load, before any simulation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.configfile import parse_mapping
from engine.errors import InputError
from engine.limits import MAX_REQUESTS, MAX_SEEDS, MAX_TOKENS
from pdsim.cli import app

ROOT = Path(__file__).resolve().parents[2]
RUN = ["run", "quickstart", "--quiet", "--set", "workload.requests=20"]
BIG = "1" * 400
HUGE = "1" * 5000
TWO_64 = str(2**64)


def _invoke(tmp_path: Path, args: list[str], out: bool = True) -> tuple[int, str, Path]:
    folder = tmp_path / "out"
    res = CliRunner().invoke(app, [*args, *(["--out", str(folder)] if out else [])])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output, folder


def _assert_refused(code: int, output: str, folder: Path, *needles: str) -> None:
    assert code == 2, output
    assert output.startswith("error:") and output.strip().count("\n") == 0, output
    assert "Traceback" not in output
    for needle in needles:
        assert needle in output, (needle, output)
    assert not folder.exists() or not any(folder.iterdir())


# the tracebacks, hangs and silently accepted values, as `--set` overrides of `run`
SETS = [
    ("input low 2**64", [f"workload.input_tokens.low={TWO_64}"], "input_tokens.low"),
    ("input high 2**64", [f"workload.input_tokens.high={TWO_64}"], "input_tokens.high"),
    ("input high 400 digits", [f"workload.input_tokens.high={BIG}"], "input_tokens.high"),
    ("input high over the token limit", [f"workload.input_tokens.high={MAX_TOKENS + 1}"], "high"),
    (
        "share .inf",
        ["deployments=[{model: llama-2-7b}, {model: llama-2-7b, share: .inf}]"],
        "deployments[1].share",
    ),
    ("rate 1e999 with a duration", ["workload.rate=1e999", "workload.duration=10"], "rate"),
    (
        "step rate 2**64",
        [
            "workload.kind=step",
            "workload.duration=10",
            f"workload.steps=[{{at: 1, rate: {TWO_64}}}]",
        ],
        "workload.steps[0].rate",
    ),
    ("rate 1e6 for 100 s", ["workload.rate=1e6", "workload.duration=100"], "rate x duration"),
    ("rate 1e9 for 10 s (82 GiB)", ["workload.rate=1e9", "workload.duration=10"], "rate"),
    ("requests 10**18", [f"workload.requests={10**18}"], "workload.requests"),
    ("requests 10**9", ["workload.requests=1000000000"], "workload.requests"),
    ("requests over the limit", [f"workload.requests={MAX_REQUESTS + 1}"], "workload.requests"),
    ("5000-digit --set", [f"workload.requests={HUGE}"], "5000-digit integer"),
    ("rate .inf", ["workload.rate=.inf"], "workload.rate"),
    ("output mean 1e999", ["workload.output_tokens.mean=1e999"], "output_tokens.mean"),
    ("output mean .nan", ["workload.output_tokens.mean=.nan"], "output_tokens.mean"),
    ("max_wait 1e-300s (hung)", ["degradation.max_wait=1e-300s"], "degradation.max_wait"),
    ("diurnal period 1ns", ["workload.kind=diurnal", "workload.period=1ns"], "period"),
    ("metrics interval 1e-12", ["metrics.interval=1e-12"], "metrics.interval"),
    ("params .nan", ["cache.params={x: .nan}"], "cache.params.x"),
    ("input high 0 (fuzz)", ["workload.input_tokens.high=0"], "input_tokens.high"),
    (
        "uniform low above high (fuzz)",
        ["workload.input_tokens={dist: uniform, low: 100, high: 50}"],
        "low 100 is above high 50",
    ),
]


@pytest.mark.parametrize(("label", "sets", "needle"), SETS, ids=[c[0] for c in SETS])
def test_bad_numbers_in_overrides_exit_2(
    tmp_path: Path, label: str, sets: list[str], needle: str
) -> None:
    args = [*RUN, *(a for s in sets for a in ("--set", s))]
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, needle, "--set")
    assert len(output) < 400  # a 400- or 5000-digit value is not echoed back


def test_the_raft_lease_that_hung_exits_2(tmp_path: Path) -> None:
    args = ["run", "chaos-partition", "--quiet", "--set", "faults.raft.lease_interval=1e-300s"]
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, "faults.raft.lease_interval", ">= 1e-06 s")


def test_a_5000_digit_integer_in_a_scenario_names_its_line(tmp_path: Path) -> None:
    text = (ROOT / "scenarios" / "quickstart.yaml").read_text("utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("requests: 2000", f"requests: {HUGE}"))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if HUGE in t)
    code, output, folder = _invoke(tmp_path, ["run", str(path), "--quiet"])
    _assert_refused(code, output, folder, str(path), f"line {line}", "5000-digit")


def test_a_duplicate_key_names_the_file_the_key_and_both_lines(tmp_path: Path) -> None:
    text = (ROOT / "scenarios" / "quickstart.yaml").read_text("utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("  servers: 4\n", "  servers: 4\n  servers: 8\n"))
    lines = path.read_text().splitlines()
    first = lines.index("  servers: 4") + 1
    code, output, folder = _invoke(tmp_path, ["run", str(path), "--quiet"])
    _assert_refused(
        code, output, folder, str(path), f"line {first + 1}", "'servers'", f"line {first})"
    )


def test_duplicate_keys_are_errors_in_json_and_nested_yaml_but_merges_are_not() -> None:
    with pytest.raises(InputError, match=r"f\.yaml: line 4: duplicate key 'c'"):
        parse_mapping("a: 1\nb:\n  c: 2\n  c: 3\n", "f.yaml", "scenario")
    with pytest.raises(InputError, match="duplicate key 'a'"):
        parse_mapping('{"a": 1, "a": 2}', "f.json", "profile", "json")
    merged = parse_mapping("x: &A {a: 1}\ny:\n  <<: *A\n  a: 2\n", "f.yaml", "scenario")
    assert merged["y"] == {"a": 2}


def test_a_5000_digit_hash_id_in_a_mooncake_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        f'{{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": [{HUGE}]}}\n'
    )
    code, output, folder = _invoke(tmp_path, ["cache", "replay", str(trace)])
    _assert_refused(code, output, folder, str(trace), "line 2")


def test_a_10_mb_line_in_a_csv_trace(tmp_path: Path) -> None:
    """The C parser reads the long key; the bad size after it sends the reader to its
    line-by-line diagnosis, which met the csv module's field limit."""
    trace = tmp_path / "t.csv"
    trace.write_text("time,key,size\n0,a,10\n1," + "k" * 10_000_000 + ",10\n2,b,-1\n")
    code, output, folder = _invoke(tmp_path, ["cache", "replay", str(trace)])
    _assert_refused(code, output, folder, str(trace), "line 3", "field")


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ('{"timestamp": NaN, "input_length": 10, "output_length": 5}', "time"),
        ('{"timestamp": 1, "input_length": -3, "output_length": 5}', "input tokens"),
        (f'{{"timestamp": 1, "input_length": {10**12}, "output_length": 5}}', "input tokens"),
        (f'{{"timestamp": 1e400, "input_length": 10, "output_length": {HUGE}}}', "line 2"),
        (f'{{"timestamp": {10**400}, "input_length": 10, "output_length": 5}}', "line 2"),
    ],
)
def test_bad_records_of_a_workload_trace(tmp_path: Path, record: str, needle: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n' + record + "\n")
    args = [*RUN, "--set", "workload.kind=trace", "--set", f"workload.trace={trace}"]
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, str(trace), "line 2", needle)


def test_a_10_mb_line_in_a_request_csv_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time,input_tokens,output_tokens\n0,10,5\n1," + "9" * 10_000_000 + ",5\n")
    args = [*RUN, "--set", "workload.kind=trace", "--set", f"workload.trace={trace}"]
    args += ["--set", "workload.trace_format=csv"]
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, str(trace), "line 3")


def _plan(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(f"scenario: {ROOT / 'scenarios' / 'quickstart.yaml'}\n" + body)
    return path


def test_compare_decode_tp_zero_is_refused_on_load(tmp_path: Path) -> None:
    body = "qps: [5]\nslo: {p99: {all: 30s}}\ncompare: {decode_tp: [1, 0]}\n"
    code, output, folder = _invoke(tmp_path, ["plan", str(_plan(tmp_path, body))])
    _assert_refused(code, output, folder, "compare.decode_tp[1]")


def test_plan_with_an_unknown_model_exits_2_before_any_run(tmp_path: Path) -> None:
    body = "set: {deployments: [{model: llama-9000}]}\nqps: [5]\nslo: {p99: {all: 30s}}\n"
    code, output, folder = _invoke(tmp_path, ["plan", str(_plan(tmp_path, body))])
    _assert_refused(code, output, folder, "deployments[0].model", "llama-9000")


@pytest.mark.parametrize("qps", ["inf", "nan", "0", "-5", "1e30"])
def test_plan_qps_must_be_a_finite_positive_rate(tmp_path: Path, qps: str) -> None:
    code, output, folder = _invoke(tmp_path, ["plan", "plan-quickstart", "--qps", qps])
    _assert_refused(code, output, folder, "--qps")


def test_ab_with_a_malformed_profile_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text('{"name": "broken", "gpu": {')
    args = ["ab", "quickstart", "--a", "cluster.servers=2", "--b", "cluster.servers=3"]
    args += ["--seeds", "2", "--set", f"profile={profile}"]
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, str(profile))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ab", "ab-demo", "--seeds", str(2**63)], "--seeds"),
        (["ab", "ab-demo", "--seeds", "1-1000000000"], f"{MAX_SEEDS:,} seeds"),
        (["ab", "ab-demo", "--seeds", BIG], "--seeds"),
        (["ab", "ab-demo", "--seeds", "2", "--resamples", BIG], "--resamples"),
        (["ab", "ab-demo", "--seeds", "2", "--boot-seed", "-1"], "--boot-seed"),
        (["chaos", "chaos-partition", "--seeds", f"0-{2**64}"], "--seeds"),
        (["run", "quickstart", "--seed", BIG], "--seed"),
        (["cache", "replay", "--param", f"lru-k.k={BIG}"], "--param"),
        (["cache", "replay", "--limit", BIG], "--limit"),
    ],
)
def test_bad_numbers_on_the_command_line_exit_2(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, needle)
    assert len(output) < 400


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--batch", BIG], "--batch"),
        (["--context", BIG], "--context"),
        (["--context", HUGE], "--context"),
        (["--tp", "0"], "--tp"),
    ],
)
def test_bad_numbers_of_cost_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    code, output, folder = _invoke(tmp_path, ["cost", "--model", "llama-2-7b", *args], False)
    _assert_refused(code, output, folder, needle)


@pytest.mark.parametrize("until", ["nan", "inf", "-1", "1e999"])
def test_replay_until_must_be_finite(tmp_path: Path, until: str) -> None:
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps({"not": "read"}))
    code, output, folder = _invoke(tmp_path, ["replay", str(rec), "--until", until], False)
    _assert_refused(code, output, folder, "--until")


@pytest.mark.parametrize("command", ["run", "ab", "plan", "chaos", "sweep"])
def test_an_empty_out_is_refused(tmp_path: Path, command: str) -> None:
    args = {
        "run": ["run", "quickstart"],
        "ab": ["ab", "ab-demo"],
        "plan": ["plan", "plan-quickstart"],
        "chaos": ["chaos", "chaos-partition"],
        "sweep": ["sweep", "--scenario", "quickstart", "--grid", "cluster.servers=1,2"],
    }[command]
    code, output, folder = _invoke(tmp_path, [*args, "--out", ""], False)
    _assert_refused(code, output, folder, "--out", "empty")
    assert not (Path.cwd() / "summary.json").exists()


def test_an_out_name_longer_than_the_file_system_takes(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 300)
    code, output, _ = _invoke(tmp_path, ["run", "quickstart", "--quiet", "--out", str(long)], False)
    _assert_refused(code, output, tmp_path / "out", "--out", "longer than 255 bytes")


def test_a_trace_name_longer_than_the_file_system_takes(tmp_path: Path) -> None:
    args = [*RUN, "--set", "workload.kind=trace", "--set", f"workload.trace={'t' * 5000}.jsonl"]
    code, output, folder = _invoke(tmp_path, args)
    _assert_refused(code, output, folder, "workload.trace", "no such trace file")
    assert len(output) < 400


@pytest.mark.parametrize("value", ["&x [*x]", "[" * 5000 + "]" * 5000])
def test_a_set_value_nested_too_deep_or_in_a_cycle(tmp_path: Path, value: str) -> None:
    code, output, folder = _invoke(tmp_path, [*RUN, "--set", f"cache.params={value}"])
    _assert_refused(code, output, folder, "--set", "nested")
