"""Run the points of a sweep: in-process, on a Dask ``LocalCluster``, or on a scheduler.

* ``workers=1`` and no scheduler: runs one after another in this process.
* ``workers=N > 1`` (or ``force_dask``): a ``dask.distributed.LocalCluster`` of N worker
  *processes* with one thread each (a run is pure Python and holds the GIL).
* ``scheduler="tcp://host:port"``: an existing Dask cluster (workers must have pdsim
  installed; they need not share a filesystem -- only this process reads and writes the cache).
* Dask not installed (it is the optional extra ``dist``): ``workers=N > 1`` runs on N local
  processes (``concurrent.futures``) instead; a ``scheduler`` is an :class:`InputError`
  naming the extra (:data:`sim.study.sweep.daskclient.DIST_HINT`), never an import traceback.

Runs already in the :class:`~sim.study.sweep.resultcache.RunCache` are not run again; every run is stored
the moment it finishes, so an interrupted sweep loses at most the runs in flight. A failing run
becomes a ``failed`` record naming its config and the error; the other runs go on. At most
``max_runs`` new runs are started (a resumable partial sweep). Points with the same config
hash are run once. The results frame has one row per point that has a record, ordered by point.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.study.sweep.daskclient import dask_client, dask_installed, local_note, sigint_ignored
from sim.study.sweep.flatten import flatten
from sim.study.sweep.resultcache import RunCache, as_umask, write_atomic
from sim.study.sweep.spec import Point

#: ``progress(done, total)``: runs finished (cached ones included) out of unique runs
Progress = Callable[[int, int], None]

# Worker-side memo of the model catalogue and hardware profile (read once per process).
_RESOURCES: dict[tuple[str | None, str], tuple[Any, Any]] = {}


def cached_resources(catalogue: str | None, profile: str) -> tuple[Any, Any]:
    """The model catalogue and hardware profile named, read once per process."""
    from sim.serving.costmodel import load_profile
    from sim.serving.models import load_catalogue

    key = (catalogue, profile)
    if key not in _RESOURCES:
        _RESOURCES[key] = (load_catalogue(catalogue), load_profile(profile))
    return _RESOURCES[key]


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Run one point; return its record. Never raises for a failing run (status "failed").

    ``task``: ``scenario`` (a validated Scenario), ``seed``, ``config_hash``, ``params`` and
    optionally ``counter`` (a file that gets one line per run actually executed -- an audit
    of how many runs a sweep really did, used by the resume test).
    """
    from sim.runner import run_scenario

    sc = task["scenario"]
    rec: dict[str, Any] = {
        "config_hash": task["config_hash"],
        "seed": task["seed"],
        "params": task["params"],
    }
    t0 = time.perf_counter()
    try:
        cat, prof = cached_resources(sc.catalogue, sc.profile)
        result = run_scenario(sc, task["seed"], catalogue=cat, profile=prof)
        rec.update(status="ok", error=None, metrics=flatten(result.summary))
    except Exception as err:  # a failing run is reported, never lost or fatal
        tb = traceback.format_exception_only(type(err), err)[-1].strip()
        rec.update(status="failed", error=tb, metrics={})
    rec["wall_s"] = time.perf_counter() - t0
    counter = task.get("counter")
    if counter:
        with open(counter, "a", encoding="utf-8") as f:
            f.write(task["config_hash"] + "\n")
    return rec


