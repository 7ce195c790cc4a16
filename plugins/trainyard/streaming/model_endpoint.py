"""The scorer's model client: which version the ``stable`` label names, ``:predict`` on it.

Before a batch the scorer asks the server which version ``stable`` names (``GET
/v1/models/<m>/labels/stable``, cached ``version_ttl_s``; without labels: the highest
AVAILABLE version) and posts the batch to ``/v1/models/<m>/versions/<n>:predict``, so the
version written with a score is the one that computed it (a plain ``:predict`` response
does not say). After a promotion or rollback the old version is unloaded: its 404 makes
the scorer read the label again and resend.

Requests go through :class:`~trainyard.serving.client.ServingClient` (one keep-alive
connection per thread), whose timeout bounds each whole request: a server that answers a
byte at a time, or not at all, fails it then. A failing server (refused, 5xx, time-out) is
retried with back-off (0.1 s doubling to :data:`MAX_BACKOFF_S`) until it answers or the
scorer stops; :attr:`ModelEndpoint.failing` says why meanwhile (the status file shows it).
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from typing import Any

import numpy as np
import orjson

from trainyard.errors import TrainyardError
from trainyard.serving.client import ServingClient

log = logging.getLogger("trainyard.streaming")

MAX_BACKOFF_S = 5.0
"""The longest wait between two tries of a failing model server."""


class Stopped(Exception):
    """The scorer was asked to stop while a batch waited for the server."""


class ServerRefused(TrainyardError):
    """The model server answered 400 for a batch: some record is not scorable."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelEndpoint:
    """The served model: which version ``stable`` names, and ``:predict`` on exactly it.

    Thread-safe: each thread gets its own keep-alive connection.
    """

    def __init__(
        self,
        host: str,
        port: int,
        model: str,
        *,
        timeout_s: float = 30.0,
        version_ttl_s: float = 0.25,
        stop: threading.Event | None = None,
    ) -> None:
        """Remember where the server is; nothing connects yet."""
        self.host, self.port, self.model = host, port, model
        self.timeout_s = timeout_s
        self.version_ttl_s = version_ttl_s
        self.stop = stop or threading.Event()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._version: int | None = None
        self._version_at = 0.0
        self.failing: str | None = None  # the last server failure while retrying

    def _client(self) -> ServingClient:
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = ServingClient(self.host, self.port, timeout=self.timeout_s)
        return c

    def _get(self, path: str) -> tuple[int, Any]:
        status, data = self._client().request("GET", path)
        try:
            return status, orjson.loads(data)
        except orjson.JSONDecodeError:
            return status, {"error": data[:300].decode("utf-8", "replace")}

    def resolve(self, refresh: bool = False) -> int:
        """The version ``stable`` names (cached ``version_ttl_s``), or the highest AVAILABLE.

        Raises:
            LookupError: If the model serves no AVAILABLE version.
            OSError, http.client.HTTPException: If the server does not answer.
        """
        now = time.monotonic()
        with self._lock:
            if (
                not refresh
                and self._version is not None
                and now - self._version_at < self.version_ttl_s
            ):
                return self._version
        # TF Serving resolves a label for metadata; its status ignores labels and lists every
        # version (the newest AVAILABLE would be a deploy's canary)
        status, doc = self._get(f"/v1/models/{self.model}/labels/stable/metadata")
        labelled = doc.get("model_spec", {}).get("version") if status == 200 else None
        if labelled is not None:
            version = int(labelled)
        else:  # no such label (a server without a model config): the newest AVAILABLE
            status, doc = self._get(f"/v1/models/{self.model}")
            entries = doc.get("model_version_status") if status == 200 else None
            available = [int(e["version"]) for e in entries or () if e.get("state") == "AVAILABLE"]
            if not available:
                raise LookupError(f"model {self.model}: no AVAILABLE version ({str(doc)[:200]})")
            version = max(available)
        with self._lock:
            if version != self._version:
                log.info("model %s: scoring with version %d", self.model, version)
            self._version, self._version_at = version, time.monotonic()
        return version

    def predict(self, inputs: dict[str, np.ndarray]) -> tuple[int, dict[str, Any]]:
        """Score one batch on the version ``stable`` names; retried until the server answers.

        Returns:
            ``(version that answered, columnar outputs)``.

        Raises:
            ServerRefused: On HTTP 400 (the batch is not scorable as it is).
            Stopped: If :attr:`stop` is set while retrying.
        """
        body = predict_body(inputs)
        delay = 0.1
        refresh = False
        unloaded = 0
        while True:
            try:
                version = self.resolve(refresh)
                status, data = self._client().request(
                    "POST", f"/v1/models/{self.model}/versions/{version}:predict", body
                )
                if status == 200:
                    self.failing = None
                    return version, orjson.loads(data)["outputs"]
                message = _error_of(data)
                if status == 400:
                    raise ServerRefused(message)
                refresh = True
                if status == 404 and unloaded < 3:
                    # the version was unloaded (a promotion or rollback): ask again now
                    unloaded += 1
                    continue
                why = f"version {version}: HTTP {status}: {message}"
            except (OSError, http.client.HTTPException, LookupError) as e:
                self._client().close()
                why = f"{type(e).__name__}: {e}"
                refresh = True
            if self.failing != why:
                log.warning("model server %s:%d: %s; retrying", self.host, self.port, why)
            self.failing = why
            if self.stop.wait(delay):
                raise Stopped()
            delay = min(delay * 2, MAX_BACKOFF_S)

    def close(self) -> None:
        """Close this thread's connection."""
        c = getattr(self._local, "client", None)
        if c is not None:
            c.close()


