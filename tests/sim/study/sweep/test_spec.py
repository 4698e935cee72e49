"""Sweep points: grid parsing, the product x seeds, validation before anything runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from sim.study.sweep import build_points, load_sweep_file, parse_grid, points_from_file, seed_list


def test_parse_grid_yaml_values_and_nested_commas() -> None:
    assert parse_grid("cluster.servers=2,4,8") == ("cluster.servers", [2, 4, 8])
    assert parse_grid("cache.hbm_policy=lru,lru-k") == ("cache.hbm_policy", ["lru", "lru-k"])
    key, vals = parse_grid("cache.params={k: 2, crp: 0},{k: 3}")
    assert key == "cache.params" and vals == [{"k": 2, "crp": 0}, {"k": 3}]
    assert parse_grid("name='a,b',c")[1] == ["a,b", "c"]


@pytest.mark.parametrize("bad", ["cluster.servers", "=1,2", "a..b=1", "cluster.servers=1,,2"])
def test_parse_grid_rejects(bad: str) -> None:
    with pytest.raises(InputError, match="--grid"):
        parse_grid(bad)


def test_seed_list() -> None:
    assert seed_list(3) == [0, 1, 2]
    assert seed_list([7, 1]) == [7, 1]
    for bad in (0, [], [1, 1], [-1]):
        with pytest.raises(InputError, match="seeds"):
            seed_list(bad)


def test_points_are_product_times_seeds_in_order(tiny: Path) -> None:
    grid = {"cluster.servers": [1, 2, 3], "cache.hbm_policy": ["lru", "fifo"]}
    pts = build_points(tiny, grid, [0, 5])
    assert len(pts) == 12
    assert [p.index for p in pts] == list(range(12))
    assert pts[0].params == {"cluster.servers": 1, "cache.hbm_policy": "lru"}
    assert pts[1].params == pts[0].params and (pts[0].seed, pts[1].seed) == (0, 5)
    assert pts[2].params["cache.hbm_policy"] == "fifo"
    assert pts[-1].scenario.cluster.servers == 3 and pts[-1].scenario.cache.hbm_policy == "fifo"
    assert len({p.config_hash for p in pts}) == 12
    # stable: the same sweep built again gives the same hashes
    assert [p.config_hash for p in build_points(tiny, grid, [0, 5])] == [p.config_hash for p in pts]
    # variants and claims are dropped from swept scenarios
    assert all(not p.scenario.variants for p in pts)


def test_variant_as_base(tiny: Path) -> None:
    (p,) = build_points(tiny, {}, [0], variant_name="big")
    assert p.scenario.cluster.servers == 4
    with pytest.raises(InputError, match="allowed: big"):
        build_points(tiny, {}, [0], variant_name="small")


def test_unknown_grid_key_names_the_field(tiny: Path) -> None:
    with pytest.raises(InputError, match=r"unknown key 'cluster.nodez'.*allowed here: servers"):
        build_points(tiny, {"cluster.nodez": [1, 2]}, [0])


def test_bad_grid_value_names_the_field(tiny: Path) -> None:
    with pytest.raises(InputError, match=r"cluster\.servers"):
        build_points(tiny, {"cluster.servers": [2, 0]}, [0])
    with pytest.raises(InputError, match="duplicate"):
        build_points(tiny, {"cluster.servers": [2, 2]}, [0])


def test_sweep_file(tiny: Path) -> None:
    f = tiny.parent / "s.yaml"
    f.write_text(
        "scenario: tiny.yaml\nset: {workload.requests: 5}\ngrid: {cluster.servers: [1, 2]}\n"
        "seeds: [3, 4]\n"
    )
    pts = points_from_file(f, ["cache.hbm_policy=lru,fifo"])
    assert len(pts) == 8
    assert {p.scenario.workload.requests for p in pts} == {5}
    assert {p.seed for p in pts} == {3, 4}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("scenario: tiny.yaml\ngrids: {}\n", "grids: unknown key"),
        ("grid: {}\n", "scenario: 'missing'|scenario"),
        ("scenario: tiny.yaml\nseeds: many\n", "seeds"),
        ("- 1\n", "mapping"),
        ("scenario: tiny.yaml\nset: {cluster.nodez: 3}\n", "cluster.nodez"),
        ("scenario: nowhere.yaml\n", "no such scenario"),
    ],
)
def test_bad_sweep_files(tiny: Path, text: str, match: str) -> None:
    f = tiny.parent / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=match):
        points_from_file(f)


def test_missing_sweep_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such sweep file"):
        load_sweep_file(tmp_path / "nope.yaml")


@settings(max_examples=15)
@given(
    nodes=st.lists(st.integers(1, 64), min_size=1, max_size=4, unique=True),
    servers=st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True),
    n_seeds=st.integers(1, 3),
)
def test_point_count_and_uniqueness_property(
    tmp_path_factory: pytest.TempPathFactory, nodes: list[int], servers: list[int], n_seeds: int
) -> None:
    from tests.sim.study.sweep.conftest import TINY

    f = tmp_path_factory.mktemp("prop") / "tiny.yaml"
    f.write_text(TINY)
    grid = {"cluster.servers": nodes, "cluster.param_servers": servers}
    pts = build_points(f, grid, list(range(n_seeds)))
    assert len(pts) == math.prod(len(v) for v in grid.values()) * n_seeds
    assert len({p.config_hash for p in pts}) == len(pts)
    expected = [(n, s, seed) for n in nodes for s in servers for seed in range(n_seeds)]
    got = [(p.scenario.cluster.servers, p.scenario.cluster.param_servers, p.seed) for p in pts]
    assert got == expected
