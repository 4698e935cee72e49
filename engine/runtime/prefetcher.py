"""Background prefetch: the shared :class:`engine.prefetch.PrefetchPlanner` on a worker thread.

At the start of every layer the scheduler calls :meth:`Prefetcher.plan_from` with the layer it
is about to compute. The planner (the same object the simulator's policy code uses) orders the
chunks of the next ``window`` layers (wrapping into the next iteration, like the simulator's
node) that are neither resident in device memory nor already queued; the worker thread fetches
them through :class:`engine.runtime.weights.TieredWeights` while the compute thread works on
the current layer (R7, R21). On a GPU the worker copies on its own CUDA stream.

Invariant: a key is in ``_queued`` from the moment it is planned until the worker has brought
it in (or found it resident), so it is never planned twice while pending.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, cast

from engine import backend
from engine.prefetch import HeatMap, PrefetchPlanner
from engine.runtime.clock import thread_cpu_wait
from engine.runtime.weights import TieredWeights

__all__ = ["Prefetcher"]


class Prefetcher:
    """Plans and runs layer prefetches; ``start()`` before use, ``stop()`` after."""

    def __init__(
        self, weights: TieredWeights, window: int, clock: Any, *, half_life: float = 10.0
    ) -> None:
        """``half_life``: the heat map's, seconds (the scenario's ``prefetch.heat_half_life``,
        passed on by :class:`~engine.runtime.Engine`)."""
        self.weights = weights
        self.window = window
        self.clock = clock
        self.planner = PrefetchPlanner(max(window, 1), HeatMap(half_life=half_life))
        self._q: queue.Queue[list[int] | None] = queue.Queue()
        self._queued: set[tuple[str, int]] = set()  # membership only; never iterated
        self._qlock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.planned_chunks = 0
        #: per job: (service seconds: from planned -- or from the previous job's end if it
        #: queued behind one -- to landed, less the worker's CPU waits; bytes it moved, i.e.
        #: less its chunks that were resident by then)
        self.job_log: list[tuple[float, int]] = []
        self._last_done = 0.0
        self._enqueued: deque[float] = deque()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="prefetcher", daemon=True)
        self._thread.start()

    def cpu_wait(self) -> float:
        """Seconds the worker thread has waited for a CPU so far (0.0 if unknown)."""
        t = self._thread
        return thread_cpu_wait(t.native_id) if t is not None and t.native_id else 0.0

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise self.error

    def plan_from(self, layer: int) -> None:
        """Queue the missing chunks of layers ``layer+1 .. layer+window`` (mod n_layers)."""
        if self.window <= 0:
            return
        w = self.weights
        n = w.n_layers
        upcoming = [w.keys((layer + d) % n) for d in range(1, self.window + 1)]
        now = self.clock()
        with w.lock, self._qlock:
            self.planner.heat.record(w.keys(layer), now)
            plan = self.planner.plan(upcoming, w.device, self._queued, now)
            keys = [cast(tuple[str, int], key) for _, key in plan]
            self._queued.update(keys)
        if keys:
            self.planned_chunks += len(keys)
            self._enqueued.append(time.perf_counter())
            self._q.put([int(key[1]) for key in keys])

    def busy(self) -> bool:
        """Whether some queued fetch has not finished yet."""
        return self._q.unfinished_tasks > 0

    def wait_idle(self) -> None:
        """Block until every queued fetch is done."""
        self._q.join()

    def _work(self) -> None:
        xp = self.weights.xp
        stream = xp.cuda.Stream(non_blocking=True) if backend.is_gpu(xp) else None
        while True:
            job = self._q.get()
            try:
                if job is None:
                    return
                t_enq = max(self._enqueued.popleft(), self._last_done)
                w0 = thread_cpu_wait(threading.get_native_id())
                nbytes = 0
                if self.error is None:
                    try:
                        if stream is not None:
                            with stream:
                                nbytes = self.weights.fetch(job, self.clock())
                            stream.synchronize()
                        else:
                            nbytes = self.weights.fetch(job, self.clock())
                    except BaseException as err:  # surfaced by stop(); the run then fails
                        self.error = err
                    finally:
                        with self._qlock:
                            for cid in job:
                                self._queued.discard(self.weights.store.key(cid))
                    waited = thread_cpu_wait(threading.get_native_id()) - w0
                    self._last_done = time.perf_counter()
                    self.job_log.append((self._last_done - t_enq - waited, nbytes))
            finally:
                self._q.task_done()
