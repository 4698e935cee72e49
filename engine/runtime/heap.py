"""The engine's host-memory regime: freed memory stays in the process.

NumPy takes every array from the C allocator. glibc's ``malloc`` serves a block above its
mmap threshold (128 KiB at start, raised as large blocks are freed) with fresh pages from
the kernel, and hands the top of its heap back to the kernel once more than its trim
threshold is free there. Either way the next array of that size pays a page fault per 4 KiB
page on first touch: kernel time, counted in the thread's CPU time. Which arrays pay
depends on what was allocated and freed before, so the same op costs up to four times as
much from one call to the next (on the 2-core VM, the paged decode attention of 8
sequences of 512 tokens took 1.1 ms or 4.5 ms alone, depending on what the probe had
allocated before it). An iteration allocates and frees its activations, attention scores
and gathered K/V many times over.

:func:`keep_freed_memory` fixes the regime as a serving engine's caching allocator does
(PyTorch keeps freed device blocks for reuse; vLLM sizes its KV pool once): a fixed mmap
threshold of :data:`MMAP_THRESHOLD` (glibc's largest on 64-bit: blocks below it come from
the heap) and a trim threshold of :data:`TRIM_THRESHOLD` (freed heap memory is kept for
reuse). After warm-up an op then touches pages it has touched before, and its cost no
longer depends on the allocation history. The engine (:meth:`engine.runtime.Engine.run`)
and the op probes (:mod:`hwbench.opprobe`) call it first, so the op tables are timed in the
regime the engine serves in. It is process-wide; on a C library without ``mallopt`` (not
glibc) it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

#: bytes: blocks below this come from the heap (glibc's maximum on 64-bit, 32 MiB)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: bytes of free memory at the top of the heap that glibc keeps instead of returning
TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # glibc <malloc.h> parameter numbers
_M_MMAP_THRESHOLD = -3

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set the process's allocator regime (module docstring) once; True when it is in
    force, False when the C library has no ``mallopt`` or refused a setting."""
    global _applied
    if _applied is None:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
        _applied = bool(
            mallopt is not None
            and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        )
    return _applied
