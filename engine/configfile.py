"""One loader for the configuration files pdsim reads (scenario, plan, sweep, profile, model
catalogue, chunk manifest): text -> mapping -> validated pydantic model.

Every problem becomes one :class:`engine.errors.InputError` naming the file, the place inside
it and what is allowed, for example::

    scenarios/x.yaml: cluster.nodez: unknown key (check the spelling); allowed: nodes, ...
    scenarios/x.yaml: line 3: not valid YAML: ...
    profiles/p.json: gpu.compute_efficiency: 1.5: Input should be less than or equal to 1

* :func:`read_mapping` -- a file on disk (``.json`` read as JSON, anything else as YAML).
* :func:`parse_mapping` -- the same for text already in memory (a packaged resource, a blob
  from a store).
* :func:`validate_model` -- a pydantic ``ValidationError`` turned into the message above: the
  field path is written the way the user wrote it (``a.b[2].c``; pydantic's union and
  discriminator tags are left out), unknown keys list the keys allowed there, literals list
  their values.

This module lives in ``engine`` because ``engine`` may not import ``sim``; it needs pydantic
and PyYAML (core dependencies) and no other part of pdsim but :mod:`engine.errors`.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from engine.errors import InputError

M = TypeVar("M", bound=BaseModel)

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a configuration file may have (deeper is an error,
not a ``RecursionError`` somewhere downstream)."""

__all__ = [
    "MAX_DEPTH",
    "check_depth",
    "explain",
    "format_loc",
    "load_yaml",
    "number_kind",
    "parse_mapping",
    "parse_value",
    "read_mapping",
    "validate_model",
    "yaml_problem",
]


def number_kind(annotation: Any) -> str | None:
    """``"number"`` for an int/float field, ``"mapping"`` for a dict of them, else None."""
    tp = _unwrap(annotation)
    if tp in (int, float):
        return "number"
    if get_origin(tp) is dict:
        args = get_args(tp)
        if len(args) == 2 and _unwrap(args[1]) in (int, float):
            return "mapping"
    return None


