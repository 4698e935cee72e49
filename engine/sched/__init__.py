"""One replica's scheduler (``docs/design/replica-scheduler.md``): the batch a replica runs
next, for the engine's runtime and the simulator's replica alike."""

from engine.sched.batch import Batch, BatchRecord, Prefill, SchedulerHooks
from engine.sched.scheduler import DEFAULT_WATERMARK, Scheduler

__all__ = ["DEFAULT_WATERMARK", "Batch", "BatchRecord", "Prefill", "Scheduler", "SchedulerHooks"]
