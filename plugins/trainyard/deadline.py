"""A total deadline for a call that may never return (a neighbour that drips or stays silent)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def within(seconds: float, work: Callable[[], T], what: str) -> T:
    """``work()``'s result, or ``TimeoutError`` naming ``what`` once ``seconds`` have passed.

    The work runs in a daemon thread: a neighbour that drips its answer holds that thread
    (and whatever it holds, released when the process ends), never the caller.

    Args:
        seconds: The total deadline.
        work: The call.
        what: What is waited for, as the error names it.

    Raises:
        TimeoutError: ``work`` did not return within ``seconds``.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=run, name=f"deadline: {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within {seconds:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
