"""The optional compiled build (``engine/native.py``, ``setup.py``, ``buildtools/``).

The slow test compiles the modules of ``engine.native.COMPILED`` with mypyc, as
``PDSIM_COMPILE=1`` does, in a copy of the tree, then runs the same scenarios in a plain and a
compiled subprocess: every trace hash and every summary must be equal. The fast tests check
the module list and the build backend's handling of ``PDSIM_COMPILE``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from engine.native import COMPILED, build_label, compiled_here

ROOT = Path(__file__).resolve().parents[1]

#: scenarios that reach every compiled module: a cold start over the network, faults
#: (a killed parameter server, a partition), disaggregation, two models sharing replicas,
#: KV preemption by recompute and by swap
KV_PRESSURE: dict[str, Any] = {
    "name": "kv-pressure",
    "profile": "a100-80gb",
    "mode": "coupled",
    "deployments": [{"model": "llama-2-7b"}],
    "cluster": {
        "servers": 1,
        "param_servers": 1,
        "server": {"host": "16GiB", "nvme": 0},
        "gpu": {"hbm": "16GiB", "memory_utilization": 1.0, "workspace": "1GiB"},
    },
    "chunks": {"size": "16MiB"},
    "kv": {"preemption": "recompute", "block_tokens": 16},
    "workload": {
        "kind": "poisson",
        "requests": 40,
        "rate": 50.0,
        "input_tokens": {"dist": "fixed", "mean": 256},
        "output_tokens": {"dist": "fixed", "mean": 600},
    },
}
CASES: dict[str, Any] = {
    "quickstart": "scenarios/quickstart.yaml",
    "chaos-kill-param-server": "scenarios/chaos-kill-param-server.yaml",
    "chaos-partition": "scenarios/chaos-partition.yaml",
    "disagg-llama8b-h200": "scenarios/disagg-llama8b-h200.yaml",
    "multi-model-coloring": "scenarios/multi-model-coloring.yaml",
    "kv-recompute": KV_PRESSURE,
    "kv-swap": {**KV_PRESSURE, "kv": {"preemption": "swap", "block_tokens": 16}},
    "diurnal-day": "scenarios/diurnal-day.yaml",
    "azure-conv-replay": "scenarios/azure-conv-replay.yaml",
}

#: run in a subprocess: each case's trace hash and summary, and the build that ran them
RUN = """
import json, sys
from engine.native import build_label
from sim.runner import run_scenario
from sim.scenario import load_scenario, validate
cases = json.loads(sys.argv[1])
out = {}
for name, spec in cases.items():
    sc = load_scenario(spec) if isinstance(spec, str) else validate(spec, source=name)
    res = run_scenario(sc, seed=3)
    out[name] = [res.trace_hash, json.dumps(res.summary, sort_keys=True, default=str)]
print(json.dumps({"build": build_label(), "runs": out}))
"""


def _run(tree: Path) -> dict[str, Any]:
    """RUN over CASES with ``tree``'s packages (it is the working directory, which ``-c``
    puts first on the path, and PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cases = {k: str(ROOT / v) if isinstance(v, str) else v for k, v in CASES.items()}
    proc = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(cases)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _copy_tree(dst: Path) -> None:
    for name in ("engine", "sim", "hwbench", "pdsim", "buildtools"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dst / name)


