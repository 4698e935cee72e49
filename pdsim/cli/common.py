"""Helpers shared by the CLI command modules."""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from engine.errors import InputError
from engine.limits import show

err_console = Console(stderr=True, highlight=False)
console = Console(highlight=False, soft_wrap=True)


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


def note_local_processes(workers: int, scheduler: str | None) -> None:
    """Print the one line saying that runs go to local processes because Dask (the ``dist``
    extra) is missing; :class:`InputError` naming the extra for ``--scheduler`` without it
    (sim.study.sweep.daskclient.local_note). Nothing when Dask is there or nothing is parallel."""
    from sim.study.sweep.daskclient import local_note

    note = local_note(workers, scheduler)
    if note is not None:
        err_console.print(f"note: {escape(note)}", soft_wrap=True)


#: most Dask workers of one command (``--workers``)
MAX_WORKERS = 1024
#: most bootstrap resamples (``ab --resamples``)
MAX_RESAMPLES = 100_000
#: most sequences of one priced iteration (``cost --batch``)
MAX_BATCH = 65_536


class OptionError(typer.BadParameter):
    """A bad option value, shown as the CLI's one line (``error: Invalid value for '--x':
    ...``) with exit status 2 instead of the usage block."""

    def show(self, file: Any = None) -> None:
        err_console.print(f"[bold red]error:[/] {escape(self.format_message())}", soft_wrap=True)


#: the text of an integer option: an optional sign and at most 20 digits (converted without
#: Python's limit on long digit strings, and no 400-digit number is echoed back)
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,20}")


