"""Progress of long steps (staging, validation, training): done/total, rate and ETA.

On a terminal the line is redrawn in place; anywhere else (an Airflow task log, a pod's
log) one line is written every ``TRAINYARD_PROGRESS_S`` seconds (default 10, ``off`` for
none), the first once the step has run that long, so short steps stay silent and long
ones show steady signs of life.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Literal, TextIO

from trainyard.errors import ConfigError

PROGRESS_ENV = "TRAINYARD_PROGRESS_S"
DEFAULT_INTERVAL_S = 10.0

Advance = Callable[[int, int], None]
"""A progress callback: ``advance(amount, items)``."""


def progress_interval() -> float:
    """Seconds between progress lines in logs (``TRAINYARD_PROGRESS_S``, default 10).

    Raises:
        ConfigError: For a value that is neither a number of seconds >= 0 nor ``off``
            (which returns infinity: no lines).
    """
    from trainyard.settings import get_settings

    raw = get_settings().progress_s
    if not raw:
        return DEFAULT_INTERVAL_S
    if raw.lower() == "off":
        return math.inf
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{PROGRESS_ENV}={raw!r}: give seconds between lines (>= 0) or off")
    return value


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def human_seconds(s: float) -> str:
    """``75`` -> ``1m15s``; ``4000`` -> ``1h06m``."""
    n = max(round(s), 0)
    if n < 60:
        return f"{n}s"
    if n < 3600:
        return f"{n // 60}m{n % 60:02d}s"
    return f"{n // 3600}h{n % 3600 // 60:02d}m"


class Progress:
    """Work done out of a total, with its rate and the time left.

    Args:
        label: What is being done (``staging tx``).
        total: Expected amount (0 if unknown: no percentage and no ETA).
        unit: ``bytes`` (shown as KB/MB/...) or a countable noun (``rows``).
        items: Name of the pieces counted next to the amount (``files``, ``batches``).
        items_total: Expected number of pieces (0 if unknown).
        stream: Where to write (stderr).
        delay_s: Stay quiet off a terminal until the step has run this long
            (default: the interval).
        interval_s: Time between lines off a terminal (default: ``TRAINYARD_PROGRESS_S``);
            a terminal is redrawn at most twice a second.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: Literal["bytes"] | str = "bytes",
        items: str = "",
        items_total: int = 0,
        stream: TextIO | None = None,
        delay_s: float | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.items = items
        self.items_total = items_total
        self.done = 0
        self.items_done = 0
        self.stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        every = progress_interval() if interval_s is None else interval_s
        self.interval_s = min(every, 0.5) if self._tty else every
        self.delay_s = every if delay_s is None else delay_s
        if self._tty:  # a rate needs some time behind it
            self.delay_s = min(self.delay_s, 0.5)
        self.start = time.monotonic()
        self._last = 0.0
        self._drawn = False
        self._width = 0

    def advance(self, amount: int, items: int = 0) -> None:
        """Count ``amount`` more (and ``items`` more pieces); write a line when one is due."""
        self.done += amount
        self.items_done += items
        now = time.monotonic()
        if now - self._last < self.interval_s or now - self.start < self.delay_s:
            return
        self._last = now
        self._draw(now)

    def _amount(self, n: float) -> str:
        return human_bytes(n) if self.unit == "bytes" else f"{int(n):,} {self.unit}"

    def line(self, now: float | None = None) -> str:
        """The progress line as it would be drawn now."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.start, 1e-6)
        rate = self.done / elapsed
        rate_text = (
            f"{human_bytes(rate)}/s" if self.unit == "bytes" else f"{rate:,.0f} {self.unit}/s"
        )
        parts = [self._amount(self.done)]
        if self.total:
            frac = min(self.done / self.total, 1.0)
            done = human_bytes(self.done) if self.unit == "bytes" else f"{self.done:,}"
            parts = [f"{done}/{self._amount(self.total)} ({frac * 100:.1f}%)"]
        if self.items:
            of = f"/{self.items_total:,}" if self.items_total else ""
            parts.append(f"{self.items_done:,}{of} {self.items}")
        parts.append(rate_text)
        if self.total and rate > 0:
            parts.append(f"ETA {human_seconds(max(self.total - self.done, 0) / rate)}")
        return f"{self.label}: {', '.join(parts)}"

    def _draw(self, now: float) -> None:
        text = self.line(now)
        if self._tty:  # pad over what a longer previous line left
            text, self._width = text.ljust(self._width), len(text)
        self.stream.write(text + ("\r" if self._tty else "\n"))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the progress line on a terminal, drawn once more as it ended (a log gets none)."""
        if self._drawn and self._tty:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
