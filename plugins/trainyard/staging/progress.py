"""A progress line with bytes/s for long staging runs, on stderr only when useful."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


class Progress:
    """Bytes done out of a total, drawn on a TTY at once and elsewhere after ``delay_s``.

    Args:
        label: What is being staged.
        total: Expected bytes (0 if unknown).
        stream: Where to draw (stderr).
        delay_s: Stay quiet on a non-TTY until the run has taken this long.
        interval_s: Minimum time between redraws.
    """

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO | None = None,
        delay_s: float = 2.0,
        interval_s: float = 0.5,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.start = time.monotonic()
        self._last = 0.0
        self._drawn = False
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` more and redraw when due."""
        self.done += nbytes
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        if not self._tty and now - self.start < self.delay_s:
            return
        self._last = now
        self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.start, 1e-6)
        rate = self.done / elapsed
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 24)
            text = (
                f"{self.label} [{bar:<24}] {frac * 100:5.1f}% {human_bytes(self.done)}"
                f"/{human_bytes(self.total)} {human_bytes(rate)}/s"
            )
        else:
            text = f"{self.label} {human_bytes(self.done)} {human_bytes(rate)}/s"
        end = "\r" if self._tty else "\n"
        self.stream.write(text + end)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the progress line (if one was drawn on a TTY)."""
        if self._drawn and self._tty:
            self.stream.write("\n")
            self.stream.flush()
