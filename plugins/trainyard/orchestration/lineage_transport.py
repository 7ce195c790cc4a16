"""OpenLineage over HTTP with a total deadline: a slow lineage endpoint costs a run seconds.

The client's ``http`` transport gives each socket read ``timeout`` seconds and retries, so
an endpoint that answers a byte at a time holds the emitting process for ever (it kept
``airflow dags test`` from exiting) and a silent one costs every event its timeouts (a
42 s run took 331 s). :func:`install`, called when trainyard's Airflow plugin loads (every
Airflow process that emits loads it), makes ``"type": "http"`` mean
:class:`DeadlineHttpTransport`:

* each emit ends within the transport's ``timeout``, retries included (the total, not per
  read);
* an emit that missed it marks the endpoint down for :data:`COOLDOWN_S`, for every process
  of this Airflow home (the task processes, the scheduler's pool; the marker lives in the
  home): the run's other events fail at once, each one warning in the log, instead of
  each waiting;
* a ``timeout`` that is not a number of seconds above 0 is refused, naming the value.

Lineage never fails a step: the provider logs a failed emit as a warning.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import Any

from openlineage.client.transport import get_default_factory
from openlineage.client.transport.http import HttpTransport

from trainyard.deadline import within
from trainyard.fsutil import redact_url

COOLDOWN_S = 60.0
"""How long an endpoint that missed its deadline is skipped without being asked."""


def _down_marker(url: str) -> Path:
    """The endpoint's marker, in a folder of the Airflow home's owner (not a shared /tmp)."""
    from airflow.configuration import AIRFLOW_HOME

    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(AIRFLOW_HOME) / "trainyard-lineage" / f"{digest}.down"


def _is_down(marker: Path) -> bool:
    try:
        return time.time() - marker.stat().st_mtime < COOLDOWN_S
    except OSError:
        return False


def _mark_down(marker: Path) -> None:
    try:
        marker.parent.mkdir(mode=0o700, exist_ok=True)
        marker.touch(mode=0o600)
    except OSError:
        pass  # the next emit waits its deadline again: slower, never wrong


class DeadlineHttpTransport(HttpTransport):
    """The client's HTTP transport, each emit bounded by ``timeout`` in total."""

    def __init__(self, config: Any) -> None:
        """Refuse a ``timeout`` that is not a number of seconds above 0 (``"5"`` is 5).

        Raises:
            ValueError: Naming the transport's URL and the value.
        """
        super().__init__(config)
        try:
            seconds = float(self.timeout)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0) or isinstance(self.timeout, bool):
            raise ValueError(
                f"OpenLineage http transport to {redact_url(self.url)}: timeout must be a "
                f"number of seconds above 0 (the total for one event), not {self.timeout!r}"
            )
        self.timeout = seconds

    def emit(self, event: Any) -> Any:
        """Send one event, or raise ``TimeoutError`` once ``timeout`` seconds have passed."""
        marker = _down_marker(self.url)
        where = redact_url(self.url)
        if _is_down(marker):
            raise TimeoutError(
                f"OpenLineage endpoint {where} missed its deadline less than "
                f"{COOLDOWN_S:g} s ago: event not sent"
            )
        try:
            return within(
                self.timeout,
                lambda: super(DeadlineHttpTransport, self).emit(event),
                f"OpenLineage emit to {where}",
            )
        except TimeoutError:
            _mark_down(marker)
            raise


def install() -> None:
    """Make ``"type": "http"`` in OpenLineage's transport config :class:`DeadlineHttpTransport`."""
    get_default_factory().register_transport(HttpTransport.kind, DeadlineHttpTransport)
