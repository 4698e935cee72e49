"""Sweep files, ``--grid`` flags, and the points of a sweep.

A sweep is the cartesian product of grid values x seeds over one scenario. Every point is a
fully validated :class:`~sim.scenario.Scenario`, its seed, the swept values and a stable
config hash (:func:`sim.scenario.config_hash`: blake2b of the resolved scenario and seed), so
two points with the same hash are the same run.

Sweep file (YAML; unknown keys are errors)::

    scenario: quickstart.yaml        # relative to the sweep file (else the working directory)
    set: {workload.requests: 200}    # base overrides, applied before the grid
    variant: null                    # optional: one of the scenario's variants as the base
    grid:                            # key path -> values (the order of keys is kept)
      cluster.servers: [2, 4, 8]
      cache.hbm_policy: [lru, lru-k]
    seeds: 3                         # n -> seeds 0..n-1, or an explicit list [0, 7, 9]

A sweep always runs the *base* scenario: its ``variants`` and ``claims`` are dropped (choose a
variant with ``variant:``). Validation of every point happens before anything is run or
written: a bad key path or value is one :class:`InputError` naming the file and the field.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.configfile import parse_value, read_mapping, validate_model
from engine.errors import InputError
from engine.limits import MAX_SEED, MAX_SEEDS, CheckedModel, Seeds, show
from sim.scenario import Scenario, apply_overrides, config_hash, load_raw, validate


class SweepFile(CheckedModel, BaseModel):  # BaseModel named too, for linters
    """The schema of a sweep file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    scenario: str
    """Scenario file (relative to the sweep file, else the working directory)."""
    set: dict[str, Any] = {}
    """Base overrides `dotted.key: value`, applied before the grid, like `--set`."""
    variant: str | None = None
    """One of the scenario's variants as the base; null: the base scenario."""
    grid: dict[str, list[Any]] = {}
    """Key path -> values; the sweep runs every combination (key order kept)."""
    seeds: Seeds = Field(1)
    """Seeds per grid point: n -> 0..n-1 (n <= 100,000), or an explicit list of distinct seeds
    0..2**63-1."""


