"""``pdsim cache ...``: cache-policy tools (trace replay, miss-ratio curves).

``pdsim cache replay [TRACE]`` reads a trace (CSV, oracleGeneral binary or Mooncake JSONL),
replays it through every chosen eviction policy at every chosen cache size
(:func:`engine.missratio.replay`), prints a table of request and byte miss ratios and writes
``replay.csv``, ``mrc.png`` (miss-ratio curves) and ``inputs.json`` into one output folder.
Outputs are written to a temporary folder next to the destination and moved into place only
after the replay finished, so bad input never leaves a half-written folder behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from engine.configfile import load_yaml
from engine.errors import InputError
from engine.limits import MAX_INT, MAX_TOKENS, check_number, show
from engine.missratio import CLOCKS, replay
from engine.policy import policy_class, policy_names
from engine.traces import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_KV_BYTES_PER_TOKEN,
    Trace,
    example_trace,
    read_trace,
)
from engine.units import format_bytes, parse_size
from pdsim.cli.common import console, err_console, int_option, out_path, user_errors
from sim.study.sweep.resultcache import as_umask

app = typer.Typer(
    rich_markup_mode=None,
    help="Cache-policy tools: trace replay and miss-ratio curves.",
    no_args_is_help=True,
)

#: default cache sizes, as fractions of the trace's unique bytes
DEFAULT_SIZES = "1%,2%,5%,10%,20%,50%"
#: show a progress bar when the replay does at least this many accesses in all
PROGRESS_MIN_WORK = 500_000
OUTPUTS = ("replay.csv", "mrc.png", "inputs.json")


@app.command("replay")
def replay_cmd(
    trace_path: Annotated[
        Path | None,
        typer.Argument(
            metavar="TRACE",
            help="Trace file. Default: the Mooncake slice shipped with pdsim "
            "(engine/data/traces/mooncake_slice.jsonl).",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="Trace format: auto (by extension, then content), csv (time,key,size[,color]), "
            "oracle (libCacheSim oracleGeneral binary), mooncake (JSONL with hash_ids).",
        ),
    ] = "auto",
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            "-p",
            help="Comma-separated eviction policies. Default: every registered policy except "
            "'none' (including the offline optimum 'opt' when registered).",
            show_default=False,
        ),
    ] = None,
    sizes: Annotated[
        str,
        typer.Option(
            "--sizes",
            "-s",
            help="Comma-separated cache sizes: absolute (4096, 64MiB, 1.5GB), percent of the "
            "trace's unique bytes (5%), or a fraction of them between 0 and 1 (0.05).",
        ),
    ] = DEFAULT_SIZES,
    block_tokens: Annotated[
        int,
        typer.Option(
            "--block-tokens",
            parser=int_option(1, MAX_TOKENS),
            metavar="N",
            help="Mooncake only: tokens per KV block (one hash id = one block).",
        ),
    ] = DEFAULT_BLOCK_TOKENS,
    kv_bytes_per_token: Annotated[
        str,
        typer.Option(
            "--kv-bytes-per-token",
            help="Mooncake only: KV-cache bytes per token (a size, e.g. 524288 or 512KiB). "
            "Default: LLaMA-2-7B fp16 = 2*32 layers*32 KV heads*128 dims*2 B.",
        ),
    ] = str(DEFAULT_KV_BYTES_PER_TOKEN),
    unit_sizes: Annotated[
        bool,
        typer.Option(
            "--unit-sizes",
            help="Give every access size 1, in every format: cache sizes then count objects "
            "(for Mooncake, KV blocks).",
        ),
    ] = False,
    clock: Annotated[
        str,
        typer.Option(
            "--clock",
            help="The policies' clock: 'time' (the trace's timestamps, in seconds) or "
            "'references' (the access's position in the trace, as in the LRU-K paper). "
            "Time-based parameters are in the clock's units: --param lru-k.crp / lru-k.rip "
            "and the priority policy's staleness are seconds with 'time', references with "
            "'references'.",
        ),
    ] = "time",
    precision: Annotated[
        int,
        typer.Option(
            "--precision",
            parser=int_option(0, 17),
            metavar="N",
            help="Decimals of the ratios in the printed tables (0-17).",
        ),
    ] = 6,
    params: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="Policy parameter POLICY.NAME=VALUE (repeatable), e.g. --param lru-k.k=3.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            parser=out_path,
            help="Output folder for replay.csv, mrc.png and inputs.json. Default: "
            "runs/cache-replay-<hash of the trace content and these options>.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "-n",
            parser=int_option(1, MAX_INT),
            metavar="N",
            help="Replay only the first N accesses.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No progress bar or table; print only the output folder."
        ),
    ] = False,
) -> None:
    """Replay a cache trace through eviction policies; write a miss-ratio table and curves."""
    with user_errors():
        default_trace = trace_path is None
        path = example_trace() if trace_path is None else trace_path
        names = _policies(policy)
        if clock not in CLOCKS:
            raise InputError(f"--clock: {clock!r} is not a clock; allowed: {', '.join(CLOCKS)}")
        kv_bytes = _size_option("--kv-bytes-per-token", kv_bytes_per_token)
        pparams = _params(params or [])
        trace = read_trace(
            path,
            fmt,
            block_tokens=block_tokens,
            kv_bytes_per_token=kv_bytes,
            unit=unit_sizes,
            limit=limit,
        )
        unique = trace.unique_bytes()
        cache_sizes = parse_cache_sizes(sizes, unique)
        trace_format = str(trace.meta.get("format", fmt))
        unit = "objects" if unit_sizes else "B"
        if not quiet:
            what = "shipped example trace" if default_trace else "trace"
            console.print(f"{what}: {path}")
            console.print(
                f"  {trace_format}, {len(trace):,} accesses, {trace.n_objects:,} objects, "
                + ("unit sizes" if unit_sizes else f"{unique:,} B unique")
            )
            console.print(
                f"  cache sizes ({unit}): {', '.join(f'{c:,}' for c in cache_sizes)}; "
                f"clock: {clock}"
            )
        inputs: dict[str, Any] = {
            "trace": str(path),
            "trace_blake2b": _file_digest(path),
            "format": trace_format,
            "policies": names,
            "cache_bytes": cache_sizes,
            "unit_sizes": unit_sizes,
            "clock": clock,
            "params": pparams,
            "limit": limit,
        }
        if trace_format == "mooncake":
            inputs["block_tokens"] = block_tokens
            inputs["kv_bytes_per_token"] = kv_bytes
        dest = out if out is not None else Path("runs") / f"cache-replay-{_short_hash(inputs)}"
        with _progress(len(trace) * len(names) * len(cache_sizes), quiet) as advance:
            df = replay(
                trace, names, cache_sizes, policy_params=pparams, progress=advance, clock=clock
            )
        df.insert(2, "cache_fraction", df["cache_bytes"] / unique if unique else float("nan"))
        if not quiet:  # the counts are in replay.csv either way
            _warn_too_large(df, unit)
        _write_outputs(dest, df, inputs, trace)
        if quiet:
            console.print(str(dest))
            return
        for table in _tables(df, unique, unit_sizes, precision):
            console.print(table)
        console.print(f"wrote {dest / 'replay.csv'} and {dest / 'mrc.png'}")


def parse_cache_sizes(spec: str, unique_bytes: int) -> list[int]:
    """Resolve ``--sizes`` to sorted, distinct byte counts (each >= 1).

    ``N%`` is N percent of ``unique_bytes``; a plain number strictly between 0 and 1 is a
    fraction of it; anything else is an absolute size (:func:`engine.units.parse_size`).
    Percents and fractions are truncated to whole bytes, as libCacheSim does, computed
    exactly from the decimal text (``1%`` of 48,974 is 489).
    """
    out: set[int] = set()
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            if item.endswith("%"):
                pct = Fraction(item[:-1].strip())
                if pct <= 0:
                    raise ValueError
                out.add(max(1, math.floor(unique_bytes * pct / 100)))
                continue
            with contextlib.suppress(ValueError, ZeroDivisionError):
                frac = Fraction(item)
                if 0 < frac < 1:
                    out.add(max(1, math.floor(unique_bytes * frac)))
                    continue
            nbytes = parse_size(item)
        except ValueError:
            raise InputError(
                f"--sizes: {item!r} is not a cache size; use bytes (4096, 64MiB), a percent of "
                "the unique bytes (5%) or a fraction between 0 and 1 (0.05)"
            ) from None
        if nbytes < 1:
            raise InputError(f"--sizes: {item!r} is not >= 1 byte")
        out.add(nbytes)
    if not out:
        raise InputError("--sizes: no cache size given")
    return sorted(out)


def _policies(spec: str | None) -> list[str]:
    if spec is None:
        return [n for n in policy_names() if n != "none"]
    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise InputError(f"--policy: no policy given; allowed: {', '.join(policy_names())}")
    for n in names:
        policy_class(n)  # InputError listing the allowed names
    if len(set(names)) != len(names):
        raise InputError(f"--policy: a policy is listed twice in {spec!r}")
    return names


def _params(items: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        head, eq, value = item.partition("=")
        name, dot, key = head.partition(".")
        if not eq or not dot or not name.strip() or not key.strip():
            raise InputError(f"--param {item!r}: expected POLICY.NAME=VALUE, e.g. lru-k.k=3")
        try:
            parsed = load_yaml(value)
        except yaml.YAMLError:
            parsed = value
        why = check_number(parsed)
        if why is not None:
            raise InputError(f"--param {show(item)}: {why}")
        out.setdefault(name.strip(), {})[key.strip()] = parsed
    return out


def _size_option(option: str, value: str) -> int:
    try:
        n = parse_size(value)
    except ValueError as err:
        raise InputError(f"{option}: {err}") from None
    if n < 1:
        raise InputError(f"{option}: {value!r} is not >= 1 byte")
    return n


def _file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _short_hash(inputs: dict[str, Any]) -> str:
    blob = json.dumps({k: v for k, v in inputs.items() if k != "trace"}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=5).hexdigest()


@contextlib.contextmanager
def _progress(total: int, quiet: bool) -> Iterator[Any]:
    """Yield a ``progress(n)`` callback: a rich bar on long replays, else a no-op (None)."""
    if quiet or total < PROGRESS_MIN_WORK:
        yield None
        return
    bar = Progress(
        TextColumn("replaying accesses"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    with bar:
        task = bar.add_task("replay", total=total)
        yield lambda n: bar.advance(task, n)


def _warn_too_large(df: pd.DataFrame, unit: str) -> None:
    """One warning per cache size that some objects can never fit in."""
    seen: set[int] = set()
    for row in df.itertuples(index=False):
        size = int(row.cache_bytes)
        if row.too_large_objects and size not in seen:
            seen.add(size)
            err_console.print(
                f"warning: cache of {size:,} {unit}: {int(row.too_large_objects):,} objects "
                f"({int(row.too_large_accesses):,} accesses) are larger than the whole cache; "
                "they are never cached and count as misses"
            )


def _tables(df: pd.DataFrame, unique: int, unit_sizes: bool, precision: int) -> list[Table]:
    """Policy x size tables: miss ratio (objects), byte miss ratio, hit ratio (objects).

    The byte table is left out when it equals the object one (unit sizes, or equal ratios).
    """
    same = unit_sizes or bool((df["miss_ratio"] - df["byte_miss_ratio"]).abs().max() == 0)
    metrics = [("miss_ratio", "miss ratio" + (" (= byte miss ratio)" if same else " (objects)"))]
    if not same:
        metrics.append(("byte_miss_ratio", "byte miss ratio"))
    metrics.append(("hit_ratio", "hit ratio (objects)"))
    sizes = sorted(df["cache_bytes"].unique().tolist())
    tables = []
    for col, title in metrics:
        table = Table(title=title, title_justify="left")
        table.add_column("policy", no_wrap=True)
        for s in sizes:
            label = f"{s:,}" if unit_sizes else format_bytes(s).replace(" ", "")
            if unique:
                label = f"{100.0 * s / unique:.3g}%\n{label}"
            table.add_column(label, justify="right", no_wrap=True)
        for name, group in df.groupby("policy", sort=False):
            by_size = group.set_index("cache_bytes")[col]
            table.add_row(str(name), *(f"{by_size.at[s]:.{precision}f}" for s in sizes))
        tables.append(table)
    return tables


def _write_outputs(dest: Path, df: pd.DataFrame, inputs: dict[str, Any], trace: Trace) -> None:
    """Write every output into a temporary sibling folder, then move it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        as_umask(tmp, folder=True)
        df.to_csv(tmp / "replay.csv", index=False)
        _plot(df, tmp / "mrc.png", trace)
        (tmp / "inputs.json").write_text(json.dumps(inputs, indent=2, sort_keys=True) + "\n")
        if not dest.exists():
            os.rename(tmp, dest)
            return
        if not dest.is_dir():
            raise InputError(f"--out {dest}: exists and is not a folder")
        for name in OUTPUTS:
            os.replace(tmp / name, dest / name)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _plot(df: pd.DataFrame, path: Path, trace: Trace) -> None:
    """Miss-ratio curves: one panel, or two when byte and request miss ratios differ. The
    y axis spans the data (padded), not 0-1, so curves near 0.99 stay apart; the title says
    so when it does not start at 0."""
    from matplotlib.ticker import PercentFormatter

    from sim.study.plots import figure_with_axes

    top = float(df["cache_bytes"].max())
    unit, scale = "B", 1.0
    if trace.meta.get("unit"):
        unit = "objects"
    else:
        for u, f in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)):
            if top >= f:
                unit, scale = u, float(f)
    same = bool((df["miss_ratio"] - df["byte_miss_ratio"]).abs().max() < 1e-12)
    panels = [("miss_ratio", "miss ratio" + (" (= byte miss ratio)" if same else ""))]
    if not same:
        panels.append(("byte_miss_ratio", "byte miss ratio"))
    fig, axes = figure_with_axes(
        1, len(panels), figsize=(5.8 * len(panels), 4.4), constrained_layout=True, squeeze=False
    )
    zoomed = False
    for ax, (col, label) in zip(axes[0], panels, strict=True):
        for i, (name, group) in enumerate(df.groupby("policy", sort=False)):
            g = group.sort_values("cache_bytes")
            ax.plot(
                g["cache_bytes"] / scale,
                g[col] * 100,
                marker="os^vDx+*"[i % 8],
                linestyle=("-", "--", ":", "-.")[i % 4],
                ms=4,
                label=str(name),
            )
        lo = float(df["cache_bytes"].min())
        if lo > 0 and top / lo >= 10:
            ax.set_xscale("log")
        ymin, ymax = float(df[col].min()) * 100, float(df[col].max()) * 100
        pad = max((ymax - ymin) * 0.08, 0.5)
        bottom = 0.0 if ymin - pad <= 5 else ymin - pad
        zoomed = zoomed or bottom > 0
        ax.set_ylim(bottom, min(ymax + pad, 100.0) if ymax + pad > bottom else 100.0)
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=None))
        ax.set_xlabel(f"cache size ({unit})")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize="small")
    note = "\n(y axis zoomed to the data; it does not start at 0)" if zoomed else ""
    fig.suptitle(f"miss-ratio curves: {Path(trace.source).name} ({len(trace):,} accesses){note}")
    fig.savefig(path, dpi=110)
