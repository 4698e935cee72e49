"""Execute every research notebook top to bottom (issue 7: CI runs all of them).

Each ``notebooks/*.py`` (Jupytext percent format, the only committed form) is converted to a
notebook in memory with ``jupytext`` and executed with ``nbclient`` on the ``python3`` kernel,
working directory and output folder (``PDSIM_NOTEBOOK_OUT``) both a fresh temporary directory,
so nothing is written into the repository. Any cell error fails the test with the cell's
traceback. Beyond "no error", the test checks the files each notebook promises to write and
the assertions inside the notebooks themselves (they check their own results: OPT is a lower
bound, colour isolation holds, the plan's answer is reproducible, ...).

Tiers: executing all four takes 2 min of CPU and 3-5.5 min of wall time on the shared 2-core
machine (the calibration notebook serves requests in real time), so execution is ``slow``
(CI's second tier, ``pytest -m slow``). The default tier checks that every notebook parses
and that every name it imports exists, which catches a renamed public API in seconds.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

#: files each notebook must leave under ``$PDSIM_NOTEBOOK_OUT/<notebook name>/``
EXPECTED: dict[str, tuple[str, ...]] = {
    "chaos-replay": ("timeline.csv", "chaos_timeline.png"),
    "capacity-planning": (
        "plan/frontier.parquet",
        "plan/frontier.png",
        "plan/plan.json",
        "frontier.png",
        "sweep.csv",
        "p99_vs_nodes.png",
        "saturation.png",
    ),
    "calibration": (
        "links.png",
        "matmul.png",
        "engine_iterations.png",
        "validation.csv",
        "latency_cdfs.png",
        "errors.png",
    ),
    "policy-research": (
        "miss_ratio_curves.csv",
        "miss_ratio_curves.png",
        "r3_lruk_vs_lru.csv",
        "r3_gain.png",
        "r13_isolation.csv",
        "r13_isolation.png",
    ),
}

#: modules a notebook needs beyond the always-present ones (skipped cleanly where absent)
NEEDS: dict[str, tuple[str, ...]] = {
    "chaos-replay": ("sim.study.recording", "sim.control.faultinject"),
    "capacity-planning": ("sim.study.plan",),
}

#: per-cell time limit (s): generous for a loaded 2-core CI machine
CELL_TIMEOUT = 600


def _notebook_names() -> list[str]:
    return sorted(p.stem for p in NOTEBOOKS.glob("*.py"))


def test_every_notebook_is_covered() -> None:
    """A new notebook must be listed with the files it writes (so this test checks it)."""
    assert sorted(EXPECTED) == _notebook_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_imports_resolve(name: str) -> None:
    """Fast tier: the source parses and every name it imports exists (catches a renamed or
    removed public API without running the notebook)."""
    for module in NEEDS.get(name, ()):
        pytest.importorskip(module)
    tree = ast.parse((NOTEBOOKS / f"{name}.py").read_text(encoding="utf-8"))
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mod = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(mod, a.name)]
    assert not missing, f"{name} imports names that do not exist: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook executes without a cell error and writes its files under the temp dir."""
    for module in NEEDS.get(name, ()):
        pytest.importorskip(module)
    nb = jupytext.read(NOTEBOOKS / f"{name}.py")
    monkeypatch.setenv("PDSIM_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"notebook {name} failed:\n{err}")
    out = tmp_path / name
    missing = [
        f for f in EXPECTED[name] if not (out / f).is_file() or (out / f).stat().st_size == 0
    ]
    assert not missing, f"{name} did not write {missing}"
    # nothing outside the output folder: the working directory holds only it
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
