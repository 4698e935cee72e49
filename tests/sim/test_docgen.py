"""The generated configuration reference: every knob documented, the committed file in sync."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from engine.units import parse_duration, parse_rate, parse_size
from sim import docgen
from sim.control.faults import KINDS, FaultSpec, RaftCfg, RandomFaultsCfg
from sim.scenario import GpuCfg, ReplicaCfg, Scenario, StepCfg, WorkloadCfg
from sim.serving.costmodel import GpuProfile, LinkProfile, Profile
from sim.serving.models import CatalogueFile, LayerSpec, LlamaShape, ResNetShape
from sim.serving.placement import PLACEMENTS
from sim.study.planspec import PlanFile, SloCfg
from sim.study.sweep.spec import SweepFile

REFERENCE = Path(__file__).parents[2] / "docs" / "scenario-reference.md"


def test_every_field_of_every_documented_model_has_a_description() -> None:
    models = docgen.documented_models()
    # the walk reaches the nested sections of every file kind, not only the roots
    for m in (Scenario, GpuCfg, ReplicaCfg, StepCfg, FaultSpec, RaftCfg, RandomFaultsCfg, PlanFile, SloCfg,
              SweepFile, Profile, GpuProfile, LinkProfile, CatalogueFile, LayerSpec, LlamaShape,
              ResNetShape):  # fmt: skip
        assert m in models, m.__name__
    assert docgen.undocumented() == []


def test_undocumented_names_a_field_without_docstring() -> None:
    class Probe(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        good: int = 1
        """Documented."""
        bad: int = 2

    assert docgen.undocumented([Probe]) == ["Probe.bad"]


def test_committed_reference_matches_the_generator() -> None:
    expected = docgen.render()
    actual = REFERENCE.read_text(encoding="utf-8") if REFERENCE.is_file() else "(missing)"
    assert actual == expected, (
        f"{REFERENCE} is out of date with the schemas; regenerate it with: {docgen.REGENERATE}"
    )


def test_reference_lists_every_field_path_and_registry_name() -> None:
    text = docgen.render()
    for path in ("cluster.gpu.hbm", "faults.schedule[].kind", "workload.steps[].rate",
                 "slo.p99", "links.rdma.bandwidth", "models[].shape.vocab", "grid"):  # fmt: skip
        assert f"| `{path}` |" in text, path
    assert "`source`" not in text.split("## Plan file")[0]  # loader-only field, not a key
    for name in ("lru-k", "color-lru", "least-loaded", "closed-loop", "majorities-ring",
                 "corrupt", "llama-2-70b", "h200-sxm"):  # fmt: skip
        assert f"`{name}`" in text or f'"{name}"' in text, name


def test_help_tables_cover_exactly_the_registered_names() -> None:
    assert sorted(docgen.PLACEMENT_HELP) == sorted(PLACEMENTS)
    kinds = get_args(WorkloadCfg.model_fields["kind"].annotation)
    assert sorted(docgen.WORKLOAD_HELP) == sorted(kinds)
    assert sorted(docgen.FAULT_HELP) == sorted(KINDS)


def test_type_names_and_defaults() -> None:
    class T(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        a: Annotated[int, BeforeValidator(parse_size)] = "4MiB"  # type: ignore[assignment]
        b: Annotated[float, BeforeValidator(parse_rate)] | None = None
        c: list[Annotated[float, BeforeValidator(parse_duration)]] = []
        d: Literal["x", "y"] = "x"
        e: tuple[int, float] = (1, 2.0)
        f: dict[str, int] = Field(default_factory=dict)
        g: int

    f = T.model_fields
    names = {k: docgen.type_name(v.annotation, v.metadata) for k, v in f.items()}
    assert names == {
        "a": "size",
        "b": "rate or null",
        "c": "list of duration",
        "d": '"x" or "y"',
        "e": "[int, float]",
        "f": "map str -> int",
        "g": "int",
    }
    defaults = {k: docgen.default_text(v) for k, v in f.items()}
    assert defaults == {
        "a": "`4MiB`",
        "b": "`null`",
        "c": "`[]`",
        "d": "`x`",
        "e": "`[1, 2.0]`",
        "f": "`{}`",
        "g": "*required*",
    }


def test_main_writes_the_same_text(tmp_path: Path) -> None:
    out = tmp_path / "ref.md"
    assert docgen.main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == docgen.render()
