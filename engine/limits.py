"""The numeric limits of everything a user writes: one place for every configuration section
(scenario, plan, sweep, profile, catalogue), every CLI number option and every trace reader.

Every number is finite; beyond that each kind of quantity has a documented range
(``docs/scenario-reference.md``, "Limits"):

* any integer field: ``|n| <= 2**63 - 1`` (:data:`MAX_INT`, a 64-bit integer);
* a token count (a prompt, an output, a distribution's bounds and mean): ``0..`` :data:`MAX_TOKENS`,
  so a prompt plus its output fits a 32-bit integer;
* requests of one run (``workload.requests``, ``clients``, and the rate x duration of a
  duration-bounded workload): at most :data:`MAX_REQUESTS`;
* a request rate: at most :data:`MAX_REQUEST_RATE` requests/s;
* an interval of a periodic process (a timer, a window, a heartbeat): at least
  :data:`MIN_INTERVAL`, so that adding it to any clock value up to the longest duration
  (:data:`engine.units.MAX_DURATION`) moves the clock;
* a seed: ``0..`` :data:`MAX_SEED`; a list of seeds: at most :data:`MAX_SEEDS` of them.

:class:`CheckedModel` is the base of every configuration model: floats must be finite, and
no number anywhere in a field (lists and mappings included) may be a boolean where a number is
expected or an integer beyond :data:`MAX_INT`. The ``Annotated`` types below carry the ranges.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from engine.configfile import number_kind
from engine.units import parse_duration

MAX_INT = 2**63 - 1
"""Largest magnitude of any integer in a configuration file (a 64-bit integer)."""
MAX_TOKENS = 1_000_000_000
"""Most tokens of one prompt or one output (a prompt plus its output fits a 32-bit integer)."""
MAX_REQUESTS = 10_000_000
"""Most requests of one run (generated, drawn from a trace, or rate x duration)."""
MAX_REQUEST_RATE = 1e7
"""Largest request rate, requests/s."""
MIN_INTERVAL = 1e-6
"""Shortest interval of a periodic process, seconds (1 us)."""
MAX_SEED = 2**63 - 1
"""Largest seed (a 64-bit integer)."""
MAX_SEEDS = 100_000
"""Most seeds of one command (``--seeds``, a plan's or sweep's ``seeds``)."""

__all__ = [
    "MAX_INT",
    "MAX_REQUESTS",
    "MAX_REQUEST_RATE",
    "MAX_SEED",
    "MAX_SEEDS",
    "MAX_TOKENS",
    "MIN_INTERVAL",
    "CheckedModel",
    "Interval",
    "IntervalOrOff",
    "RequestRate",
    "Seed",
    "Seeds",
    "TokenCount",
    "check_number",
    "show",
]

TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
"""A whole number of tokens, ``0..MAX_TOKENS``."""
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
"""A random seed, ``0..MAX_SEED``."""
Seeds = (
    Annotated[int, Field(ge=1, le=MAX_SEEDS)]
    | Annotated[list[Seed], Field(min_length=1, max_length=MAX_SEEDS)]
)
"""The seeds of a plan or sweep file: ``n`` (seeds ``0..n-1``, ``1..MAX_SEEDS``) or a list
of at most ``MAX_SEEDS`` seeds."""
RequestRate = Annotated[float, Field(gt=0, le=MAX_REQUEST_RATE)]
"""A request rate, requests/s, in ``(0, MAX_REQUEST_RATE]``."""


def show(value: object) -> str:
    """``repr(value)`` cut to 40 characters (a 400-digit number stays a short message); an
    integer too long for ``repr`` is described by its length."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return f"a {value.bit_length()}-bit integer"
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def check_number(value: Any) -> str | None:
    """Why ``value`` (a number, or lists / tuples / mappings holding numbers, walked to any
    depth) is not a representable number: a float that is not finite or an integer beyond
    :data:`MAX_INT`; ``None`` when every number in it is fine. Other values are ignored."""
    found = _first_bad_number(value)
    return None if found is None else found[1]


def _first_bad_number(value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """``(path inside value, why)`` of the first number :func:`check_number` refuses."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    seen: set[int] = set()  # containers walked (YAML anchors can make a cycle)
    while stack:
        path, x = stack.pop()
        if isinstance(x, dict | list | tuple):
            if id(x) in seen:
                continue
            seen.add(id(x))
        if isinstance(x, bool):
            continue
        if isinstance(x, int):
            if abs(x) > MAX_INT:
                return path, f"{show(x)} is too large; allowed: integers of magnitude <= 2**63 - 1"
        elif isinstance(x, float):
            if not math.isfinite(x):
                return path, f"{x!r} is not a finite number"
        elif isinstance(x, dict):
            stack.extend(((*path, str(k)), v) for k, v in reversed(x.items()))
        elif isinstance(x, list | tuple):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(x))))
    return None


def _refuse(cls: type[BaseModel], loc: tuple[str | int, ...], value: Any, why: str) -> None:
    """Raise pydantic's error for ``why`` at ``loc`` (relative to the model being validated)."""
    detail = InitErrorDetails(
        type=PydanticCustomError("value_error", "{why}", {"why": why}), loc=loc, input=value
    )
    raise ValidationError.from_exception_data(cls.__name__, [detail])


class CheckedModel(BaseModel):
    """The base of every configuration model: floats are finite (``.inf`` and ``.nan`` are
    errors, also in text such as ``"inf"``), no number anywhere in the input (lists and
    mappings included) is a float that is not finite or an integer beyond :data:`MAX_INT`, and
    an int or float field (or a mapping of them) refuses YAML booleans (pydantic would read
    ``true`` as 1, so ``replication: true`` would silently mean 1). Errors name the field
    path. Subclasses add their own ``model_config`` (pydantic merges it with this one)."""

    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _checked_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            field = cls.model_fields.get(key) if isinstance(key, str) else None
            kind = number_kind(field.annotation) if field is not None else None
            if kind == "number" and isinstance(value, bool):
                _refuse(cls, (key,), value, f"{value!r} is a boolean, not a number")
            if kind == "mapping" and isinstance(value, dict):
                for k, v in value.items():
                    if isinstance(v, bool):
                        _refuse(cls, (key, k), v, f"{v!r} is a boolean, not a number")
        found = _first_bad_number(data)
        if found is not None:
            _refuse(cls, found[0], None, found[1])
        return data


def _interval(value: float) -> float:
    if value < MIN_INTERVAL:
        raise ValueError(
            f"{value!r} s is shorter than the shortest interval; allowed: >= {MIN_INTERVAL:g} s"
        )
    return value


def _interval_or_off(value: float) -> float:
    if 0 < value < MIN_INTERVAL:
        raise ValueError(
            f"{value!r} s is shorter than the shortest interval; allowed: 0 (off) or "
            f">= {MIN_INTERVAL:g} s"
        )
    return value


Interval = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_interval)]
"""The interval of a periodic process, seconds or a duration, at least :data:`MIN_INTERVAL`."""
IntervalOrOff = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_interval_or_off)]
"""An interval as :data:`Interval`, or 0 (the process is off or picks its own interval)."""