def check_depth(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``data`` (parsed YAML/JSON: dicts, lists, scalars) nests at most ``limit``
    containers deep; iterative, so any depth is safe to ask about."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            items: Any = x.values()
        elif isinstance(x, list | tuple):
            items = x
        else:
            continue
        if d > limit:
            return False
        stack.extend((v, d + 1) for v in items)
    return True


class _DuplicateKey(yaml.YAMLError):  # type: ignore[misc]
    """A mapping names the same key twice (``line`` and ``first`` are 1-based)."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class _TooLongNumber(yaml.YAMLError):  # type: ignore[misc]
    """An integer with more digits than Python converts (``line`` is 1-based)."""

    def __init__(self, digits: int, line: int) -> None:
        super().__init__(f"an integer with {digits} digits")
        self.digits, self.line = digits, line


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader, but a key written twice in one mapping and an integer too long to
    convert are errors (with their line) instead of the last value winning or a
    ``ValueError`` from deep inside the parser."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<:` merges keys that the mapping's own keys may override
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: PyYAML reports it
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1, first)
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)  # type: ignore[no-any-return]
        except ValueError:  # Python's limit on the digits of an int converted from text
            raise _TooLongNumber(len(str(node.value)), node.start_mark.line + 1) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, but a duplicate key in a mapping and an integer too long to
    convert raise :class:`yaml.YAMLError` (see :func:`parse_mapping` for the messages)."""
    return yaml.load(text, Loader=_Loader)


def yaml_problem(err: yaml.YAMLError) -> tuple[str, str | None]:
    """``(message, "line N" or None)`` describing a YAML error from :func:`load_yaml`."""
    if isinstance(err, _DuplicateKey):
        return (
            f"duplicate key {err.key!r} (first at line {err.first}); a key may appear once "
            "in a mapping",
            f"line {err.line}",
        )
    if isinstance(err, _TooLongNumber):
        return (
            f"{err.digits}-digit integer; allowed: integers of magnitude <= 2**63 - 1",
            f"line {err.line}",
        )
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else None
    return f"not valid YAML: {' '.join(str(err).split())}", where


class _DuplicateJsonKey(ValueError):
    """A JSON object names the same key twice."""


def parse_value(text: str, label: str) -> Any:
    """One value written on the command line (``--set k=VALUE``, a grid value), read as YAML
    by :func:`load_yaml`; ``InputError`` starting with ``label`` when it does not parse, names
    a key twice or holds an integer too long to convert."""
    try:
        value = load_yaml(text)
    except yaml.YAMLError as err:
        msg, _ = yaml_problem(err)
        raise InputError(f"{label}: value: {msg}") from None
    except RecursionError:
        value = _TOO_DEEP
    if value is _TOO_DEEP or not check_depth(value):
        raise InputError(f"{label}: value nested more than {MAX_DEPTH} levels deep")
    return value


_TOO_DEEP = object()


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; :class:`_DuplicateJsonKey` for a key given twice."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateJsonKey(f"duplicate key {k!r}; a key may appear once in an object")
        out[k] = v
    return out


def parse_mapping(
    text: str, source: str, kind: str, fmt: Literal["yaml", "json"] = "yaml"
) -> dict[str, Any]:
    """Parse ``text`` (from ``source``; ``kind`` names the file in messages, e.g. "plan") as
    YAML or JSON and return the top-level mapping.

    ``InputError`` (naming ``source`` and the line) for text that does not parse, a key
    written twice in one mapping, an integer too long to convert, and a document whose top
    level is not a mapping (an empty file included).
    """
    deep = f"nested more than {MAX_DEPTH} levels deep; a {kind} file is a few levels of keys"
    if fmt == "json":
        try:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        except json.JSONDecodeError as err:
            raise InputError(
                f"not valid JSON: {err.msg}", source=source, where=f"line {err.lineno}"
            ) from None
        except RecursionError:
            raise InputError(deep, source=source) from None
        except _DuplicateJsonKey as err:
            raise InputError(str(err), source=source) from None
        except ValueError:  # Python's limit on the digits of an int converted from text
            raise InputError(
                "an integer of more than 4300 digits; allowed: integers of magnitude <= 2**63 - 1",
                source=source,
            ) from None
    else:
        try:
            data = load_yaml(text)
        except yaml.YAMLError as err:
            msg, where = yaml_problem(err)
            raise InputError(msg, source=source, where=where) from None
        except RecursionError:
            raise InputError(deep, source=source) from None
    if not check_depth(data):
        raise InputError(deep, source=source)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(
            f"a {kind} file must be a mapping of keys to values, not {got}", source=source
        )
    return data


def read_mapping(
    path: str | Path, kind: str, hint: str = "", fmt: Literal["yaml", "json"] | None = None
) -> dict[str, Any]:
    """Read the file at ``path`` as a mapping: ``fmt``, or by default JSON when the name ends
    in ``.json`` and YAML otherwise.

    ``InputError`` naming the file for a missing or unreadable file (``no such {kind} file``,
    followed by ``; {hint}`` when given, e.g. the shipped names), text that is not UTF-8 or
    does not parse, or a top level that is not a mapping.
    """
    p = Path(path)
    tail = f"; {hint}" if hint else ""
    try:
        exists = p.is_file()
    except OSError as err:  # e.g. a name too long for the file system
        raise InputError(f"no such {kind} file ({err.strerror}){tail}", source=str(path)) from None
    if not exists:
        raise InputError(f"no such {kind} file{tail}", source=str(path))
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(
            f"cannot read {kind} file ({err.strerror}){tail}", source=str(path)
        ) from None
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text (byte {err.start}); a {kind} file is YAML or JSON", source=str(path)
        ) from None
    if fmt is None:
        fmt = "json" if p.suffix.lower() == ".json" else "yaml"
    return parse_mapping(text, str(path), kind, fmt)