@pytest.mark.slow
def test_the_compiled_build_runs_every_scenario_bit_for_bit_as_plain_python(
    tmp_path: Path,
) -> None:
    _copy_tree(tmp_path)
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path,
        env={**os.environ, "PDSIM_COMPILE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    plain = _run(ROOT)
    compiled = _run(tmp_path)
    assert plain["build"] == "python"
    assert compiled["build"] == f"mypyc ({len(COMPILED)} of {len(COMPILED)} modules)"
    assert sorted(compiled["runs"]) == sorted(CASES)
    for name in CASES:
        assert compiled["runs"][name][0] == plain["runs"][name][0], f"{name}: trace hash"
        assert compiled["runs"][name][1] == plain["runs"][name][1], f"{name}: summary"


def test_every_compiled_module_is_a_python_file_of_the_tree() -> None:
    assert len(set(COMPILED)) == len(COMPILED)
    for name in COMPILED:
        assert (ROOT / Path(*name.split("."))).with_suffix(".py").is_file(), name


def _package_classes() -> list[type]:
    """Every class defined in a module of the four packages (all of them imported)."""
    out: list[type] = []
    for pkg_name in ("engine", "sim", "hwbench", "pdsim"):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg_name}."):
            mod = importlib.import_module(info.name)
            out += [
                c for c in vars(mod).values() if isinstance(c, type) and c.__module__ == info.name
            ]
    return out


#: the built-in bases mypyc's native classes may have (its "Native classes" page)
NATIVE_BUILTIN_BASES = (object, dict, tuple, BaseException, Exception, ValueError, IndexError,
                        LookupError, UserWarning, Warning)  # fmt: skip


def _declared_open(cls: type) -> bool:
    """Whether ``cls``'s source declares it open to Python subclasses
    (``@mypyc_attr(allow_interpreted_subclasses=True)`` or ``native_class=False``)."""
    head = inspect.getsource(cls).split("class ", 1)[0]
    return "@mypyc_attr(allow_interpreted_subclasses=True)" in head or (
        "@mypyc_attr(native_class=False)" in head
    )


def test_no_class_of_a_compiled_module_is_subclassed_elsewhere_or_built_on_a_builtin() -> None:
    # A Python class cannot inherit from a compiled one unless it is declared open (a
    # compiled class can: the modules are compiled together), and mypyc compiles a class
    # built on a built-in type only for a few types (engine/native.py's rules; the slow test
    # would fail at run time or at build time).
    compiled = set(COMPILED)
    classes = _package_classes()
    assert len(classes) > 100
    opened = set()
    for cls in classes:
        for base in cls.__mro__[1:]:
            if base.__module__ in compiled and cls.__module__ not in compiled:
                if not _declared_open(base):
                    raise AssertionError(f"{cls.__module__}.{cls.__name__} subclasses {base}")
                opened.add(base.__qualname__)
        if cls.__module__ in compiled:
            builtin = [b for b in cls.__mro__ if b.__module__ == "builtins"]
            assert set(builtin) <= set(NATIVE_BUILTIN_BASES), f"{cls}: {builtin}"
    assert opened == {"Placement", "Scheduler"}  # sim.disagg's prefill placement and scheduler


def test_a_plain_install_compiles_nothing() -> None:
    # the test tiers run from the source tree: no extension shadows a module
    assert compiled_here() == []
    assert build_label() == "python"


def _backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_pdsim_build", ROOT / "buildtools" / "pdsim_build.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("value", "compiled"), [("", False), ("0", False), ("1", True)])
def test_the_backend_reads_pdsim_compile(
    monkeypatch: pytest.MonkeyPatch, value: str, compiled: bool
) -> None:
    backend = _backend()
    monkeypatch.setenv("PDSIM_COMPILE", value)
    assert backend.compile_requested() is compiled
    if compiled:
        monkeypatch.chdir(ROOT)  # pip runs the backend in the project's folder
        wanted = backend.get_requires_for_build_wheel()
        assert wanted[0].startswith("mypy")
        # every dependency, pydantic among them: mypyc type-checks what the modules import
        assert {"pydantic", "numpy", "simpy"} <= {r.split(">")[0] for r in wanted}


def test_the_backend_refuses_bad_values_and_compiled_editable_installs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = _backend()
    monkeypatch.setenv("PDSIM_COMPILE", "yes")
    with pytest.raises(SystemExit, match=r"PDSIM_COMPILE='yes'.*allowed values are 0 .* and 1"):
        backend.compile_requested()
    monkeypatch.setenv("PDSIM_COMPILE", "1")
    with pytest.raises(SystemExit, match=r"without -e"):
        backend.get_requires_for_build_editable()
