"""Generate the scenario reference (``docs/scenario-reference.md``) from the schemas themselves.

``python -m sim.docgen > docs/scenario-reference.md`` regenerates it. The generator walks the
pydantic models users write files for -- scenario (:class:`sim.scenario.Scenario`, its
``faults:`` section from :mod:`sim.control.faults`), plan (:class:`sim.study.planspec.PlanFile`), sweep
(:class:`sim.study.sweep.spec.SweepFile`), calibration profile (:class:`sim.serving.costmodel.Profile`) and
model catalogue (:class:`sim.serving.models.CatalogueFile`) -- and prints one Markdown table per
section (field path, type, default, description), followed by the names the registries allow
(eviction policies, placement policies, workload kinds, fault kinds, shipped models and
profiles).

Contract: the output is a pure function of the code (no clock, no paths, no environment), so a
test can compare the committed file with :func:`render` byte for byte. Descriptions come from
the fields' attribute docstrings (``use_attribute_docstrings=True`` in each schema's config).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from engine import limits
from engine.policy import policy_class, policy_names
from engine.units import MAX_DURATION, MAX_RATE, MAX_SIZE, parse_duration, parse_rate, parse_size
from sim.control.faults import KINDS as FAULT_KINDS
from sim.scenario import Scenario, WorkloadCfg
from sim.serving.costmodel import SHIPPED_PROFILES, Profile, load_profile
from sim.serving.models import CatalogueFile, load_catalogue
from sim.serving.placement import PLACEMENTS
from sim.study.planspec import PlanFile
from sim.study.sweep.spec import SweepFile

REGENERATE = "python -m sim.docgen > docs/scenario-reference.md"

# Unit-parsing validators -> the type name shown (sizes, rates and durations accept units).
_UNIT_TYPES: dict[Any, str] = {
    parse_size: "size",
    parse_rate: "rate",
    parse_duration: "duration",
}


@dataclass(frozen=True)
class FileKind:
    """One kind of file users write: its title, root schema, prefix of field paths and intro."""

    title: str
    model: type[BaseModel]
    intro: str


FILES: tuple[FileKind, ...] = (
    FileKind(
        "Scenario file",
        Scenario,
        "A scenario YAML (`scenarios/*.yaml`, `pdsim run FILE`). Any field can be changed from "
        "the command line with `--set path=value` (e.g. `--set cluster.servers=8`).",
    ),
    FileKind(
        "Plan file",
        PlanFile,
        "Capacity planning (`pdsim plan FILE`); see `sim/study/planspec.py` for the SLO rules and `sim/study/plan.py` for the search.",
    ),
    FileKind(
        "Sweep file",
        SweepFile,
        "A grid of runs (`pdsim sweep FILE`); `--grid key=v1,v2` adds grid keys.",
    ),
    FileKind(
        "Calibration profile",
        Profile,
        "Hardware profile JSON (`profile:` in a scenario): a shipped name or a file written by "
        "`pdsim calibrate`. Sizes and rates may be numbers or strings with units.",
    ),
    FileKind(
        "Model catalogue",
        CatalogueFile,
        "Models the simulator serves (`catalogue:` in a scenario adds a file of this schema to "
        "the shipped `sim/data/models.yaml`).",
    ),
)

# One line per name of the families without docstrings of their own (checked by the tests:
# every registered name has one, and no stale name stays here).
PLACEMENT_HELP: dict[str, str] = {
    "random": "uniform over live nodes (from the run's `scheduler` seed stream)",
    "round-robin": "live nodes in turn",
    "least-loaded": "fewest queued + running requests (ties: lowest index)",
    "score": "lowest weighted score of load, KV fragmentation, PCIe use and affinity (R2)",
}
WORKLOAD_HELP: dict[str, str] = {
    "poisson": "Poisson arrivals at `rate`",
    "step": "piecewise-constant rate: `rate`, then each of `steps` from its `at` on (R11)",
    "diurnal": "sinusoidal rate `rate * (1 + amplitude * sin(2 pi t / period))`",
    "profile": "a day's rate (`rate_profile`: shape, noise, bursts, surges; a day compressed "
    "to `rate_profile.day`), non-homogeneous Poisson arrivals",
    "closed-loop": "`clients` users, each sending its next request `think_time` after an answer",
    "trace": "arrivals and token counts replayed from `trace` (Mooncake JSONL, CSV or the Azure "
    "LLM inference CSV; `trace_time_scale` / `trace_peak_rate` compress it)",
}
FAULT_HELP: dict[str, str] = {
    "kill": "stop a parameter server, node or Raft replica (restarts after `duration` if set)",
    "restart": "restart a killed host or replica (`disk: false`: without its state)",
    "partition": "cut network links by `shape` (optionally `one_way`)",
    "heal": "remove every partition",
    "degrade": "add latency, loss, duplication, lower bandwidth on the target's links",
    "slow": "scale every link of the target host by `factor`",
    "corrupt": "flip `bits` bits of a stored chunk on a parameter server (R28)",
    "pause": "a GC-like pause of a host for `duration`",
    "push": "a parameter update of model `model` written by `writer` (R4)",
}


# -- walking the schemas -----------------------------------------------------------------------
def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``, ``X | Y | None`` -> ``(X | Y, True)``; else
    ``(tp, False)``."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007
    return tp, False


def _sub_models(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a field holds (directly, in a list/dict/Optional or a union)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for a in get_args(tp):
        for m in _sub_models(a):
            if m not in out:
                out.append(m)
    return out


def type_name(tp: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """A short human name for a field type: ``size``, ``list of int``, ``"a" or "b"``."""
    for m in metadata:
        unit = _UNIT_TYPES.get(getattr(m, "func", None))
        if unit is not None:
            return unit
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        return type_name(base, meta)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        inner, optional = _strip_optional(tp)
        if optional:
            return f"{type_name(inner)} or null"
        names = [type_name(a) for a in get_args(tp)]
        return " or ".join(n for i, n in enumerate(names) if n not in names[:i])
    if origin is list:
        item = type_name(get_args(tp)[0])
        return "list of sections" if item == "section" else f"list of {item}"
    if origin is dict:
        key, val = get_args(tp)
        return f"map {type_name(key)} -> {type_name(val)}"
    if origin is tuple:
        return "[" + ", ".join(type_name(a) for a in get_args(tp)) + "]"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def default_text(field: FieldInfo) -> str:
    """The default as a Markdown cell: YAML-like code, *required* or *see below* (a section)."""
    if field.default is PydanticUndefined and field.default_factory is None:
        return "*required*"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "*see below*"
    if value is None:
        text = "null"
    elif isinstance(value, str):
        text = value if value else '""'
    else:
        text = json.dumps(_plain(value))
    return f"`{text}`"


def describe(field: FieldInfo) -> str:
    """The field's description on one line (empty when it has none)."""
    return " ".join((field.description or "").split())