@dataclass
class Batch:
    """What :meth:`Runner.run` did: ``records`` by config hash (cached and new)."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    ran: int = 0
    cached: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


#: the start of the error when Dask is needed but the ``dist`` extra is not installed


class Runner:
    """Where runs execute; a context manager that owns any Dask cluster it starts.

    Nothing starts in the constructor; ``__enter__`` starts the ``LocalCluster`` (or connects
    to ``scheduler``) and ``__exit__`` closes what it started.
    """

    def __init__(
        self,
        workers: int = 1,
        scheduler: str | None = None,
        counter: str | Path | None = None,
        force_dask: bool = False,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.scheduler = scheduler
        self.counter = str(counter) if counter is not None else None
        wants_dask = scheduler is not None or workers > 1 or force_dask
        self.uses_dask = wants_dask and (dask_installed() or scheduler is not None)
        #: runs go to ``workers`` local processes (Dask missing, ``workers > 1``)
        self.local_processes = wants_dask and not self.uses_dask and workers > 1
        self._client: Any = None
        self._pool: Any = None
        self._stack: contextlib.ExitStack | None = None

    @property
    def parallel(self) -> bool:
        """Whether runs of one batch execute at the same time (Dask or local processes)."""
        return self.uses_dask or self.local_processes

    def __enter__(self) -> Runner:
        if self.uses_dask and self.scheduler is not None and not dask_installed():
            local_note(self.workers, self.scheduler)  # raises: names the extra
        if self.local_processes:
            from concurrent.futures import ProcessPoolExecutor

            self._stack = contextlib.ExitStack()
            with sigint_ignored():
                self._pool = ProcessPoolExecutor(self.workers)
            self._stack.callback(self._pool.shutdown, cancel_futures=True)
        if self.uses_dask:
            self._stack = contextlib.ExitStack()
            try:
                self._client = self._stack.enter_context(dask_client(self.workers, self.scheduler))
            except BaseException:
                self._stack.close()
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack, self._client, self._pool = self._stack, None, None, None
        if stack is not None:
            stack.__exit__(*exc)

    @property
    def n_workers(self) -> int:
        """Workers runs are spread over (1 in-process)."""
        if self._pool is not None:
            return self.workers
        if self._client is None:
            return 1
        return max(1, len(self._client.scheduler_info().get("workers", {})))

    def _task(self, p: Point) -> dict[str, Any]:
        return {
            "scenario": p.scenario,
            "seed": p.seed,
            "config_hash": p.config_hash,
            "params": p.params,
            "counter": self.counter,
        }

    def _iter_results(self, tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if self._pool is not None:
            yield from self._iter_local(tasks)
            return
        if self._client is None:
            for t in tasks:
                yield run_point(t)
            return
        from dask.distributed import as_completed

        # Keep a bounded window in flight: memory stays flat for huge sweeps, and a stop
        # (max_runs, Ctrl-C) wastes at most the window.
        window = 2 * self.n_workers + 2
        pending = iter(tasks)
        by_key: dict[str, dict[str, Any]] = {}
        ac = as_completed()
        for t in pending:
            fut = self._client.submit(run_point, t, pure=False)
            by_key[fut.key] = t
            ac.add(fut)
            if len(by_key) >= window:
                break
        for fut in ac:
            t = by_key.pop(fut.key)
            try:
                rec = fut.result()
            except Exception as err:  # the worker died (not the run): report this run
                rec = _lost(t, err)
            fut.release()
            nxt = next(pending, None)
            if nxt is not None:
                f2 = self._client.submit(run_point, nxt, pure=False)
                by_key[f2.key] = nxt
                ac.add(f2)
            yield rec

    def _iter_local(self, tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Results of ``tasks`` from the local process pool, as they finish (a bounded
        window in flight, like Dask's); a run whose process died is a ``failed`` record."""
        from concurrent.futures import FIRST_COMPLETED, wait

        window = 2 * self.workers + 2
        pending = iter(tasks)
        by_fut: dict[Any, dict[str, Any]] = {}
        for t in pending:
            by_fut[self._pool.submit(run_point, t)] = t
            if len(by_fut) >= window:
                break
        while by_fut:
            done, _ = wait(list(by_fut), return_when=FIRST_COMPLETED)
            for fut in done:
                t = by_fut.pop(fut)
                try:
                    rec = fut.result()
                except Exception as err:  # the process died (not the run): report this run
                    rec = _lost(t, err)
                nxt = next(pending, None)
                if nxt is not None:
                    by_fut[self._pool.submit(run_point, nxt)] = nxt
                yield rec

    def run(
        self,
        points: list[Point],
        cache: RunCache,
        max_runs: int | None = None,
        progress: Progress | None = None,
    ) -> Batch:
        """Run every point not in ``cache`` (at most ``max_runs`` new ones); store each."""
        batch = Batch()
        unique: dict[str, Point] = {}
        for p in points:
            unique.setdefault(p.config_hash, p)
        todo: list[Point] = []
        for h, p in unique.items():
            rec = cache.get(h)
            if rec is not None:
                batch.records[h] = rec
                batch.cached += 1
            else:
                todo.append(p)
        if max_runs is not None:
            batch.missing = [p.config_hash for p in todo[max_runs:]]
            todo = todo[:max_runs]
        total = len(unique)
        done = batch.cached
        if progress is not None:
            progress(done, total)
        for rec in self._iter_results([self._task(p) for p in todo]):
            cache.put(rec)
            batch.records[rec["config_hash"]] = rec
            batch.ran += 1
            if rec["status"] != "ok":
                batch.failed.append(rec)
            done += 1
            if progress is not None:
                progress(done, total)
        return batch


