"""A secrets backend that denies any connection or variable lookup (used by parse tests).

It raises ``AirflowSecretsBackendAccessDenied``, which Airflow treats as authoritative
(other exceptions from a backend are logged and skipped), so a lookup fails the parse.
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowSecretsBackendAccessDenied
from airflow.secrets import BaseSecretsBackend


class RaisingSecretsBackend(BaseSecretsBackend):
    """Every lookup is a parse-time access, which DAG files must never make."""

    def get_conn_value(self, conn_id: str) -> str | None:
        raise AirflowSecretsBackendAccessDenied(
            f"connection {conn_id!r} looked up at DAG parse time"
        )

    def get_connection(self, conn_id: str):  # type: ignore[override]
        raise AirflowSecretsBackendAccessDenied(
            f"connection {conn_id!r} looked up at DAG parse time"
        )

    def get_variable(self, key: str) -> str | None:
        raise AirflowSecretsBackendAccessDenied(f"variable {key!r} looked up at DAG parse time")