@dataclass(frozen=True)
class Section:
    """One table: the fields of ``model`` found at ``path`` (``""`` for the top level);
    ``tag`` tells apart the members of a union at one path (``family "llama"``)."""

    path: str
    model: type[BaseModel]
    tag: str = ""


def sections(root: type[BaseModel]) -> Iterator[Section]:
    """Every section under ``root`` depth-first in field order; each model once per path."""
    stack: list[Section] = [Section("", root)]
    while stack:
        sec = stack.pop()
        yield sec
        children: list[Section] = []
        for name, field in sec.model.model_fields.items():
            if field.exclude:
                continue
            tp, _ = _strip_optional(field.annotation)
            subs = _sub_models(tp)
            suffix = "[]" if get_origin(tp) is list else ""
            base = f"{sec.path}.{name}" if sec.path else name
            for sub in subs:
                tag = ""
                if len(subs) > 1:
                    fam = sub.model_fields.get("family")
                    tag = f"family {type_name(fam.annotation)}" if fam is not None else sub.__name__
                children.append(Section(base + suffix, sub, tag))
        stack.extend(reversed(children))


def documented_models() -> list[type[BaseModel]]:
    """Every model the reference documents (each once, in order of first appearance)."""
    out: list[type[BaseModel]] = []
    for fk in FILES:
        for sec in sections(fk.model):
            if sec.model not in out:
                out.append(sec.model)
    return out


