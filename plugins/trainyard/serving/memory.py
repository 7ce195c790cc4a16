"""Give the memory of a large request back to the operating system once it is answered.

A large predict request allocates large short-lived blocks (the body, arrays, tensors, the
response) and, on the ``json`` path, millions of small ones. Python frees them, but glibc
raises its mmap threshold each time it frees a large mmapped block, so later large blocks
come from the heap, where freed memory stays resident: each 50,000-row request left
40-100 MB behind, growing with request size and with the threads that touched it.
:func:`use_mmap_for_large_blocks` fixes the threshold (1 MiB), so large blocks go back to
the system as soon as they are freed, and :class:`MemoryReleaser` runs ``malloc_trim(0)``
off the event loop shortly after a large request, returning the whole free pages that the
small blocks left in every arena.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from typing import Any

log = logging.getLogger("trainyard.serving")

# Bodies from this size on are followed by a trim; below it the heap is reused as it is.
DEFAULT_RELEASE_BYTES = 4 * 1024 * 1024


# Blocks from this size on are mmapped, and unmapped when freed.
DEFAULT_MMAP_THRESHOLD = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


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


def use_mmap_for_large_blocks(threshold_bytes: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Serve blocks of ``threshold_bytes`` and more from mmap, for the whole process.

    A fixed threshold also turns off glibc's dynamic one, which would otherwise rise to the
    size of the largest block freed so far (up to 32 MiB).

    Returns:
        Whether the allocator took the setting (False where it is not glibc).
    """
    return bool(_mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) if _mallopt is not None else False


def release_memory() -> bool:
    """Return free heap memory to the operating system (``malloc_trim(0)`` on glibc).

    Returns:
        Whether glibc released any memory (False where there is no ``malloc_trim``).
    """
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
