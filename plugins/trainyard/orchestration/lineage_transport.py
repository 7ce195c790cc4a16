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
  of this user on this machine (the task processes, the scheduler's pool): the run's other
  events fail at once, each one warning in the log, instead of each waiting.

Lineage never fails a step: the provider logs a failed emit as a warning.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
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
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"trainyard-{os.getuid()}-lineage-{digest}.down"


def _is_down(marker: Path) -> bool:
    try:
        st = marker.stat()
    except OSError:
        return False
    # another account's file in a shared /tmp is no evidence
    return st.st_uid == os.getuid() and time.time() - st.st_mtime < COOLDOWN_S


def _mark_down(marker: Path) -> None:
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        os.utime(marker)
    except OSError:
        pass  # the next emit waits its deadline again: slower, never wrong


class DeadlineHttpTransport(HttpTransport):
    """The client's HTTP transport, each emit bounded by ``timeout`` in total."""

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
                float(self.timeout),
                lambda: super(DeadlineHttpTransport, self).emit(event),
                f"OpenLineage emit to {where}",
            )
        except TimeoutError:
            _mark_down(marker)
            raise


def install() -> None:
    """Make ``"type": "http"`` in OpenLineage's transport config :class:`DeadlineHttpTransport`."""
    get_default_factory().register_transport(HttpTransport.kind, DeadlineHttpTransport)