def undocumented(models: list[type[BaseModel]] | None = None) -> list[str]:
    """``Model.field`` for every field of ``models`` (default: :func:`documented_models`)
    without a description, in model and field order; empty when all are documented."""
    out: list[str] = []
    for m in documented_models() if models is None else models:
        out += [f"{m.__name__}.{n}" for n, f in m.model_fields.items() if not describe(f)]
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else " "


def _table(sec: Section, title: str) -> list[str]:
    doc = " ".join((inspect.getdoc(sec.model) or "").split())
    head = f"`{sec.path}`" if sec.path else "top level"
    lines = [f"### {title}: {head}" + (f" ({sec.tag})" if sec.tag else ""), ""]
    if doc:
        lines += [doc, ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in sec.model.model_fields.items():
        if field.exclude:
            continue
        path = f"{sec.path}.{name}" if sec.path else name
        typ = type_name(field.annotation, field.metadata)
        cells = [f"`{path}`", typ, default_text(field), describe(field)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


# -- registries --------------------------------------------------------------------------------
def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _policy_params(name: str) -> str:
    sig = inspect.signature(policy_class(name).__init__)
    out = []
    for p in sig.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        out.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(out) or "(none)"


def _registries() -> list[str]:
    lines = ["## Allowed names", ""]
    lines += [
        "### Eviction policies (`cache.*_policy`)",
        "",
        "Parameters go in `cache.params` (HBM policy only).",
        "",
        "| name | parameters | what it does |",
        "|---|---|---|",
    ]
    for name in policy_names():
        cls = policy_class(name)
        lines.append(f"| `{name}` | {_cell(_policy_params(name))} | {_cell(_first_line(cls))} |")
    lines += ["", "### Placement policies (`scheduler.policy`)", ""]
    lines += ["| name | what it does |", "|---|---|"]
    for name in sorted(PLACEMENTS):
        lines.append(f"| `{name}` | {_cell(PLACEMENT_HELP.get(name, ''))} |")
    lines += ["", "### Workload kinds (`workload.kind`)", ""]
    lines += ["| name | what it does |", "|---|---|"]
    for name in get_args(WorkloadCfg.model_fields["kind"].annotation):
        lines.append(f"| `{name}` | {_cell(WORKLOAD_HELP.get(name, ''))} |")
    lines += ["", "### Fault kinds (`faults.schedule[].kind`)", ""]
    lines += ["| name | what it does |", "|---|---|"]
    for name in FAULT_KINDS:
        lines.append(f"| `{name}` | {_cell(FAULT_HELP.get(name, ''))} |")
    lines += ["", "### Shipped models (`deployments[].model`)", ""]
    lines += ["| name | kind | parameters | layers | KV bytes/token |", "|---|---|---|---|---|"]
    for name, m in sorted(load_catalogue().items()):
        n = m.param_count
        count = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
        lines.append(f"| `{name}` | {m.kind} | {count} | {m.n_layers} | {m.kv_bytes_per_token} |")
    lines += ["", "### Shipped profiles (`profile`)", ""]
    lines += ["| name | source | GPU memory | HBM bandwidth | FP16 peak |", "|---|---|---|---|---|"]
    for name in SHIPPED_PROFILES:
        p = load_profile(name)
        lines.append(
            f"| `{name}` | {p.source} | {p.gpu.hbm_bytes / 1e9:.0f} GB "
            f"| {p.gpu.hbm_bandwidth / 1e12:.2f} TB/s | {p.gpu.flops_fp16 / 1e12:.0f} TFLOP/s |"
        )
    return [*lines, ""]


def _limits() -> list[str]:
    """The numeric limits every file, option and trace obeys (:mod:`engine.limits`)."""
    rows = [
        ("any number", "finite: `.inf`, `.nan`, `1e999` are errors; booleans are not numbers"),
        ("any integer", f"magnitude <= 2**63 - 1 ({limits.MAX_INT:,})"),
        ("a key", "written once per mapping (a duplicate key is an error naming its line)"),
        (
            "token counts",
            f"0..{limits.MAX_TOKENS:,} per prompt or output (`workload.*_tokens.low`, `high`, "
            "`mean`; trace records), so a prompt plus its output fits a 32-bit integer",
        ),
        (
            "requests of one run",
            f"at most {limits.MAX_REQUESTS:,}: `workload.requests`, `clients`, the peak rate x "
            "`workload.duration` of a generated workload, the records a trace workload uses",
        ),
        ("request rates", f"> 0 and <= {limits.MAX_REQUEST_RATE:g} requests/s"),
        (
            "intervals of periodic processes",
            f">= {limits.MIN_INTERVAL:g} s (`degradation.max_wait`, `hot_shards.window`, "
            "`metrics.interval`, `workload.period`, `faults.raft.heartbeat`, "
            "`lease_interval`, `client_timeout`, `election_timeout`, "
            "`disaggregation.retry`); 0 where the field says it turns the process off",
        ),
        ("sizes", f"0..{MAX_SIZE:,} bytes (1 EiB)"),
        ("rates (bandwidths)", f"> 0 and <= {MAX_RATE:g} bytes/s"),
        ("durations", f"0..{MAX_DURATION:g} s"),
        (
            "seeds",
            f"0..2**63 - 1; `seeds: N` and `--seeds` give at most {limits.MAX_SEEDS:,} seeds",
        ),
        (
            "command-line numbers",
            "whole numbers of at most 20 digits in each option's range (`--help`); "
            "`--qps` and `--until` finite and > 0; `--out` not empty",
        ),
    ]
    lines = [
        "## Limits",
        "",
        "Every number pdsim reads -- in any file above, on the command line, in a trace -- is "
        "checked on load against these ranges (`engine/limits.py`); outside them the command "
        "prints one line naming the file or option and the field, exits 2 and writes nothing. "
        "A run whose simulated clock still stops advancing (more than a million events within "
        f"{limits.MIN_INTERVAL:g} s of simulated time) stops with exit status 1 and names "
        "the process.",
        "",
        "| what | allowed |",
        "|---|---|",
    ]
    lines += [f"| {what} | {_cell(allowed)} |" for what, allowed in rows]
    return [*lines, ""]


def render() -> str:
    """The whole reference as Markdown (deterministic; see the module docstring)."""
    lines = [
        "# pdsim configuration reference",
        "",
        f"<!-- generated by sim/docgen.py; do not edit. Regenerate: {REGENERATE} -->",
        "",
        "Every knob of the files pdsim reads, generated from the schemas. Unknown keys are "
        "errors. Types: `size` is bytes or a string with a unit (`4MiB`, `80GB`), `rate` is "
        "bytes/s or a string (`200Gbit/s`, `7GB/s`), `duration` is seconds or a string "
        "(`500ms`, `10us`). `null` is YAML's empty value.",
        "",
    ]
    lines += ["## Contents", ""]
    for fk in FILES:
        anchor = fk.title.lower().replace(" ", "-")
        lines.append(f"- [{fk.title}](#{anchor})")
    lines += ["- [Limits](#limits)", "- [Allowed names](#allowed-names)", ""]
    for fk in FILES:
        lines += [f"## {fk.title}", "", fk.intro, ""]
        for sec in sections(fk.model):
            lines += _table(sec, fk.title)
    lines += _limits()
    lines += _registries()
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.docgen [--out FILE]``: print the reference (or write it to FILE)."""
    ap = argparse.ArgumentParser(prog="python -m sim.docgen", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    args = ap.parse_args(argv)
    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
