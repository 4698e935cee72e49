"""Fuzzing the input readers: any input ends in engine.errors.InputError or a result.

Hypothesis mutates the shipped scenarios (deleted keys, wrong types, NaN/inf/huge/boolean
values, truncation, bad bytes, deep nesting) and small valid traces of each format (CSV,
oracleGeneral, Mooncake JSONL: truncation, bad bytes, hostile fields, deep nesting). The
scenario loader, its pre-run checks (catalogue, profile, feasibility, fault targets) and the
trace readers must raise nothing but :class:`InputError`. Slow tier: 1,200 cases in all.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from engine.traces.detect import read_trace

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
DEEP = "[" * 2000 + "]" * 2000
HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1.5, 1e308, -1e308, float("inf"), float("nan"), "1e999",
    10**400, "9" * 400, "", "abc", "4MiB", "-5s", "100Gbit/s", "12 GBB", [], {}, [1, 2],
    {"x": 1}, "raft-leader", "ps99", [[[]]],
]  # fmt: skip

pytestmark = pytest.mark.slow


def _paths(x: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path into parsed YAML ``x``."""
    out = [prefix] if prefix else []
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(data: Any, path: tuple[Any, ...], op: str, value: Any) -> None:
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    key = path[-1]
    if op == "delete":
        del parent[key]
    else:
        # a copy: the hostile values are shared by every example, and a later mutation inside
        # one (or the value put inside itself) must not carry over or build a cycle
        parent[key] = copy.deepcopy(value)


OPS = st.tuples(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["delete", "replace", "replace"]),
    st.sampled_from(HOSTILE),
)


def _load_and_check(path: Path) -> None:
    from sim.cluster import check_feasible
    from sim.control.faults import check_faults
    from sim.scenario import load_scenario
    from sim.serving.costmodel import load_profile
    from sim.serving.models import load_catalogue

    sc = load_scenario(path)
    base = path.parent
    cat = load_catalogue(base / sc.catalogue if sc.catalogue else None)
    check_feasible(sc, cat, load_profile(sc.profile))
    check_faults(sc)


@settings(
    max_examples=700,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    scenario=st.sampled_from(SCENARIOS),
    ops=st.lists(OPS, min_size=1, max_size=3),
    damage=st.sampled_from(["none", "none", "truncate", "bytes", "deep"]),
    where=st.integers(min_value=0, max_value=10**6),
    junk=st.binary(min_size=1, max_size=8),
)
def test_scenario_loader_raises_only_input_errors(
    tmp_path: Path, scenario: Path, ops: list, damage: str, where: int, junk: bytes
) -> None:
    data = yaml.safe_load(scenario.read_text())
    for pick, op, value in ops:
        paths = _paths(data)
        if not paths:
            break
        _mutate(data, paths[pick % len(paths)], op, value)
    raw = yaml.safe_dump(data, allow_unicode=True).encode()
    if damage == "truncate":
        raw = raw[: where % (len(raw) + 1)]
    elif damage == "bytes":
        at = where % (len(raw) + 1)
        raw = raw[:at] + junk + raw[at:]
    elif damage == "deep":
        raw += b"\ndescription: " + DEEP.encode() + b"\n"
    path = tmp_path / scenario.name
    path.write_bytes(raw)
    try:
        _load_and_check(path)
    except InputError as err:
        assert str(err)


CSV = b"time,key,size,color\n0.0,a,4096,m1\n0.5,b,8192,m2\n1.0,a,4096,m1\n"
MOONCAKE = (
    json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]})
    + "\n"
    + json.dumps({"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, 3]})
    + "\n"
).encode()
ORACLE = b"".join(struct.pack("<IQIq", t, k, 4096, -1) for t, k in ((0, 1), (1, 2), (2, 1)))
TOKENS = [b"inf", b"nan", b"1e999", b"9" * 400, b"-1", b"true", b"", b'"x"', b"[]",
          b"{}", DEEP.encode(), b"\xff\xfe", b",", b"\n"]  # fmt: skip


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fmt=st.sampled_from(["csv", "mooncake", "oracle"]),
    cuts=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10**6),
            st.sampled_from(["truncate", "insert", "replace"]),
            st.one_of(st.sampled_from(TOKENS), st.binary(max_size=12)),
        ),
        min_size=1,
        max_size=3,
    ),
    declared=st.booleans(),
)
def test_trace_readers_raise_only_input_errors(
    tmp_path: Path, fmt: str, cuts: list, declared: bool
) -> None:
    raw = {"csv": CSV, "mooncake": MOONCAKE, "oracle": ORACLE}[fmt]
    for where, op, token in cuts:
        at = where % (len(raw) + 1)
        if op == "truncate":
            raw = raw[:at]
        elif op == "insert":
            raw = raw[:at] + token + raw[at:]
        else:
            raw = raw[:at] + token + raw[at + len(token) :]
    path = tmp_path / f"t.{ {'csv': 'csv', 'mooncake': 'jsonl', 'oracle': 'oracleGeneral'}[fmt] }"
    path.write_bytes(raw)
    try:
        trace = read_trace(path, fmt if declared else "auto")
    except InputError as err:
        assert str(err)
    else:
        assert len(trace.time) == len(trace.key)
