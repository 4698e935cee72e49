"""``pdsim plan --workers 2`` in an install without the ``dist`` extra (no Dask): the runs go
to local processes with one line naming the extra, and ``--scheduler`` is refused in one line
naming it -- never a ``ModuleNotFoundError`` traceback (the README's headline command).

Dask is made unimportable in a child interpreter (``sys.modules["dask"] = None`` before the
CLI starts), so the test holds whether or not this venv has Dask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCEN = ROOT / "scenarios"

#: runs the CLI with Dask unimportable (as after ``pip install -e .`` without ``[dist]``)
_SHIM = (
    "import sys\n"
    "for name in ('dask', 'dask.distributed', 'distributed'):\n"
    "    sys.modules[name] = None\n"
    "from pdsim.cli import main\n"
    "sys.argv = ['pdsim', *sys.argv[1:]]\n"
    "main()\n"
)


def _pdsim_without_dask(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", _SHIM, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
        check=False,
    )


def _plan(tmp_path: Path) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"scenario: {SCEN / 'quickstart.yaml'}\nseeds: 2\nslo: {{p99: {{all: 5s}}}}\n"
        "size_range: [1, 4]\nqps: [10]\nset: {workload.duration: 10s}\n"
    )
    return plan


def test_plan_workers_2_without_dask_runs_on_local_processes(tmp_path: Path) -> None:
    r = _pdsim_without_dask(
        "plan", str(_plan(tmp_path)), "--workers", "2", "--out", str(tmp_path / "o"), "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "Dask is not installed" in ln]
    assert len(notes) == 1 and ".[dist]" in notes[0] and "2 local processes" in notes[0]
    answer = json.loads(r.stdout.strip().splitlines()[-1])["answer"]
    assert answer["meets_slo"] and 1 <= answer["servers"] <= 4


def test_scheduler_without_dask_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    r = _pdsim_without_dask(
        "plan", str(_plan(tmp_path)), "--scheduler", "tcp://127.0.0.1:1",
        "--out", str(tmp_path / "o"), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "--scheduler tcp://127.0.0.1:1" in lines[0] and ".[dist]" in lines[0]
    assert not (tmp_path / "o").exists()
