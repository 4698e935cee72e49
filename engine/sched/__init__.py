"""One replica's scheduler (``docs/design/replica-scheduler.md``): the batch a replica runs
next, for the engine's runtime and the simulator's replica alike."""

from engine.sched.scheduler import DEFAULT_WATERMARK, Batch, Prefill, Scheduler, SchedulerHooks

__all__ = ["DEFAULT_WATERMARK", "Batch", "Prefill", "Scheduler", "SchedulerHooks"]
