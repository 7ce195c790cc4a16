"""A secrets backend that fails any connection or variable lookup (used by parse tests)."""

from __future__ import annotations

from airflow.secrets import BaseSecretsBackend


class RaisingSecretsBackend(BaseSecretsBackend):
    """Every lookup is a parse-time access, which DAG files must never make."""

    def get_conn_value(self, conn_id: str) -> str | None:
        raise AssertionError(f"connection {conn_id!r} looked up at DAG parse time")

    def get_connection(self, conn_id: str):  # type: ignore[override]
        raise AssertionError(f"connection {conn_id!r} looked up at DAG parse time")

    def get_variable(self, key: str) -> str | None:
        raise AssertionError(f"variable {key!r} looked up at DAG parse time")
