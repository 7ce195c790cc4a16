"""Airflow connections as a step reads them: ``AIRFLOW_CONN_<CONN_ID>``, no Airflow import.

Steps run as pods and import no Airflow; a connection reaches them the way Airflow itself
reads one from the environment, as a URI (``s3://key:secret@?endpoint_url=...``) or as
JSON (``{"conn_type": ..., "host": ..., "login": ..., "password": ..., "extra": {...}}``).
The local runner sets the variable for a step's process from Airflow's own lookup (any
secrets backend, or its database: :func:`trainyard.orchestration.runners.connection_env`);
on a cluster it comes from the pod's environment (a Secret) or workload identity.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainyard.errors import ConfigError


def conn_env_name(conn_id: str) -> str:
    """The environment variable Airflow reads a connection from: ``AIRFLOW_CONN_<ID>``."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


@dataclass(frozen=True)
class Connection:
    """One Airflow connection's fields.

    Attributes:
        conn_id: Its id.
        conn_type: ``s3``, ``http``, ``google_cloud_platform``, ...
        host: Host (may hold a scheme, as HTTP connections often do).
        port: Port.
        schema: Airflow's ``schema`` field (a path prefix for HTTP).
        login: User or access key id.
        password: Secret.
        extra: The ``extra`` object.
    """

    conn_id: str
    conn_type: str = ""
    host: str = ""
    port: int | None = None
    schema: str = ""
    login: str = ""
    password: str = field(default="", repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def secrets(self) -> tuple[str, ...]:
        """What output must never show (:func:`trainyard.fsutil.redact_text`)."""
        values = [self.password, *_secret_values(self.extra)]
        return tuple(v for v in values if v)


def _secret_values(extra: Mapping[str, Any]) -> list[str]:
    from trainyard.fsutil import SECRET_KEY_RE

    out: list[str] = []
    for key, value in extra.items():
        if isinstance(value, Mapping):
            out += _secret_values(value)
        elif isinstance(value, str) and SECRET_KEY_RE.match(str(key)):
            out.append(value)
    return out


def read_connection(conn_id: str, environ: Mapping[str, str] | None = None) -> Connection | None:
    """The connection ``conn_id`` from the environment, or None when it is not there.

    Args:
        conn_id: The connection id.
        environ: The environment to read (default: this process's).

    Raises:
        ConfigError: If the variable holds neither a URI nor a JSON object (the message
            names the variable, never its value).
    """
    name = conn_env_name(conn_id)
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigError(f"{name} is neither a URI nor JSON") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{name} (JSON) is not an object")
        return connection_from_fields(conn_id, data)
    parts = urllib.parse.urlsplit(text)
    if not parts.scheme:
        raise ConfigError(f"{name} is neither a URI nor JSON")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    extra_text = query.pop("__extra__", None)
    extra: dict[str, Any] = json.loads(extra_text) if extra_text else dict(query)
    return Connection(
        conn_id=conn_id,
        conn_type=parts.scheme.replace("-", "_"),
        host=urllib.parse.unquote(parts.hostname or ""),
        port=parts.port,
        schema=urllib.parse.unquote(parts.path.lstrip("/")),
        login=urllib.parse.unquote(parts.username or ""),
        password=urllib.parse.unquote(parts.password or ""),
        extra=extra,
    )


def connection_from_fields(conn_id: str, data: Mapping[str, Any]) -> Connection:
    """A connection from its JSON form's fields (as Airflow's ``Connection.to_dict`` has them).

    Raises:
        ConfigError: If its extra is text that is not JSON.
    """
    extra = data.get("extra") or {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            raise ConfigError(f"{conn_env_name(conn_id)}: its extra is not JSON") from None
    return Connection(
        conn_id=conn_id,
        conn_type=str(data.get("conn_type") or ""),
        host=str(data.get("host") or ""),
        port=int(data["port"]) if data.get("port") not in (None, "") else None,
        schema=str(data.get("schema") or ""),
        login=str(data.get("login") or ""),
        password=str(data.get("password") or ""),
        extra=extra if isinstance(extra, dict) else {},
    )


def storage_options(url: str, conn: Connection | None) -> dict[str, Any]:
    """Fsspec storage options for a source URL, from its Airflow connection.

    The connection's ``extra`` may hold ``storage_options`` (passed to fsspec as they
    are); its login and password become the file system's credentials: ``key``/``secret``
    for ``s3``, ``account_name``/``account_key`` for ``abfs``/``az``, basic auth for
    ``http(s)``. A ``s3`` connection's ``endpoint_url`` (extra) names an S3-compatible
    server.

    Args:
        url: The source URL (its scheme picks the mapping).
        conn: The connection, or None (no options: the environment's credentials, such
            as workload identity, apply).

    Returns:
        Keyword arguments for ``fsspec.core.url_to_fs``.
    """
    if conn is None:
        return {}
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    options = dict(conn.extra.get("storage_options") or {})
    if scheme in ("s3", "s3a"):
        if conn.login:
            options.setdefault("key", conn.login)
            options.setdefault("secret", conn.password)
        endpoint = conn.extra.get("endpoint_url")
        if endpoint:
            options.setdefault("client_kwargs", {}).setdefault("endpoint_url", endpoint)
    elif scheme in ("abfs", "abfss", "az"):
        if conn.login:
            options.setdefault("account_name", conn.login)
            options.setdefault("account_key", conn.password)
    elif scheme in ("http", "https") and conn.login:
        import aiohttp

        auth = aiohttp.BasicAuth(conn.login, conn.password)
        options.setdefault("client_kwargs", {}).setdefault("auth", auth)
    return options
