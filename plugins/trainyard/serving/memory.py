"""Give the memory of a large request back to the operating system once it is answered.

A large predict request allocates large short-lived blocks (the body, arrays, tensors, the
response) and, on the ``json`` path, millions of small ones. Python frees them, but glibc
keeps freed heap memory resident, and by default in one heap per thread: each 50,000-row
request left 40-100 MB behind. :func:`tune_allocator` gives the process one malloc arena
and fixed thresholds, and :class:`MemoryReleaser` runs ``malloc_trim(0)`` off the event
loop shortly after a large request, returning every free page of that arena
(``malloc_trim`` leaves the top of per-thread arenas alone).

The thresholds are where glibc's dynamic ones stop (blocks of 32 MiB and more mmapped, free
memory beyond 64 MiB at the top of the heap returned at once), so a model's intermediate
tensors are reused from the heap call after call. A low mmap threshold (1 MiB) returned
large blocks at once, but mapped, faulted in, zeroed and unmapped those tensors on every
call: a third of the server's CPU at batch 256.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from typing import Any

log = logging.getLogger("trainyard.serving")

# Bodies from this size on are followed by a trim; below it the heap is reused as it is.
DEFAULT_RELEASE_BYTES = 4 * 1024 * 1024


# Blocks from this size on are mmapped, and unmapped when freed.
DEFAULT_MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory beyond this at the top of the heap is returned at once.
DEFAULT_TRIM_THRESHOLD = 64 * 1024 * 1024
# glibc's mallopt parameter numbers
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _libc_function(name: str, argtypes: list[Any]) -> Any:
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        fn = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_malloc_trim = _libc_function("malloc_trim", [ctypes.c_size_t])
_mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])


def tune_allocator(
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD,
    trim_threshold: int = DEFAULT_TRIM_THRESHOLD,
    arenas: int = 1,
) -> bool:
    """Fix glibc's mmap and trim thresholds and its arena count, for the whole process.

    Call before the process starts other threads. Fixed thresholds turn off glibc's
    dynamic ones, which would otherwise follow the largest block freed so far.

    Args:
        mmap_threshold: Blocks of this size and more are mmapped, and unmapped when freed.
        trim_threshold: Free memory beyond this at the top of the heap goes back at once.
        arenas: Malloc arenas all threads share.

    Returns:
        Whether the allocator took the settings (False where it is not glibc).
    """
    if _mallopt is None:
        return False
    return all(
        _mallopt(param, value)
        for param, value in (
            (_M_ARENA_MAX, arenas),
            (_M_MMAP_THRESHOLD, mmap_threshold),
            (_M_TRIM_THRESHOLD, trim_threshold),
        )
    )


def release_memory() -> bool:
    """Return free heap memory to the operating system (``malloc_trim(0)`` on glibc).

    A collection first frees what a request left in reference cycles (the model's objects
    are frozen after loading, so it walks only what requests made).

    Returns:
        Whether glibc released any memory (False where there is no ``malloc_trim``).
    """
    gc.collect()
    return bool(_malloc_trim(0)) if _malloc_trim is not None else False


class MemoryReleaser:
    """Trim the heap once, shortly after one or more large requests finished.

    Args:
        threshold_bytes: Request bodies from this size on count as large.
        delay: Seconds to wait after a large request, so its response is sent and its
            objects are freed first; requests finishing meanwhile share one trim.
    """

    def __init__(self, threshold_bytes: int = DEFAULT_RELEASE_BYTES, delay: float = 0.2) -> None:
        self.threshold_bytes = threshold_bytes
        self.delay = delay
        self.trims = 0
        self._pending: asyncio.TimerHandle | None = None

    def after_request(self, body_bytes: int) -> None:
        """Note a finished request of ``body_bytes``; schedule a trim if it was large."""
        if body_bytes < self.threshold_bytes or _malloc_trim is None or self._pending:
            return
        loop = asyncio.get_running_loop()
        self._pending = loop.call_later(self.delay, self._trim, loop)

    def _trim(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending = None
        self.trims += 1
        loop.run_in_executor(None, release_memory)