def validate_model(cls: type[M], data: Any, source: str) -> M:
    """``cls.model_validate(data)``; on failure one ``InputError`` naming ``source``, the field
    path of the first error and what is allowed there (see the module docstring)."""
    if not isinstance(data, dict):
        got = "nothing" if data is None else f"a {type(data).__name__}"
        raise InputError(f"expected a mapping of keys to values, got {got}", source=source)
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        error = err.errors()[0]
        first: dict[str, Any] = dict(error)
        where, parent = _walk(cls, tuple(error["loc"]))
        raise InputError(
            explain(first, parent), source=source, where=where or "(top level)"
        ) from None


def format_loc(cls: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """Pydantic's error location as the user wrote the path: ``cluster.nodes[2].hbm``."""
    return _walk(cls, loc)[0]


def explain(err: dict[str, Any], parent: Any = None) -> str:
    """The message of one pydantic error dict; ``parent`` is the model the failing key belongs
    to (for the keys allowed next to an unknown one)."""
    typ = str(err.get("type", ""))
    msg = str(err.get("msg", ""))
    value = err.get("input")
    if typ == "extra_forbidden":
        fields = _fields(parent)
        allowed = f"; allowed: {', '.join(fields)}" if fields else ""
        return f"unknown key (check the spelling){allowed}"
    if typ == "literal_error":
        return f"{value!r} is not allowed; {msg.replace('Input should be', 'allowed:')}"
    if typ == "missing":
        return "required field is missing"
    if typ == "union_tag_invalid":
        ctx = err.get("ctx") or {}
        key = str(ctx.get("discriminator", "tag")).strip("'")
        return f"{key} {ctx.get('tag')!r} is not allowed; allowed: {ctx.get('expected_tags')}"
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        return f"{value!r}: expected a mapping of keys to values"
    if typ == "value_error":
        # raised by our own validators (units, cross-field checks): already a full sentence
        return msg.removeprefix("Value error, ")
    return f"{value!r}: {msg}"


# -- location walking --------------------------------------------------------------------------
def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``; ``X | None`` -> ``X``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
            continue
        if get_origin(tp) in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _fields(model: Any) -> list[str]:
    """The keys a user may write in ``model`` (fields excluded from dumps are set by code)."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [n for n, f in model.model_fields.items() if not f.exclude]
    return []


def _tag_member(union: Any, tag: str) -> Any:
    """The member of ``union`` that pydantic's location ``tag`` names (a discriminator value
    such as ``llama``, or a type name such as ``list[int]``); ``None`` if none does."""
    for member in get_args(union):
        m = _unwrap(member)
        if isinstance(m, type) and issubclass(m, BaseModel):
            for f in m.model_fields.values():
                if get_origin(f.annotation) is Literal and tag in get_args(f.annotation):
                    return m
            if tag == m.__name__:
                return m
        name = getattr(m, "__name__", None) if get_origin(m) is None else None
        if tag in (name, repr(m), str(m)) or str(m).replace("typing.", "") == tag:
            return m
    return None


def _walk(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, Any]:
    """(path text, model owning the last key) for a pydantic location under ``root``."""
    out = ""
    tp: Any = root
    parent: Any = root
    for part in loc:
        tp = _unwrap(tp)
        origin = get_origin(tp)
        if isinstance(part, int):
            out += f"[{part}]"
            args = get_args(tp)
            if origin is list and args:
                tp = args[0]
            elif origin is tuple and part < len(args):
                tp = args[part]
            else:
                tp = Any
            continue
        text = str(part)
        if origin in (Union, types.UnionType):
            member = _tag_member(tp, text)
            if member is not None:
                tp = member
                continue  # a union/discriminator tag, not a key the user wrote
        if text.startswith(("function-", "tagged-", "union[", "nullable[")):
            continue  # pydantic-internal schema step
        out += f".{text}" if out else text
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            parent = tp
            field = tp.model_fields.get(text)
            tp = field.annotation if field is not None else Any
        elif origin is dict:
            parent = None
            tp = get_args(tp)[1] if len(get_args(tp)) == 2 else Any
        else:
            parent = None
            tp = Any
    return out, parent
