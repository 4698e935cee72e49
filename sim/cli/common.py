"""Helpers shared by the CLI command modules."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType

import typer
from rich.console import Console
from rich.markup import escape

from engine.errors import InputError

err_console = Console(stderr=True, highlight=False)
console = Console(highlight=False)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn bad user input into one clear message and exit status 2."""
    try:
        yield
    except InputError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)
        raise typer.Exit(code=2) from None
    except FileNotFoundError as err:
        err_console.print(
            f"[bold red]error:[/] no such file: {escape(str(err.filename))}", soft_wrap=True
        )
        raise typer.Exit(code=2) from None


def is_tty() -> bool:
    return sys.stderr.isatty()


#: ``--backend`` values of the engine-facing commands and the array module each selects
BACKENDS: dict[str, str] = {"cpu": "numpy", "gpu": "cupy"}


def array_backend(backend: str) -> ModuleType:
    """The array module for ``--backend`` ``backend`` (``cpu``: NumPy, ``gpu``: CuPy);
    :class:`InputError` naming the allowed values, or saying why CuPy cannot be used."""
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r} not allowed; allowed: {', '.join(BACKENDS)}")
    from engine.backend import BackendUnavailable, get_backend

    try:
        return get_backend(BACKENDS[backend])
    except BackendUnavailable as err:
        raise InputError(f"--backend {backend}: {err}") from None
