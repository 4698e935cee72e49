"""The one way pdsim gets a Dask client, and what it says when Dask is missing.

:func:`dask_client` gives a client of an existing scheduler or of a ``LocalCluster`` it starts
and closes (quietly and at once after Ctrl-C); :func:`local_note` is the one line shown when
runs go to local processes because the optional extra ``dist`` is not installed. Every
message about a missing Dask names the extra (:data:`DIST_HINT`); none is an import traceback.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from engine.errors import InputError

#: seconds to wait for an existing Dask scheduler (``--scheduler``) to answer
CONNECT_TIMEOUT_S = 10.0

#: how to install Dask, named by every message about it missing
DIST_HINT = "pip install -e '.[dist]'"

DIST_MISSING = "runs on several workers need Dask (the 'dist' extra), which is not installed"


def dask_installed() -> bool:
    """Whether ``dask.distributed`` can be imported (the optional extra ``dist``)."""
    try:
        return importlib.util.find_spec("distributed") is not None and (
            importlib.util.find_spec("dask") is not None
        )
    except (ImportError, ValueError):  # a module set to None in sys.modules, or no spec
        return False


def local_note(workers: int, scheduler: str | None) -> str | None:
    """The one line to show when runs go to local processes because Dask is missing (or
    ``None`` when Dask runs them, or they run in-process); :class:`InputError` naming the
    ``dist`` extra for a ``scheduler`` without Dask."""
    if dask_installed() or (workers <= 1 and scheduler is None):
        return None
    if scheduler is not None:
        raise InputError(
            f"needs Dask, which is not installed: {DIST_HINT}", source=f"--scheduler {scheduler}"
        )
    return f"Dask is not installed ({DIST_HINT} adds it): running on {workers} local processes"


def _connect(address: str) -> Any:
    """A Dask client of the scheduler at ``address``; :class:`InputError` naming the address
    when it is not one (``tcp://HOST:PORT``) or nothing answers within
    :data:`CONNECT_TIMEOUT_S`."""
    from dask.distributed import Client

    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError) as err:
        raise InputError(
            f"cannot connect: {err}; allowed: the address of a running Dask scheduler, "
            "tcp://HOST:PORT",
            source=f"--scheduler {address}",
        ) from None


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile (in the main thread; elsewhere nothing changes): processes
    started now inherit it, and Python leaves an ignored SIGINT ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def dask_client(workers: int, scheduler: str | None = None) -> Iterator[Any]:
    """A Dask client for the block: of the scheduler at ``scheduler`` (:class:`InputError`
    naming it when it is not an address or does not answer within
    :data:`CONNECT_TIMEOUT_S`), else of a ``LocalCluster`` of ``workers`` single-threaded
    processes started with SIGINT ignored (Ctrl-C stops this process, which closes them,
    not each worker with a traceback of its own). Closed on the way out; when the block was
    stopped by Ctrl-C, quietly (no log of every cancelled task and lost connection) and at
    once (the local workers are terminated, not waited for).
    Without ``dask.distributed`` (the ``dist`` extra): :class:`InputError` naming the extra."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError(
            f"{DIST_MISSING}; run with --workers 1, or install it: {DIST_HINT}",
            source=f"--scheduler {scheduler}" if scheduler is not None else f"--workers {workers}",
        ) from None

    cluster: Any = None
    if scheduler is not None:
        client = _connect(scheduler)
    else:
        with sigint_ignored():
            cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",  # any free port: no clash with another cluster
                silence_logs=logging.CRITICAL,  # a failed run comes back as a record
            )
        client = Client(cluster)
    interrupted = False
    try:
        yield client
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        log = logging.getLogger("distributed")
        level = log.level
        if interrupted:
            log.setLevel(logging.CRITICAL + 1)
        try:
            client.close()
            if cluster is not None:
                if interrupted:
                    _terminate_workers(cluster)
                cluster.close()
        finally:
            log.setLevel(level)


def _terminate_workers(cluster: Any) -> None:
    """SIGTERM to each worker process of a local ``cluster`` (they ignore SIGINT): a worker
    busy in a run would otherwise hold ``cluster.close()`` for its grace period (about 4 s),
    and Ctrl-C is to stop within a second. A worker's half-written result is a temporary
    file that is never renamed into place (see :mod:`sim.study.sweep.resultcache`)."""
    for nanny in list(getattr(cluster, "workers", {}).values()):
        proc = getattr(getattr(nanny, "process", None), "process", None)
        pid = getattr(proc, "pid", None)
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
