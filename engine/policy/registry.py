"""One registry for the eviction-policy family.

Adding a policy is one class decorated with ``@register("name")``. Configuration names a
policy by that string; :func:`make_policy` builds it with keyword parameters and turns an
unknown name or parameter into an :class:`engine.errors.InputError` that lists what is allowed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from engine.errors import InputError
from engine.policy.base import EvictionPolicy

P = TypeVar("P", bound=type[EvictionPolicy])

_REGISTRY: dict[str, type[EvictionPolicy]] = {}


def register(name: str) -> Callable[[P], P]:
    """Class decorator: make the policy class available under ``name``."""

    def deco(cls: P) -> P:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"eviction policy {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def policy_names() -> list[str]:
    """The registered policy names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[EvictionPolicy]:
    """The class registered as ``name``; ``InputError`` listing the allowed names otherwise."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        allowed = ", ".join(sorted(_REGISTRY))
        raise InputError(f"unknown eviction policy {name!r}; allowed: {allowed}") from None


def make_policy(name: str, **params: Any) -> EvictionPolicy:
    """Build policy ``name`` with ``params``; unknown parameters are an ``InputError``."""
    cls = policy_class(name)
    sig = inspect.signature(cls.__init__)
    accepted = [p for p in sig.parameters if p != "self"]
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    unknown = sorted(set(params) - set(accepted))
    if unknown and not has_var_kw:
        raise InputError(
            f"policy {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(accepted) or '(none)'}"
        )
    try:
        return cls(**params)
    except (TypeError, ValueError) as err:
        raise InputError(f"policy {name!r}: {err}") from err


def _load_builtin() -> None:
    # Importing the package registers every built-in policy exactly once.
    import engine.policy  # noqa: F401