def int_option(lo: int, hi: int) -> Callable[[Any], int]:
    """The ``parser`` of an integer option: a whole number in ``[lo, hi]`` (the ranges of
    :mod:`engine.limits` or the option's own); anything else is an :class:`OptionError`
    naming the option and the range (exit 2)."""

    allowed = f"allowed: an integer >= {lo} and <= {hi}"

    def parse(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip()
            if not _INT_TEXT.fullmatch(text):
                raise OptionError(f"{show(text)} is not an integer; {allowed}")
            n = int(text)
        if not lo <= n <= hi:
            raise OptionError(f"{show(n)} is out of range; {allowed}")
        return n

    return parse


def float_option(lo: float, hi: float, open_lo: bool = False) -> Callable[[Any], float]:
    """The ``parser`` of a number option: a finite float in ``[lo, hi]`` (``lo`` excluded
    when ``open_lo``); ``inf``, ``nan`` and anything out of range are an
    :class:`OptionError` (exit 2)."""
    low = f"> {lo:g}" if open_lo else f">= {lo:g}"
    allowed = f"allowed: a finite number {low} and <= {hi:g}"

    def parse(value: Any) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            raise OptionError(f"{show(value)} is not a number; {allowed}") from None
        below = x <= lo if open_lo else x < lo
        if not math.isfinite(x) or below or x > hi:
            raise OptionError(f"{show(value)} is out of range; {allowed}")
        return x

    return parse


def out_path(value: Any) -> Path:
    """The ``parser`` of every ``--out`` option: a path, not empty (``--out ''`` would
    otherwise mean the working folder)."""
    if isinstance(value, str) and not value.strip():
        raise OptionError("an empty path; give a folder or file name")
    return Path(value)


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


def check_out_dir(path: Path, option: str = "--out") -> None:
    """Before any work: :class:`InputError` unless ``path`` is, or can become, a folder (it
    is a file, a file stands where one of its parent folders would be, or a name in it is
    longer than the file system allows)."""
    shown = str(path) if len(str(path)) <= 80 else str(path)[:77] + "..."
    if any(len(part.encode("utf-8", "surrogateescape")) > _NAME_MAX for part in path.parts):
        raise InputError(
            f"{option} {shown}: a name longer than {_NAME_MAX} bytes; give a shorter one"
        )
    for p in (path, *path.parents):
        try:
            exists = p.exists() and not p.is_dir()
        except OSError as err:  # e.g. a path the file system cannot even look up
            raise InputError(f"{option} {shown}: {err.strerror}; give another folder") from None
        if exists:
            what = "is a file" if p == path else f"is under {p}, which is a file"
            raise InputError(f"{option} {path}: {what}; give a folder")


#: the longest file or folder name most file systems take, bytes
_NAME_MAX = 255


def check_out_file(path: Path, option: str = "--out") -> None:
    """Before any work: :class:`InputError` unless a file can be written at ``path`` (it is
    not a folder and no parent of it is a file)."""
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder; give a file name (e.g. {path}/x.json)")
    check_out_dir(path.parent, option)


#: the files that mark a folder as holding results of each kind (glob patterns)
RESULT_MARKERS: dict[str, tuple[str, ...]] = {
    "run": ("summary.json",),
    "sweep": ("sweep-*.json", "sweep.json", "results.parquet"),
    "A/B": ("ab.json",),
    "plan": ("plan.json",),
    "frontier": ("frontier.json",),
    "chaos": ("chaos.json", "seeds.jsonl"),
}


def check_out_kind(folder: Path, kind: str, option: str = "--out") -> None:
    """:class:`InputError` when ``folder`` holds results of another kind than ``kind`` (a
    key of :data:`RESULT_MARKERS`): results of different kinds never share a folder."""
    if not folder.is_dir():
        return
    for other, patterns in RESULT_MARKERS.items():
        found = [] if other == kind else [p for pat in patterns for p in folder.glob(pat)]
        if found:
            raise InputError(
                f"{option} {folder}: holds {other} results ({found[0].name}); results of "
                "different kinds never share a folder: give another folder"
            )


def is_run_folder(path: Path) -> bool:
    """``path`` is a run folder written by ``pdsim run`` (it holds config + summary)."""
    return (path / "summary.json").is_file() and (path / "config.yaml").is_file()


def result_name(kind: str, name: str, digest: str) -> str:
    """``<kind>-<name>-<digest>``, without doubling the prefix (``ab-demo`` stays
    ``ab-demo-…``, not ``ab-ab-demo-…``); characters other than letters, digits, ``-`` and
    ``_`` become ``-``."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)
    if safe.startswith(f"{kind}-"):
        safe = safe[len(kind) + 1 :]
    return f"{kind}-{safe}-{digest}"


def inputs_digest(inputs: object) -> str:
    """A 12-hex-digit hash of ``inputs`` (JSON-serialisable; key order does not matter)."""
    import hashlib
    import json

    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def check_same_inputs(folder: Path, record: str, key: str, digest: str, option: str) -> None:
    """:class:`InputError` when ``folder/record`` (a JSON file a previous command wrote) holds
    the result of other inputs (its ``key`` differs from ``digest``): a different result is
    never overwritten. A missing or unreadable record is no conflict."""
    import json

    try:
        old = json.loads((folder / record).read_text("utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(old, dict) and old.get(key) not in (None, digest):
        raise InputError(
            f"{option} {folder}: holds the {record} of other inputs ({key} {old.get(key)}, "
            f"these are {digest}); give another folder or leave out {option}"
        )


def _bare(err: InputError) -> str:
    """``err``'s message without its ``source: where:`` prefix."""
    text = str(err)
    for prefix in (f"{err.source}: {err.where}: ", f"{err.source}: ", f"{err.where}: "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def blame_override(err: InputError, overrides: list[str], option: str = "--set") -> InputError:
    """``err`` (from validating a file with ``overrides`` applied) blamed on the override
    whose key is the failing field or a parent of it -- or else, for an error of a whole
    section (``rate x duration`` of ``workload``), the last override inside it -- as
    ``--set KEY=VALUE: FIELD: ...``; ``err`` itself when no override matches."""
    where = (err.where or "").replace("[", ".").replace("]", "")
    keys = [(text, text.split("=", 1)[0].strip()) for text in reversed(overrides)]
    hits = [t for t, k in keys if where == k or where.startswith(k + ".")]
    hits += [t for t, k in keys if where and k.startswith(where + ".")]
    for text in hits[:1]:
        shown = text if len(text) <= 80 else text[:77] + "..."  # a 400-digit value
        return InputError(_bare(err), source=f"{option} {shown}", where=err.where)
    return err


def load_scenario_arg(text: str | Path, overrides: list[str] | None = None) -> Any:
    """The scenario a user named (a file, or a shipped scenario's name) with ``overrides``;
    an error in the file blames the file, one an override causes blames ``--set KEY``, and an
    unknown profile names the ``profile`` field and the shipped profiles."""
    from sim.scenario import load_scenario
    from sim.serving.costmodel import load_profile
    from sim.shipped import resolve_scenario

    path = resolve_scenario(text)
    over = list(overrides or [])
    load_scenario(path)  # the file's own errors, named as such
    try:
        sc = load_scenario(path, over)
    except InputError as err:
        raise blame_override(err, over) from None
    try:
        load_profile(sc.profile)
    except InputError as err:
        src = next((f"--set {o}" for o in reversed(over) if o.startswith("profile=")), str(path))
        raise InputError(
            _bare(err).replace(" file;", ";"), source=src, where=f"profile: {sc.profile}"
        ) from None
    return sc


#: ``--workers N`` of every command that runs scenarios in parallel (plan, sweep, ab, frontier)
WorkersOption = Annotated[
    int,
    typer.Option(
        "--workers",
        parser=int_option(1, MAX_WORKERS),
        metavar="N",
        help="Parallel runs: Dask workers, or local processes without Dask (1: in-process).",
    ),
]
#: ``--scheduler ADDR`` of the same commands
SchedulerOption = Annotated[
    str | None,
    typer.Option("--scheduler", metavar="ADDR", help="Existing Dask scheduler tcp://host:port."),
]
