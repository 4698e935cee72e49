"""A single-point mutant: one line of one function's source replaced, patched in in-process.

A :class:`Mutant` is a bug a real engineer could write, in one line of one function: the
function's source text with ``old`` replaced by ``new`` (``old`` must occur exactly once),
compiled in the function's module and patched over the original in-process
(:meth:`Mutant.applied`); no file is edited. ``owner`` is the class that defines the method
(so the patch replaces the code every instance runs), or the module of a module-level
function. ``kind`` says what the bug breaks
(``safety`` or ``liveness`` for Raft; a short word elsewhere). ``tests`` are the test files
that target the mutated code: the pytest route of the harness (``python -m tests.mutation``)
runs only those. ``equivalent`` records, for a mutant no test can kill, why it changes no
behaviour.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mutant:
    name: str
    doc: str
    owner: Any  # the class whose method (or the module whose function) is replaced
    method: str
    old: str
    new: str
    kind: str = "safety"
    tests: tuple[str, ...] = ()
    #: why the mutant cannot change behaviour (empty: it can, so some test must kill it)
    equivalent: str = ""

    def patched(self) -> Any:
        """The mutated function (raises if ``old`` is not found exactly once)."""
        fn = self.owner.__dict__[self.method]
        wrapper = type(fn) if isinstance(fn, staticmethod | classmethod) else None
        if wrapper is not None:
            fn = fn.__func__
        src = textwrap.dedent(inspect.getsource(fn))
        if src.count(self.old) != 1:
            raise AssertionError(f"{self.name}: {self.old!r} occurs {src.count(self.old)} times")
        module = inspect.getmodule(fn)
        assert module is not None
        scope: dict[str, Any] = {}
        # decorators are dropped from the source (they would wrap twice): a staticmethod or
        # classmethod is rewrapped below
        lines = src.splitlines(keepends=True)
        while lines and lines[0].lstrip().startswith("@"):
            lines.pop(0)
        code = "".join(lines).replace(self.old, self.new)
        flags = annotations.compiler_flag  # annotations stay unevaluated
        if "super()" not in code:
            obj = compile(code, f"<mutant {self.name}>", "exec", flags=flags, dont_inherit=True)
            exec(obj, module.__dict__, scope)
            new_fn = scope[self.method]
        else:
            # compiled inside a function whose local ``__class__`` is the owner, so the
            # zero-argument super() finds its class as it does in the class body
            outer = "def _mutant_outer(__class__):\n" + textwrap.indent(code, "    ")
            outer += f"\n    return {self.method}\n"
            obj = compile(outer, f"<mutant {self.name}>", "exec", flags=flags, dont_inherit=True)
            exec(obj, module.__dict__, scope)
            new_fn = scope["_mutant_outer"](self.owner)
        return wrapper(new_fn) if wrapper is not None else new_fn

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Patch the mutant in for the duration of the block. A module-level function is
        also replaced in every loaded module that imported it by name (``from m import f``);
        modules imported inside the block get the mutant from its module."""
        new_fn = self.patched()
        orig = self.owner.__dict__[self.method]
        holders = [self.owner]
        if inspect.ismodule(self.owner):
            holders += [
                mod
                for mod in list(sys.modules.values())
                if mod is not None
                and mod is not self.owner
                and getattr(mod, "__dict__", {}).get(self.method) is orig
            ]
        for h in holders:
            setattr(h, self.method, new_fn)
        try:
            yield
        finally:
            for h in holders:
                setattr(h, self.method, orig)