def _error_of(data: bytes) -> str:
    try:
        return str(orjson.loads(data).get("error"))[:300]
    except (orjson.JSONDecodeError, AttributeError):
        return data[:300].decode("utf-8", "replace")


def predict_body(inputs: dict[str, np.ndarray]) -> bytes:
    """A columnar ``:predict`` body any TF Serving takes.

    Numbers straight from numpy; a missing number (NaN) as the ``NaN`` token TF Serving's
    JSON reads (orjson would write null, which TF Serving refuses), strings as text.
    """
    textual = any(c.dtype.kind == "O" for c in inputs.values())
    missing = any(c.dtype.kind == "f" and np.isnan(c).any() for c in inputs.values())
    if not (textual or missing):
        return orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY)
    import json

    return json.dumps({"inputs": {n: c.tolist() for n, c in inputs.items()}}).encode()


def scores_of(outputs: dict[str, Any], rows: int) -> tuple[list[float], list[int | None]]:
    """Per row, the score and the class id.

    The score is the probability of class 1 for two classes, of the predicted class
    otherwise; for a model without ``probabilities``, its first output.
    """
    probs = outputs.get("probabilities")
    classes = outputs.get("class_id")
    if (  # two classes, as JSON lists: what numpy below would give, without it
        type(probs) is list
        and type(classes) is list
        and len(probs) == len(classes) == rows
        and set(map(type, probs)) <= {list}
        and set(map(len, probs)) <= {2}
    ):
        scores = [p[1] for p in probs]
        if (
            set(map(type, scores)) <= {float}
            and set(map(type, classes)) <= {int}
            and (not classes or -(2**63) <= min(classes) <= max(classes) < 2**63)
        ):
            return scores, classes
    if probs is not None:
        p = np.asarray(probs, dtype=np.float64).reshape(rows, -1)
        c = (
            np.asarray(classes, dtype=np.int64).reshape(rows)
            if classes is not None
            else p.argmax(axis=1)
        )
        s = p[:, 1] if p.shape[1] == 2 else p[np.arange(rows), c]
        return s.tolist(), c.tolist()
    first = next(iter(outputs.values()))
    values = np.asarray(first, dtype=np.float64).reshape(rows, -1)[:, 0]
    return values.tolist(), [None] * rows
