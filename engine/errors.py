"""Errors shared by every pdsim package.

`InputError` is the one exception type for bad user input (a scenario with a typo, a corrupt
trace, a missing file, an impossible configuration). Its message names the file, the field or
record and what is allowed; the CLI prints it and exits with status 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. ``str(err)`` is the complete message shown to the user.

    ``source`` is the file (or other origin) the input came from, ``where`` the field path,
    line number or byte offset inside it; both are optional and already part of the message.
    """

    def __init__(self, message: str, *, source: str | None = None, where: str | None = None):
        prefix = ""
        if source and where:
            prefix = f"{source}: {where}: "
        elif source:
            prefix = f"{source}: "
        elif where:
            prefix = f"{where}: "
        super().__init__(prefix + message)
        self.source = source
        self.where = where


class ObjectTooLargeError(ValueError):
    """An object larger than a cache's whole capacity was offered to it."""


class KVOutOfBlocks(RuntimeError):
    """No free, growable or evictable KV block for a request; the allocator
    (:class:`engine.kv.allocator.KVBlockAllocator`, which re-exports it) is unchanged."""

    def __init__(self, message: str, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class SimulationStalled(RuntimeError):
    """Simulated time stopped advancing: a whole slice of events (``stall_events`` of
    :meth:`sim.simenv.CountingEnvironment.run`) moved the clock by less than
    :data:`engine.limits.MIN_INTERVAL`. The message says when and
    which process kept scheduling events there."""