@dataclass(frozen=True)
class Point:
    """One run of a sweep: ``params`` are the swept values (grid key -> value, grid order)."""

    index: int
    params: dict[str, Any]
    seed: int
    scenario: Scenario = field(repr=False)
    config_hash: str


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets, braces or quotes."""
    parts: list[str] = []
    depth = 0
    quote = ""
    cur = ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    return parts


def parse_grid(text: str) -> tuple[str, list[Any]]:
    """``"cluster.servers=2,4,8"`` -> ``("cluster.servers", [2, 4, 8])``; values are YAML.

    Commas inside ``[...]``/``{...}`` or quotes do not split (``cache.params={k: 2},{k: 3}``).
    """
    if "=" not in text:
        raise InputError(f"--grid {text!r}: expected KEY=V1,V2,..., e.g. cluster.servers=2,4,8")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise InputError(f"--grid {text!r}: empty key path")
    values: list[Any] = []
    for item in _split_top_level(raw):
        if not item.strip():
            raise InputError(f"--grid {text!r}: empty value in the list")
        values.append(parse_value(item, f"--grid {show(text)}: {show(item)}"))
    return key, values


def seed_list(seeds: int | list[int], source: str = "seeds") -> list[int]:
    """``n`` -> ``[0..n-1]``; a list is checked (non-negative, no duplicates) and kept."""
    if isinstance(seeds, int):
        if seeds < 1:
            raise InputError(f"seeds: {seeds} must be >= 1", source=source)
        return list(range(seeds))
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise InputError(
            f"seeds: {seeds!r}: need a non-empty list of distinct integers >= 0", source=source
        )
    return list(seeds)


def override_text(key: str, value: Any) -> str:
    """An ``apply_overrides`` string for ``key = value`` (JSON is valid YAML)."""
    return f"{key}={json.dumps(value)}"


def load_sweep_file(path: str | Path) -> SweepFile:
    """Read and validate a sweep file; ``InputError`` naming the file and field otherwise."""
    return validate_model(SweepFile, read_mapping(path, "sweep"), str(path))


def resolve_scenario_path(scenario: str, relative_to: Path | None) -> Path:
    """The scenario named in a spec file: next to the spec file first, else as given, else a
    shipped scenario of that name (:mod:`sim.shipped`)."""
    from sim.shipped import shipped_path

    p = Path(scenario)
    if not p.is_absolute() and relative_to is not None and (relative_to / p).is_file():
        return relative_to / p
    if not p.exists():
        return shipped_path(scenario) or p
    return p


def base_data(
    scenario_path: str | Path, overrides: list[str], variant_name: str | None = None
) -> dict[str, Any]:
    """The scenario file as plain data with ``overrides`` (and a variant's) applied, variants
    and claims dropped. Validated here, so a bad override fails before any point is built."""
    src = str(scenario_path)
    data = apply_overrides(load_raw(scenario_path), overrides, src)
    sc = validate(data, source=src)
    if variant_name is not None:
        names = [v.name for v in sc.variants]
        if variant_name not in names:
            raise InputError(
                f"variant {variant_name!r} not in the scenario; allowed: {', '.join(names) or '(none)'}",
                source=src,
            )
        v = sc.variants[names.index(variant_name)]
        data = apply_overrides(data, [override_text(k, x) for k, x in v.set.items()], src)
    data["variants"] = []
    data["claims"] = []
    validate(data, source=src)
    return data


def build_points(
    scenario_path: str | Path,
    grid: dict[str, list[Any]],
    seeds: list[int],
    overrides: list[str] | None = None,
    variant_name: str | None = None,
    source: str | None = None,
) -> list[Point]:
    """Every (grid combination x seed) point, validated; ``InputError`` before anything runs.

    ``source`` names the sweep file (or ``--grid``) in error messages. Points are ordered by
    grid combination (first key slowest), then by seed; ``index`` is that position.
    """
    src = source or str(scenario_path)
    data = base_data(scenario_path, list(overrides or []), variant_name)
    abs_source = str(Path(scenario_path).resolve())
    for key, values in grid.items():
        if not values:
            raise InputError(f"grid {key}: needs at least one value", source=src)
        dumped = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(dumped)) != len(dumped):
            raise InputError(f"grid {key}: duplicate values in {values!r}", source=src)
    keys = list(grid)
    points: list[Point] = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        over = [override_text(k, v) for k, v in zip(keys, combo, strict=True)]
        try:
            sc = validate(apply_overrides(data, over, src), source=src)
        except InputError as err:
            label = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo, strict=True))
            raise InputError(f"grid point ({label}): {err}", source=src) from None
        sc.source = abs_source
        params = dict(zip(keys, combo, strict=True))
        for seed in seeds:
            points.append(Point(len(points), params, seed, sc, config_hash(sc, seed)))
    return points


def points_from_file(path: str | Path, extra_grid: list[str] | None = None) -> list[Point]:
    """The points of the sweep file at ``path``; ``extra_grid`` ``--grid`` flags add keys."""
    spec = load_sweep_file(path)
    grid = dict(spec.grid)
    for text in extra_grid or []:
        k, vals = parse_grid(text)
        grid[k] = vals
    scen = resolve_scenario_path(spec.scenario, Path(path).parent)
    over = [override_text(k, v) for k, v in spec.set.items()]
    return build_points(
        scen, grid, seed_list(spec.seeds, str(path)), over, spec.variant, source=str(path)
    )


#: the help text of every ``--seeds`` option (one syntax in ab, plan, sweep and chaos)
SEEDS_HELP = "Seeds: N (seeds 0..N-1), A-B (A to B inclusive) or a list A,B,C (may hold A-B)."


def parse_seed_option(text: str, option: str = "--seeds") -> list[int]:
    """The seeds of a ``--seeds`` value: ``N`` -> ``0..N-1``; ``A-B`` -> ``A..B``; a comma
    list (``3,7,10-12``) -> those seeds, sorted and distinct. Seeds are ``0..MAX_SEED`` and
    at most ``MAX_SEEDS`` of them (:mod:`engine.limits`), checked before any list is built.
    :class:`InputError` otherwise."""
    text = text.strip()
    allowed = (
        f"allowed: N (1..{MAX_SEEDS}), A-B (0 <= A <= B <= 2**63-1), or a comma list A,B,C; "
        f"at most {MAX_SEEDS:,} seeds"
    )
    digits = len(str(MAX_SEED))
    if text.isdigit():
        if len(text) > digits or not 1 <= int(text) <= MAX_SEEDS:
            cut = text if len(text) <= 40 else text[:37] + "..."
            raise InputError(f"{option} {cut}: N must be >= 1 and <= {MAX_SEEDS}; {allowed}")
        return list(range(int(text)))
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.isdigit() or (sep and not hi_s.isdigit()):
            raise InputError(
                f"{option} {show(text)}: {show(part)} is not a seed or range; {allowed}"
            )
        if len(lo_s) > digits or len(hi_s) > digits:
            raise InputError(f"{option} {show(text)}: {show(part)} is beyond 2**63-1; {allowed}")
        lo, hi = int(lo_s), int(hi_s) if sep else int(lo_s)
        if hi > MAX_SEED:
            raise InputError(f"{option} {show(text)}: {show(part)} is beyond 2**63-1; {allowed}")
        if hi < lo:
            raise InputError(
                f"{option} {show(text)}: {show(part)} ends before it starts; {allowed}"
            )
        ranges.append((lo, hi))
    if sum(hi - lo + 1 for lo, hi in ranges) > MAX_SEEDS:
        raise InputError(f"{option} {show(text)}: more than {MAX_SEEDS:,} seeds; {allowed}")
    return sorted({s for lo, hi in ranges for s in range(lo, hi + 1)})
