"""engine.configfile: one loader, one message format for every configuration file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from engine.configfile import format_loc, parse_mapping, read_mapping, validate_model
from engine.errors import InputError


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(default=1, ge=1)
    mode: Literal["a", "b"] = "a"


class _Cat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    family: Literal["cat"]
    lives: int = 9


class _Dog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    family: Literal["dog"]
    good: bool = True


class _Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    inner: _Inner = _Inner()
    items: list[_Inner] = []
    table: dict[str, list[int]] = {}
    seeds: int | list[int] = 1
    pet: _Cat | _Dog | None = Field(default=None, discriminator="family")
    pair: tuple[int, float] = (1, 1.0)
    hidden: str = Field(default="", exclude=True)


def _err(data: Any) -> str:
    with pytest.raises(InputError) as info:
        validate_model(_Root, data, "f.yaml")
    assert info.value.source == "f.yaml"
    return str(info.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"name": "x", "inenr": {}},
            "f.yaml: inenr: unknown key (check the spelling); allowed: "
            "name, inner, items, table, seeds, pet, pair",
        ),
        (
            {"name": "x", "inner": {"sise": 2}},
            "inner.sise: unknown key (check the spelling); allowed: size, mode",
        ),
        ({"name": "x", "items": [{}, {"size": 0}]}, "items[1].size: 0: Input should be greater"),
        (
            {"name": "x", "items": [{"mode": "c"}]},
            "items[0].mode: 'c' is not allowed; allowed: 'a' or 'b'",
        ),
        ({}, "f.yaml: name: required field is missing"),
        ({"name": "x", "table": {"k": [1, "z"]}}, "table.k[1]: 'z': Input should be a valid"),
        ({"name": "x", "seeds": "many"}, "f.yaml: seeds: 'many': Input should be a valid integer"),
        ({"name": "x", "pet": {"family": "dog", "lives": 3}}, "pet.lives: unknown key"),
        (
            {"name": "x", "pet": {"family": "cow"}},
            "pet: family 'cow' is not allowed; allowed: 'cat', 'dog'",
        ),
        ({"name": "x", "pair": [1, "q"]}, "pair[1]: 'q': Input should be a valid number"),
        ({"name": "x", "inner": 3}, "inner: 3: expected a mapping of keys to values"),
        ([1, 2], "f.yaml: expected a mapping of keys to values, got a list"),
    ],
)
def test_validation_errors_name_source_field_and_allowed(data: Any, message: str) -> None:
    assert message in _err(data)


def test_valid_data_round_trips() -> None:
    m = validate_model(_Root, {"name": "x", "pet": {"family": "cat"}, "seeds": [1, 2]}, "s")
    assert isinstance(m.pet, _Cat) and m.seeds == [1, 2]


@given(
    path=st.lists(
        st.one_of(st.integers(0, 9), st.sampled_from(["a", "b_c", "d1"])), min_size=1, max_size=6
    )
)
def test_format_loc_matches_a_reference_for_plain_paths(path: list[int | str]) -> None:
    # Reference: keys joined by dots, list indexes in brackets (no union tags in this schema).
    ref = ""
    for p in path:
        ref += f"[{p}]" if isinstance(p, int) else (f".{p}" if ref else p)
    assert format_loc(BaseModel, tuple(path)) == ref


def test_read_mapping_yaml_json_and_errors(tmp_path: Path) -> None:
    y = tmp_path / "a.yaml"
    y.write_text("x: 1\ny: [1, 2]\n")
    assert read_mapping(y, "plan") == {"x": 1, "y": [1, 2]}
    j = tmp_path / "p.json"
    j.write_text('{"x": 1}')
    assert read_mapping(j, "profile") == {"x": 1}
    with pytest.raises(InputError, match=r"nope\.yaml: no such plan file; shipped: a, b$"):
        read_mapping(tmp_path / "nope.yaml", "plan", hint="shipped: a, b")
    j.write_text('{\n  "x": oops}')
    with pytest.raises(InputError, match=r"p\.json: line 2: not valid JSON"):
        read_mapping(j, "profile")
    y.write_text("x: [1,\n  y: 2\n")
    with pytest.raises(InputError, match=r"a\.yaml: line \d+: not valid YAML"):
        read_mapping(y, "sweep")
    y.write_text("- 1\n- 2\n")
    with pytest.raises(
        InputError, match="a sweep file must be a mapping of keys to values, not a list"
    ):
        read_mapping(y, "sweep")
    y.write_text("")
    with pytest.raises(InputError, match="not an empty file"):
        read_mapping(y, "sweep")
    y.write_bytes(b"x: \xff\xfe\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_mapping(y, "sweep")
    with pytest.raises(InputError, match="no such scenario file"):
        read_mapping(tmp_path, "scenario")  # a directory is not a file


def test_parse_mapping_from_text() -> None:
    assert parse_mapping("a: {b: 2}", "mem", "catalogue") == {"a": {"b": 2}}
    with pytest.raises(InputError, match=r"^mem: line 1: not valid JSON"):
        parse_mapping("[", "mem", "manifest", fmt="json")
