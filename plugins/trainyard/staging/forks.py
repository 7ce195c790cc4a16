"""Forked workers for the per-file parts of staging (listing sizes, filling tar shards).

Per-file work on many small files is bound by system calls made from Python, so it is
spread over processes, not threads (the GIL serialises the Python side of each call).
Children are forked: they see the parent's data as it was at the fork and write their
results into shared memory (:func:`shared_array`) or return a small picklable value.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from trainyard.cpus import usable_cores
from trainyard.errors import StagingError


def usable_cpus() -> int:
    """CPUs this process may use (1 off Linux, where forking is not used), at most 8."""
    if sys.platform != "linux":
        return 1
    return min(usable_cores(), 8)


def shared_array(n: int, dtype: Any) -> Any:
    """A zeroed numpy array of ``n`` items in anonymous shared memory (seen across forks)."""
    import numpy as np

    dtype = np.dtype(dtype)
    buf = mmap.mmap(-1, max(1, n * dtype.itemsize))
    return np.frombuffer(buf, dtype, count=n)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause cyclic garbage collection while many small objects are built.

    Building a few objects per file for 100k files otherwise triggers collections that
    each walk every object alive (about a third of the listing's time). Nothing built
    there forms reference cycles.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_forked(workers: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(k)`` for every ``k < workers``: ``k = 0`` here, the others in forked children.

    Args:
        workers: Number of parts; 1 runs ``work(0)`` in this process only.
        work: The part to run; its return value must pickle.

    Returns:
        The return values, in ``k`` order.

    Raises:
        StagingError: If a child died without answering.
        BaseException: The first exception (in ``k`` order) raised by a part.
    """
    if workers <= 1:
        return [work(0)]
    # objects that exist now are never collected in the children, so their pages stay shared
    gc.freeze()
    children: list[tuple[int, int]] = []
    try:
        for k in range(1, workers):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child never returns
                os.close(rfd)
                _child(work, k, wfd)
            os.close(wfd)
            children.append((pid, rfd))
        outcomes: list[tuple[bool, Any]] = []
        try:
            outcomes.append((True, work(0)))
        except Exception as e:  # re-raised below, after the children are reaped
            outcomes.append((False, e))
        for i, (pid, rfd) in enumerate(children):
            payload = _read_all(rfd)
            os.close(rfd)
            _, status = os.waitpid(pid, 0)
            children[i] = (0, -1)
            if not payload:
                outcomes.append((False, StagingError(f"staging worker {pid} died ({status})")))
            else:
                outcomes.append(pickle.loads(payload))
    finally:
        for pid, rfd in children:
            if pid:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(rfd)
        gc.unfreeze()
    for ok, value in outcomes:
        if not ok:
            raise value
    return [value for _, value in outcomes]


def _child(work: Callable[[int], Any], k: int, wfd: int) -> None:
    code = 0
    try:
        try:
            outcome: tuple[bool, Any] = (True, work(k))
        except Exception as e:
            outcome = (False, e)
        try:
            payload = pickle.dumps(outcome)
        except Exception as e:  # an unpicklable result or exception: keep its message
            payload = pickle.dumps((False, StagingError(repr(e))))
        with os.fdopen(wfd, "wb") as out:
            out.write(payload)
    except BaseException:  # reported to the parent as a dead worker
        code = 1
    finally:
        os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
