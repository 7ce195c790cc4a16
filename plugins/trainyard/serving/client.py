"""A tiny stdlib HTTP client for TF-Serving-compatible REST servers.

One persistent keep-alive connection with ``TCP_NODELAY``; request head and body go out
in a single ``send`` (``http.client`` joins them for ``bytes`` bodies), so small requests
are not delayed by Nagle's algorithm on either side.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from typing import Any

import numpy as np

from trainyard.errors import TrainyardError


class ServingHTTPError(TrainyardError):
    """The server answered with an HTTP error (``status`` and TF Serving's ``error``)."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.status = status
        self.message = message


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def encode_json(obj: Any) -> bytes:
    """JSON-encode a request (numpy arrays become nested lists)."""
    return json.dumps(obj, default=_default, separators=(",", ":")).encode()


class ServingClient:
    """Blocking client of one server; not thread-safe (use one per thread).

    ``timeout`` bounds each whole request, connection to last byte: a server that answers
    a byte at a time, or not at all, costs at most that long (a per-read timeout alone let a
    dripping server hold a caller forever), then ``TimeoutError``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8501, timeout: float = 30.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            conn.connect()
            assert conn.sock is not None
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Close the connection (a later request reconnects)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Send one request and read the whole response.

        A connection the server closed while idle is reopened once for the retry; any
        other connection error propagates (``OSError`` / ``http.client.HTTPException``).

        Args:
            method: ``GET`` or ``POST``.
            path: Path below the server root, e.g. ``/v1/models/digits``.
            body: Request body (JSON bytes) or None.

        Returns:
            ``(status, body)``.
        """
        headers = {"Content-Type": "application/json"} if body is not None else {}
        deadline = time.monotonic() + self.timeout
        for attempt in (0, 1):
            expired = threading.Event()
            watchdog = threading.Timer(
                max(deadline - time.monotonic(), 0.0), self._expire, [expired]
            )
            watchdog.daemon = True
            watchdog.start()
            try:
                conn = self._connection()
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt and not expired.is_set():
                    raise
                if not expired.is_set():
                    continue
                data, resp = b"", None
            except BaseException as e:
                self.close()
                # the socket's own timeout is the same deadline, and may fire first
                if not expired.is_set() and not isinstance(e, TimeoutError):
                    raise
                data, resp = b"", None
            finally:
                watchdog.cancel()
            if expired.is_set() or resp is None:
                self.close()
                raise TimeoutError(
                    f"{method} {self.base_url}{path}: no whole answer within {self.timeout:g} s"
                )
            if resp.will_close:
                self.close()
            return resp.status, data
        raise AssertionError("unreachable")

    def _expire(self, expired: threading.Event) -> None:
        """The request's deadline passed: cut its connection, which ends any blocked read."""
        expired.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def call(self, method: str, path: str, payload: Any = None) -> Any:
        """Send JSON, return decoded JSON; raise :class:`ServingHTTPError` on HTTP errors."""
        body = (
            None
            if payload is None
            else (payload if isinstance(payload, bytes) else encode_json(payload))
        )
        status, data = self.request(method, path, body)
        try:
            doc = json.loads(data) if data else None
        except json.JSONDecodeError:
            doc = None
        if status >= 400:
            message = (
                doc.get("error") if isinstance(doc, dict) else data[:500].decode("utf-8", "replace")
            )
            raise ServingHTTPError(status, str(message), f"{method} {self.base_url}{path}")
        return doc

    @staticmethod
    def _model_path(model: str, version: int | None) -> str:
        return f"/v1/models/{model}" + ("" if version is None else f"/versions/{version}")

    def status(self, model: str, version: int | None = None) -> list[dict[str, Any]]:
        """``model_version_status`` entries of a model (or one version)."""
        return self.call("GET", self._model_path(model, version))["model_version_status"]

    def metadata(self, model: str, version: int | None = None) -> dict[str, Any]:
        """The model's signature metadata."""
        return self.call("GET", self._model_path(model, version) + "/metadata")

    def predict(
        self,
        model: str,
        *,
        instances: Any = None,
        inputs: Any = None,
        version: int | None = None,
    ) -> Any:
        """``:predict`` in row (``instances``) or columnar (``inputs``) format.

        Returns:
            ``predictions`` (row format) or ``outputs`` (columnar format).
        """
        if (instances is None) == (inputs is None):
            raise ValueError("pass exactly one of instances= or inputs=")
        payload = {"instances": instances} if instances is not None else {"inputs": inputs}
        doc = self.call("POST", self._model_path(model, version) + ":predict", payload)
        return doc["predictions"] if instances is not None else doc["outputs"]
