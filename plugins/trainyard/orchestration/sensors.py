"""Waiting for a data interval's source partition before staging (``when_missing: wait``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from trainyard.orchestration.inputs import FromRun, resolve

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainyard.config import PipelineConfig

log = logging.getLogger("trainyard.orchestration")


def source_present(pipeline: PipelineConfig, ds: str | None) -> bool:
    """Whether the pipeline's source for an interval date exists (fsspec, no read).

    A local source the pipeline bootstraps counts as present (staging writes it).

    Args:
        pipeline: The pipeline config.
        ds: The interval start date (``YYYY-MM-DD``) for ``{ds}``.

    Returns:
        True when the file or folder exists.
    """
    import fsspec

    from trainyard.connections import connection_from_fields, storage_options
    from trainyard.orchestration.runners import airflow_connection

    url = pipeline.source_url(ds)
    if pipeline.source.bootstrap and ("://" not in url or url.startswith("file://")):
        return True
    conn_id = pipeline.source.conn_id
    fields = airflow_connection(conn_id) if conn_id else None
    conn = connection_from_fields(conn_id, fields) if conn_id and fields else None
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url, conn))
    return bool(fs.exists(root.rstrip("/") or "/"))


class SourcePartitionSensor(BaseSensorOperator):
    """Waits (reschedule mode: no worker slot held) until the interval's source exists.

    It checks from the Airflow worker, so the source must be reachable from there (an
    object store, or a folder mounted on the workers). On ``timeout`` it fails without
    retry, naming the URL.

    Args:
        pipeline: The pipeline config (``source.url``, ``wait_timeout_s``, ``wait_poke_s``).
        **kwargs: ``BaseSensorOperator`` arguments.
    """

    ui_color = "#f3e8fb"

    def __init__(self, *, pipeline: PipelineConfig, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("timeout", pipeline.source.wait_timeout_s)
        kwargs.setdefault("poke_interval", pipeline.source.wait_poke_s)
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def poke(self, context: Context) -> bool:
        """True once the source for the run's interval exists."""
        from trainyard.fsutil import redact_url

        start = resolve(FromRun("interval_start", self.pipeline.schedule), context)
        ds = start[:10] if start else None
        present = source_present(self.pipeline, ds)
        url = redact_url(self.pipeline.source_url(ds))
        log.info("source %s %s", url, "is there" if present else "is not there yet")
        return present