def _lost(t: dict[str, Any], err: BaseException) -> dict[str, Any]:
    """The ``failed`` record of task ``t`` whose worker died with ``err``."""
    return {
        "config_hash": t["config_hash"],
        "seed": t["seed"],
        "params": t["params"],
        "status": "failed",
        "error": f"worker lost: {type(err).__name__}: {err}",
        "metrics": {},
        "wall_s": None,
    }


def _column(values: list[Any]) -> list[Any]:
    """One parquet-friendly column: numbers/bools/str kept, anything mixed as JSON text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, float} or kinds <= {str} or kinds <= {bool}:
        return values
    return [None if v is None else json.dumps(v, sort_keys=True) for v in values]


def results_frame(points: list[Point], records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per point with a record: ``point``, swept keys, ``seed``, ``config_hash``,
    ``status``, ``error``, ``wall_s``, then the flattened metrics (first-seen order)."""
    rows = [(p, records[p.config_hash]) for p in points if p.config_hash in records]
    keys: list[str] = []
    for p, _ in rows:
        keys += [k for k in p.params if k not in keys]
    metric_cols: list[str] = []
    seen: set[str] = set()
    for _, r in rows:
        for k in r.get("metrics", {}):
            if k not in seen:
                seen.add(k)
                metric_cols.append(k)
    data: dict[str, list[Any]] = {"point": [p.index for p, _ in rows]}
    for k in keys:
        data[k] = _column([p.params.get(k) for p, _ in rows])
    data["seed"] = [p.seed for p, _ in rows]
    data["config_hash"] = [p.config_hash for p, _ in rows]
    data["status"] = [r["status"] for _, r in rows]
    data["error"] = [r.get("error") for _, r in rows]
    data["wall_s"] = [r.get("wall_s") for _, r in rows]
    for m in metric_cols:
        if m in data:  # a metric named like a swept key or bookkeeping column
            continue
        data[m] = _column([r.get("metrics", {}).get(m) for _, r in rows])
    return pd.DataFrame(data)


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """``df`` to ``path`` atomically (temporary sibling, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.close(fd)
    try:
        as_umask(tmp)
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class SweepOutcome:
    """A finished (or stopped) sweep: the frame, where it was saved, and the counts."""

    frame: pd.DataFrame
    parquet: Path
    #: names this sweep's files in its folder (``results-TAG.parquet``, ``sweep-TAG.json``)
    tag: str
    total: int
    ran: int
    cached: int
    failed: list[dict[str, Any]]
    missing: int

    @property
    def complete(self) -> bool:
        """Every point has a finished (ok) record."""
        return self.missing == 0 and not self.failed


def sweep_tag(points: list[Point]) -> str:
    """Eight hex digits naming a sweep by its points (their params, seeds and configs, in
    order): the same grid and seeds give the same tag, another grid another."""
    import hashlib

    text = json.dumps([[p.params, p.seed, p.config_hash] for p in points], default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def execute(
    points: list[Point],
    folder: str | Path,
    *,
    workers: int = 1,
    scheduler: str | None = None,
    max_runs: int | None = None,
    progress: Progress | None = None,
    counter: str | Path | None = None,
    force_dask: bool = False,
) -> SweepOutcome:
    """Run a sweep into ``folder``: cache under ``runs/`` (shared by every sweep of the
    folder), the point list as ``sweep-TAG.json`` and every point with a record as
    ``results-TAG.parquet`` (rewritten atomically each time), ``TAG`` a hash of the point list
    (:func:`sweep_tag`): a sweep of another grid or other seeds in the same folder reuses
    the cached runs but never replaces another sweep's results."""
    root = Path(folder)
    manifest = [
        {"point": p.index, "params": p.params, "seed": p.seed, "config_hash": p.config_hash}
        for p in points
    ]
    tag = sweep_tag(points)
    cache = RunCache(root)
    with Runner(workers, scheduler, counter, force_dask) as runner:  # connects first
        write_atomic(root / f"sweep-{tag}.json", json.dumps(manifest, indent=1) + "\n")
        batch = runner.run(points, cache, max_runs, progress)
    df = results_frame(points, batch.records)
    out = root / f"results-{tag}.parquet"
    write_parquet(df, out)
    return SweepOutcome(
        frame=df,
        parquet=out,
        tag=tag,
        total=len({p.config_hash for p in points}),
        ran=batch.ran,
        cached=batch.cached,
        failed=batch.failed,
        missing=len(batch.missing),
    )
