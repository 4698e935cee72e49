"""`pdsim run` with an Azure-format trace and a profile workload: bad input is one line,
exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdsim.cli import app

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _run(tmp_path: Path, *sets: str) -> tuple[int, str, Path]:
    folder = tmp_path / "out"
    args = ["run", "quickstart", "--quiet", "--out", str(folder)]
    for s in ("workload.requests=20", *sets):
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output, folder


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ("2023-11-16 18:15:45.0,10,5", "line 3: TIMESTAMP"),
        ("2023-11-16 18:15:47.0,nan,5", "line 3: ContextTokens"),
        ("2023-11-16 18:15:47.0,10,-5", "line 3: GeneratedTokens"),
        ("2023-11-16 18:15:47.0,10," + "9" * 5000, "line 3: GeneratedTokens"),
    ],
)
def test_a_bad_azure_record_exits_2_with_one_line(tmp_path: Path, record: str, needle: str) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(HEADER + "2023-11-16 18:15:46.0,10,5\n" + record + "\n", encoding="utf-8")
    code, output, folder = _run(tmp_path, "workload.kind=trace", f"workload.trace={trace}")
    assert code == 2, output
    assert output.startswith("error:") and output.strip().count("\n") == 0, output
    assert str(trace) in output and needle in output
    assert not folder.exists() or not any(folder.iterdir())


def test_an_azure_trace_runs_with_its_format_detected(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:15:{46 + i:02d}.5000000,{100 + i},{8 + i}\n" for i in range(6)]
    trace.write_text(HEADER + "".join(rows), encoding="utf-8")
    code, output, folder = _run(
        tmp_path, "workload.kind=trace", f"workload.trace={trace}", "workload.trace_peak_rate=4"
    )
    assert code == 0, output
    assert any(folder.iterdir())


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["workload.trace_peak_rate=5", "workload.trace_time_scale=0.5"], "trace_time_scale 1"),
        (["workload.rate_profile.hourly=[1, 2]"], "hourly has 2 values"),
        (["workload.rate_profile.surges=[{at: 1h, multiplier: 0.5}]"], "multiplier"),
        (["workload.rate_profile.bogus=1"], "bogus"),
    ],
)
def test_bad_workload_fields_exit_2_naming_the_field(
    tmp_path: Path, sets: list[str], needle: str
) -> None:
    kind = "trace" if "trace" in sets[0] else "profile"
    extra = ["workload.trace=shipped:AzureLLMInferenceTrace_conv.csv"] if kind == "trace" else []
    code, output, folder = _run(tmp_path, f"workload.kind={kind}", *extra, *sets)
    assert code == 2, output
    assert output.startswith("error:") and output.strip().count("\n") == 0, output
    assert needle in output
    assert not folder.exists() or not any(folder.iterdir())
