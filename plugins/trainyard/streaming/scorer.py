"""The stream scorer: ``python -m trainyard score-stream --pipeline P``.

It reads the pipeline's input stream as a member of its consumer group, checks every
record against the dataset's contract (:class:`~trainyard.streaming.records.RecordChecker`;
failures go to the dead-letter stream with the reason), scores the rest in micro-batches
through the serving REST API and writes ``{id, score, class_id, version, source}`` per
record to the output stream, keyed by the record id. Inputs are acknowledged only with or
after their outputs (:meth:`StreamEngine.commit`): at least once.

**Which model.** Before a batch the scorer asks the server which version the ``stable``
label names (``GET /v1/models/<m>/labels/stable``, cached for ``version_ttl_s``; without
labels: the highest AVAILABLE version) and sends the batch to
``/v1/models/<m>/versions/<n>:predict``. The version written with a score is therefore the
version that computed it (a plain ``:predict`` response does not say which answered).
After a promotion or rollback the old version is unloaded; its 404 makes the scorer read
the label again and resend the batch, so outputs follow the registry.

**Back-pressure.** At most ``max_in_flight`` batches are at the server and at most
``2 * max_in_flight + 1`` read and not yet committed (the others are being checked or
committed: a thread of its own writes each batch's scores while the next is read); while
that many are, the scorer reads nothing more, so memory stays bounded and unread records
wait in the stream. A failing server (connection refused, 5xx, time-out) is retried with exponential
back-off (0.1 s doubling to 5 s) for as long as it fails; records it refuses with 400 are
scored one by one and those it still refuses are dead-lettered with its message. Lag
(records the group has not read) and pending records are logged every ``report_s`` and
written to ``--status-file``.

**Kills.** Records a killed scorer read but did not commit stay pending in the group;
every scorer claims entries idle for ``claim_idle_s`` (``XPENDING`` then ``XCLAIM``, never
its own in flight) when it starts and every ``claim_idle_s / 2`` after; on Kafka the next
owner of the partition reads from the last committed offset. SIGTERM stops reading,
finishes and commits what is in flight, and exits 0 (``state: stopped``). What a failing
server keeps it from committing stays pending, and the last lines say how much. The
SIGTERM a supervised scorer gets when its supervisor dies (``PR_SET_PDEATHSIG``) is no
such request: it then ends ``failed``, naming the dead supervisor. With
``--exit-when-idle S`` it exits 0 after S seconds with nothing read and nothing in flight,
and 1 (``failed``, the batches left pending) after S seconds with nothing read or scored
while the model server fails.

**Poison records.** A record that kills or hangs the scorer would stop every scorer that
claims it. Claimed records are therefore scored one at a time, with nothing else in
flight, and one delivered more than ``max_deliveries`` times is dead-lettered unread. A
scorer that stops because the stream engine refused its commit gives what it read back
uncounted (:meth:`StreamEngine.release`): restarts before the refusal is fixed must not
make valid records poison.
A hung scorer writes no status: its supervisor (:func:`supervise`) kills it when the
status file is older than :data:`STALE_AFTER_REPORTS` reports, as the Deployment's
liveness probe does on Kubernetes.
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures as cf
import fcntl
import gc
import http.client
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from trainyard.argtypes import ArgumentParser, positive_float, positive_int
from trainyard.config import PipelineConfig, load_pipeline
from trainyard.errors import ConfigError, TrainyardError
from trainyard.fsutil import atomic_write_json, cmdline_has, process_alive, terminate
from trainyard.pipelines import ensure_own_names
from trainyard.serving.client import ServingClient
from trainyard.settings import get_settings, serving_endpoint
from trainyard.streaming.engines import (
    KafkaStreams,
    Message,
    Output,
    RedisStreams,
    Scores,
    StreamEngine,
    StreamError,
    Streams,
)
from trainyard.streaming.records import RecordChecker, show_value

log = logging.getLogger("trainyard.streaming")

MAX_BACKOFF_S = 5.0
MAX_ID_CHARS = 1024
"""A longer record id is not copied into its dead letter (the entry id keys it instead)."""
STALE_AFTER_REPORTS = 12
"""A scorer that wrote no status for this many report intervals is hung and killed by its
supervisor: 60 s at the default 5 s (it reports also while it waits for the model server).
On Kubernetes the liveness probe's limit is ``k8s.scoring.STALE_AFTER_S``."""
MAX_DEAD_VALUE_BYTES = 65536
"""How much of a refused record a dead letter keeps."""
GC_THRESHOLD = 50_000
"""Allocations between young-generation collections while scoring (Python's default: 700)."""
SUPERVISOR_ENV = "TRAINYARD_SCORER_SUPERVISOR"
"""Set by :func:`supervise` in its child's environment: the supervisor's pid."""


def supervisor_pid() -> int | None:
    """The pid of the :func:`supervise` process that started this scorer, or None."""
    try:
        return int(os.environ[SUPERVISOR_ENV])
    except (KeyError, ValueError):
        return None


def supervisor_gone() -> str | None:
    """Why this supervised scorer has lost its supervisor, or None.

    None when it is not supervised, or its supervisor is still its parent. The child
    dies with its supervisor (``PR_SET_PDEATHSIG`` sends SIGTERM), by which time the
    kernel has given it another parent: that SIGTERM is no deliberate stop.
    """
    pid = supervisor_pid()
    if pid is None or os.getppid() == pid:
        return None
    return (
        f"its supervisor (pid {pid}) died: nothing would restart this scorer, so it "
        "stopped; start it again (score-stream --restart, or the deploy step)"
    )


class Stopped(Exception):
    """The scorer was asked to stop while a batch waited for the server."""


class ServerRefused(TrainyardError):
    """The model server answered 400 for a batch: some record is not scorable."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def streams_of(cfg: PipelineConfig) -> Streams:
    """The pipeline's streams and group.

    Raises:
        ConfigError: If the pipeline has no ``scoring.stream``.
    """
    s = cfg.scoring.stream
    if s is None:
        raise ConfigError(f"pipeline {cfg.name!r} has no scoring.stream: nothing to score")
    return Streams(s.input, s.output, s.dead_letter, s.group or f"trainyard-{cfg.name}")


def open_engine(cfg: PipelineConfig, consumer: str | None = None) -> StreamEngine:
    """The pipeline's stream engine.

    Redis: ``url``, ``TRAINYARD_REDIS_URL`` or the project's own server (started if it is
    not running); Kafka: ``bootstrap_servers``.
    """
    s = cfg.scoring.stream
    streams = streams_of(cfg)
    assert s is not None
    if s.engine == "kafka":
        assert s.bootstrap_servers is not None
        return KafkaStreams(s.bootstrap_servers, streams, consumer)
    url = s.url or get_settings().redis_url
    if url is None:
        from trainyard.streaming import redis_server

        url = redis_server.ensure_running()
    # a read may wait max_wait_ms for records: the socket waits longer than that
    timeout_s = 30.0 + cfg.scoring.max_wait_ms / 1000
    return RedisStreams(url, streams, consumer, socket_timeout_s=timeout_s)


# --------------------------------------------------------------------------- the model


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
        status, doc = self._get(f"/v1/models/{self.model}/labels/stable")
        if status == 404:  # no labels (a server without a model config): the newest
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


# --------------------------------------------------------------------------- the loop


def dead_letter(key: Any, source: str, reason: str, value: bytes | None) -> Output:
    """A dead letter: keyed by the record id (its entry id when it has none usable)."""
    usable = isinstance(key, str) and len(key) <= MAX_ID_CHARS
    doc = {"id": key if usable else None, "source": source, "reason": reason}
    if value is not None:
        kept = value[:MAX_DEAD_VALUE_BYTES]
        try:
            value.decode("utf-8")
            doc["value"] = kept.decode("utf-8", "ignore")  # a character the cut split: gone
        except UnicodeDecodeError:  # shown readable, and kept whole beside it
            doc["value"] = kept.decode("utf-8", "replace")
            doc["value_base64"] = base64.b64encode(kept).decode("ascii")
        if len(value) > MAX_DEAD_VALUE_BYTES:  # cut: its size says so
            doc["value_bytes"] = len(value)
    return Output.of(key if usable else source, doc)


@dataclass
class _Batch:
    messages: list[Message]
    dead: list[Output]
    keys: list[str]
    sources: list[str]
    records: list[dict[str, Any]]
    raw: list[bytes]  # each valid record's bytes, for a dead letter the server causes
    future: cf.Future[Any] | None = None

    def dead_letter_rows(self, reasons: dict[int, str]) -> list[int]:
        """Move the valid rows ``reasons`` names (row → why) to the dead letters.

        Returns:
            The rows kept, as indices into the lists before the move.
        """
        for i, why in reasons.items():
            self.dead.append(dead_letter(self.keys[i], self.sources[i], why, self.raw[i]))
        keep = [i for i in range(len(self.keys)) if i not in reasons]
        self.keys = [self.keys[i] for i in keep]
        self.sources = [self.sources[i] for i in keep]
        self.records = [self.records[i] for i in keep]
        self.raw = [self.raw[i] for i in keep]
        return keep


@dataclass
class _Scored:
    """A batch's answer from the model server.

    The version that scored it (one per row when rows went one by one), per row the score
    and class id, and the rows the server refused (row → its message).
    """

    versions: int | list[int | None]
    scores: list[float]
    classes: list[int | None]
    refused: dict[int, str]

    def rows(self, keep: list[int]) -> _Scored:
        """The answer for the rows ``keep`` only (after rows went one by one)."""
        assert isinstance(self.versions, list)
        return _Scored(
            [self.versions[i] for i in keep],
            [self.scores[i] for i in keep],
            [self.classes[i] for i in keep],
            {},
        )


@dataclass
class Stats:
    """What the scorer did so far (logged and written to the status file)."""

    started: float = field(default_factory=time.time)
    read: int = 0
    scored: int = 0
    dead: int = 0
    claimed: int = 0
    batches: int = 0
    version: int | None = None
    lag: int | None = None
    pending: int | None = None
    _rate_from: tuple[float, int] | None = None  # (time, scored) of the previous doc

    def doc(self) -> dict[str, Any]:
        """As JSON.

        ``records_per_s`` is the rate since the previous call (the last report),
        ``average_records_per_s`` the rate since the start.
        """
        now = time.time()
        up = max(now - self.started, 1e-9)
        since, before = self._rate_from or (self.started, 0)
        self._rate_from = (now, self.scored)
        return {
            "pid": os.getpid(),
            "supervisor_pid": supervisor_pid(),
            "updated_at": time.time(),
            "uptime_s": round(up, 1),
            "read": self.read,
            "scored": self.scored,
            "dead_lettered": self.dead,
            "claimed": self.claimed,
            "batches": self.batches,
            "records_per_s": round((self.scored - before) / max(now - since, 1e-9), 1),
            "average_records_per_s": round(self.scored / up, 1),
            "version": self.version,
            "lag": self.lag,
            "pending": self.pending,
        }


class Scorer:
    """Consume, check, score, write, acknowledge: see the module docstring."""

    def __init__(
        self,
        engine: StreamEngine,
        checker: RecordChecker,
        endpoint: ModelEndpoint,
        *,
        batch_size: int = 256,
        max_wait_ms: int = 20,
        max_in_flight: int = 2,
        claim_idle_s: float = 60.0,
        max_deliveries: int = 2,
        report_s: float = 5.0,
        status_file: Path | None = None,
    ) -> None:
        """Wire the parts; nothing is read until :meth:`run`."""
        self.engine = engine
        self.checker = checker
        self.endpoint = endpoint
        self.batch_size = batch_size
        self.max_wait_ms = max_wait_ms
        self.max_in_flight = max_in_flight
        # read and not yet committed: those at the server, one being read, one committing
        self.max_batches = 2 * max_in_flight + 1
        self.claim_idle_ms = int(claim_idle_s * 1000)
        self.max_deliveries = max_deliveries
        self.report_s = report_s
        self.status_file = status_file
        self.stop = endpoint.stop
        self.stats = Stats()
        self._pool = cf.ThreadPoolExecutor(max_in_flight, thread_name_prefix="score")
        # Commits run on a thread (and a Redis connection) of their own, so Redis writes a
        # batch's scores while this thread reads and checks the next.
        self._committer = cf.ThreadPoolExecutor(1, thread_name_prefix="commit")
        self._next_claim = 0.0
        self._claims_told = 0.0
        # the message lists read and not yet committed (by id() of the list): a claim's
        # answer is checked against them, which is rare, not each batch's ids kept in a set
        self._inflight: dict[int, list[Message]] = {}
        self._ids_lock = threading.Lock()
        # A claim and a commit never overlap: a claim's reply may list entries a commit
        # then acknowledges, which the claim must still see as ours in flight.
        self._claim_lock = threading.Lock()
        self._next_report = time.monotonic() + report_s
        self._error: str | None = None
        self._last_failure: str | None = None  # the previous run's, read by the first report
        self._failure_read = False
        # when a record was last read or a batch committed (--exit-when-idle)
        self._progress_at = time.monotonic()
        self._idle_after_s: float | None = None
        self.left_pending = 0  # records read and not committed when run() returned

    @property
    def error(self) -> str | None:
        """Why the scorer failed (the status file's ``error``), or None."""
        return self._error

    def fail(self, why: str) -> None:
        """Stop as :attr:`stop` does, but end ``failed`` with ``why``.

        What is in flight is finished if it can be; nobody asked the scorer to stop.
        """
        self._error = why[:500]
        self.stop.set()

    # -- one batch

    def _prepare(self, messages: list[Message]) -> _Batch:
        todo, dead = messages, []
        if messages[0].deliveries is not None:  # claimed: some may stop every scorer
            todo = []
            for m in messages:
                if m.deliveries is not None and m.deliveries > self.max_deliveries:
                    why = (
                        f"delivered {m.deliveries} times and never acknowledged: each scorer "
                        "that took it stopped first (crashed, killed or hung on it)"
                    )
                    log.warning("%s: %s: dead-lettered", m.id, why)
                    dead.append(dead_letter(self._key_of(m), m.id, why, m.fields or m.value))
                else:
                    todo.append(m)
        raws = [m.value for m in todo]
        records, reasons, inputs = self.checker.parse_inputs(raws)
        if not any(reasons):  # every record passed: the lists at once
            key = self.checker.key
            keys = [r[key] for r in records]
            sources = [m.id for m in todo]
            return self._submit(_Batch(messages, dead, keys, sources, records, raws), inputs)
        batch = _Batch(messages, dead, [], [], [], [])
        for m, record, reason in zip(todo, records, reasons, strict=True):
            key = record.get(self.checker.key) if isinstance(record, dict) else None
            if m.fields is not None:  # a Redis entry without a value field
                names = ", ".join(orjson.loads(m.fields))
                why = f"no 'value' field in the entry (its fields: {names})"
                batch.dead.append(dead_letter(m.key, m.id, why, m.fields))
            elif reason is not None:
                batch.dead.append(dead_letter(key, m.id, reason, m.value))
            else:
                batch.keys.append(key)
                batch.sources.append(m.id)
                batch.records.append(record)
                batch.raw.append(m.value)
        return self._submit(batch, inputs)

    def _key_of(self, m: Message) -> Any:
        """The record's key (its id field) if it reads as a JSON object, else its own key."""
        try:
            record = orjson.loads(m.value)
        except orjson.JSONDecodeError:
            return m.key
        return record.get(self.checker.key, m.key) if isinstance(record, dict) else m.key

    def _submit(self, batch: _Batch, inputs: dict[str, np.ndarray]) -> _Batch:
        """Send the batch's valid records (``inputs``, their features) to the model server.

        On the scoring pool. A record the contract accepts whose feature does not fit the
        model's float32 input (beyond ±3.4e38) is dead-lettered here, naming the feature
        (NaN is a missing value, which the model fills).
        """
        if not batch.records:
            return batch
        unfit = None
        floats = {n: c for n, c in inputs.items() if c.dtype.kind == "f"}
        for col in floats.values():
            if np.isinf(col).any():
                unfit = np.isinf(col) if unfit is None else unfit | np.isinf(col)
        if unfit is not None:
            reasons = {}
            for i in np.flatnonzero(unfit).tolist():
                name = next(n for n, c in floats.items() if np.isinf(c[i]))
                value = batch.records[i][name]
                reasons[i] = f"{name}: {show_value(value)} does not fit the model's float32 input"
            keep = batch.dead_letter_rows(reasons)
            inputs = {n: c[keep] for n, c in inputs.items()}
            if not keep:
                return batch
        batch.future = self._pool.submit(self._score, inputs, len(batch.records))
        return batch

    def _score(self, inputs: dict[str, np.ndarray], rows: int) -> _Scored:
        """The batch's scores, or per row the server's reason if it refuses some."""
        try:
            version, outputs = self.endpoint.predict(inputs)
        except ServerRefused as e:
            if rows == 1:
                return _Scored([None], [math.nan], [None], {0: e.message})
            versions: list[int | None] = []
            out = _Scored(versions, [], [], {})
            for i in range(rows):  # find the record(s) it refuses
                one = self._score({k: v[i : i + 1] for k, v in inputs.items()}, 1)
                versions.append(one.versions if isinstance(one.versions, int) else None)
                out.scores += one.scores
                out.classes += one.classes
                if one.refused:
                    out.refused[i] = one.refused[0]
            return out
        scores, classes = scores_of(outputs, rows)
        return _Scored(version, scores, classes, {})

    def _finish(self, batch: _Batch) -> None:
        """Wait for the batch's scores, write them and its dead letters, acknowledge it.

        Runs on the committer thread, one batch after another in the order read.
        """
        scores = Scores([], [], [], [], 0)
        if batch.future is not None:
            got: _Scored = batch.future.result()
            if got.refused:
                why = "model server refused the record: "
                got = got.rows(batch.dead_letter_rows({i: why + r for i, r in got.refused.items()}))
            scores = Scores(batch.keys, batch.sources, got.scores, got.classes, got.versions)
            if scores:
                last = got.versions if isinstance(got.versions, int) else got.versions[-1]
                self.stats.version = last
        with self._claim_lock:
            self.engine.commit(scores, batch.dead, batch.messages)
            with self._ids_lock:
                self._inflight.pop(id(batch.messages), None)
        self._progress_at = time.monotonic()
        self.stats.scored += len(scores)
        self.stats.dead += len(batch.dead)
        self.stats.batches += 1

    # -- the loop

    def _fetch(self) -> list[Message]:
        now = time.monotonic()
        if now >= self._next_claim:
            # our own batches still at the server may be idle that long too: not again
            with self._claim_lock:
                with self._ids_lock:
                    ours = {m.id for ms in self._inflight.values() for m in ms}
                claimed = self.engine.claim(self.claim_idle_ms, self.batch_size, ours)
            if claimed:
                if not self.stats.claimed or self._claims_told < now - 5:
                    self._claims_told = now  # one at a time: a line each would flood the log
                    log.info("claiming records a stopped scorer left pending, one at a time")
                self.stats.claimed += len(claimed)
                return claimed
            self._next_claim = now + self.claim_idle_ms / 2000
        return self.engine.read(self.batch_size, self.max_wait_ms)

    def _wait(self, committed: cf.Future[None]) -> None:
        """Wait for a batch's commit (its errors raise here), reporting while it takes.

        With ``exit_when_idle_s``, a model server that keeps failing while nothing is read
        or committed for that long ends the run (:meth:`_give_up`): its batches stay
        pending, and ``Stopped`` raises here.
        """
        tick = self.report_s / 2
        if self._idle_after_s is not None:
            tick = min(tick, max(self._idle_after_s / 4, 0.05))
        while not committed.done():  # the server is slow or down: keep reporting
            cf.wait([committed], timeout=tick)
            self._maybe_report()
            if not self.stop.is_set() and self._stuck():
                self._give_up()
        committed.result()

    def _stuck(self) -> bool:
        """Nothing read or committed for ``exit_when_idle_s`` while the server fails."""
        return (
            self._idle_after_s is not None
            and self.endpoint.failing is not None
            and time.monotonic() - self._progress_at > self._idle_after_s
        )

    def _give_up(self) -> None:
        why = (
            f"nothing read or scored for {self._idle_after_s:g} s (--exit-when-idle) while "
            f"the model server {self.endpoint.host}:{self.endpoint.port} fails "
            f"({self.endpoint.failing}): exiting, what was read stays pending"
        )
        log.error("%s", why)
        self.fail(why)

    def _release_uncounted(self) -> None:
        """Give back what was read and not committed, this delivery uncounted.

        The stream engine refused a commit (a key of the wrong type, memory full): every
        scorer after this one would meet the same refusal, exit and be restarted, and each
        claim of the same records would count one more delivery until valid records were
        dead-lettered as poison. Best effort: an engine that cannot be told leaves them
        counted.
        """
        with self._ids_lock:
            left = [m for ms in self._inflight.values() for m in ms]
        try:
            self.engine.release(left)
        except StreamError as e:
            log.warning("could not give back %d records uncounted: %s", len(left), e)

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now >= self._next_report:
            self.report()
            self._next_report = now + self.report_s

    def report(self, final: bool = False) -> dict[str, Any]:
        """Log progress and lag; write the status file."""
        try:
            self.stats.lag, self.stats.pending = self.engine.lag().values()
        except Exception as e:  # lag is best effort; scoring goes on
            log.debug("lag: %s", e)
        doc = self.stats.doc()
        doc["server"] = self.endpoint.failing or "ok"
        doc["state"] = "running" if not final else "failed" if self._error else "stopped"
        if not self._failure_read:
            self._last_failure, self._failure_read = previous_failure(self.status_file), True
        doc["error"] = self._error
        before = None if self.stats.batches else self._last_failure
        doc["last_failure"] = self._error or before
        log.info(
            "scored %d (%.0f/s), dead-lettered %d, claimed %d, lag %s, pending %s, version %s%s",
            self.stats.scored,
            doc["records_per_s"],
            self.stats.dead,
            self.stats.claimed,
            self.stats.lag,
            self.stats.pending,
            self.stats.version,
            f", server failing: {self.endpoint.failing}" if self.endpoint.failing else "",
        )
        if self.status_file is not None:
            atomic_write_json(self.status_file, doc)
        return doc

    def run(self, max_records: int | None = None, exit_when_idle_s: float | None = None) -> Stats:
        """Score until stopped (SIGTERM, :attr:`stop`), ``max_records`` read, or idle.

        Args:
            max_records: Stop after reading this many records (tests, benchmarks).
            exit_when_idle_s: Stop once nothing was read for this long and nothing is in
                flight; or, with batches in flight, once nothing was read or committed
                for this long while the model server fails: those stay pending and the
                run ends ``failed`` (:attr:`error` says why).

        Returns:
            The final statistics (:attr:`left_pending`: the records read and not
            committed, which stay pending in the group).
        """
        inflight: collections.deque[cf.Future[None]] = collections.deque()  # commits
        stream_refused = False  # the stream engine refused us: not our records' doing
        self._idle_after_s = exit_when_idle_s
        self._progress_at = time.monotonic()
        self.report()
        # A batch makes thousands of short-lived tuples, which would start the cyclic
        # collector every few records; what exists now (modules, config) never needs it.
        threshold = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(threshold[0], GC_THRESHOLD), *threshold[1:])
        try:
            while not self.stop.is_set():
                while inflight and (len(inflight) >= self.max_batches or inflight[0].done()):
                    self._wait(inflight.popleft())
                if max_records is not None and self.stats.read >= max_records:
                    break
                messages = self._fetch()
                now = time.monotonic()
                self._maybe_report()
                if not messages:
                    if inflight:
                        self._wait(inflight.popleft())
                    elif (
                        exit_when_idle_s is not None and now - self._progress_at > exit_when_idle_s
                    ):
                        break
                    continue
                self._progress_at = now
                # claimed: read by a scorer that stopped, maybe because of it: alone, with
                # nothing else in flight
                alone = messages[0].deliveries is not None
                while alone and inflight:
                    self._wait(inflight.popleft())
                self.stats.read += len(messages)
                with self._ids_lock:
                    self._inflight[id(messages)] = messages
                inflight.append(self._committer.submit(self._finish, self._prepare(messages)))
                while alone and inflight:
                    self._wait(inflight.popleft())
            while inflight:  # finish and commit what is in flight
                self._wait(inflight.popleft())
        except Stopped:
            pass  # stopped while the server failed: what it did not score stays pending
        except BaseException as e:
            self.stop.set()  # batches waiting for the server give up: they stay pending
            self._error = f"{type(e).__name__}: {e}"[:500]
            stream_refused = isinstance(e, StreamError)
            raise
        finally:
            self._committer.shutdown(wait=True, cancel_futures=True)
            self._pool.shutdown(wait=False, cancel_futures=True)
            gc.set_threshold(*threshold)
            gc.unfreeze()
            # what was read and not committed (the batches at a failing server, and those
            # queued behind them): the group keeps it pending for the next scorer
            with self._ids_lock:
                left = [len(ms) for ms in self._inflight.values()]
            self.left_pending = sum(left)
            if left and stream_refused:
                self._release_uncounted()
            if left:
                log.warning(
                    "stopped with %d records read and not committed (in %d batch%s): "
                    "they stay pending in the group for the next scorer to claim",
                    self.left_pending,
                    len(left),
                    "" if len(left) == 1 else "es",
                )
            self.report(final=True)
        return self.stats


def previous_failure(status_file: Path | None) -> str | None:
    """Why the scorer that last wrote ``status_file`` failed, or None.

    A supervisor restarts a scorer that failed: that failure stays in the status file
    (``last_failure``) until the new one commits a batch, so one failing over and over
    says why.
    """
    if status_file is None or not status_file.is_file():
        return None
    try:
        previous = orjson.loads(status_file.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if isinstance(previous, dict) and previous.get("state") == "failed":
        return previous.get("error") or previous.get("last_failure")
    return None


# --------------------------------------------------------------------------- CLI


def model_unreachable(cfg: PipelineConfig, timeout_s: float = 5.0) -> str | None:
    """Why the pipeline's model server cannot score now (down, or no version served), or None."""
    where = serving_endpoint(cfg)
    endpoint = ModelEndpoint(where.host, where.port, cfg.serving.model_name, timeout_s=timeout_s)
    try:
        endpoint.resolve()
    except (OSError, http.client.HTTPException, LookupError) as e:
        return f"model server {where.address}: {type(e).__name__}: {e}"
    finally:
        endpoint.close()
    return None


def waiting_for_the_model(cfg: PipelineConfig) -> str:
    """What a scorer does while its model server does not answer (back-pressure)."""
    sc = cfg.scoring
    batches = 2 * sc.max_in_flight + 1
    return (
        f"the scorer reads at most {batches * sc.batch_size} records ({batches} batches of "
        f"{sc.batch_size}), waits for the server and leaves the rest in the stream"
    )


def build_scorer(
    pipeline: str,
    consumer: str | None = None,
    status_file: Path | None = None,
    report_s: float = 5.0,
) -> Scorer:
    """A :class:`Scorer` for a pipeline, from its config and contract."""
    from trainyard.contracts import load_contract

    cfg = load_pipeline(pipeline)
    ensure_own_names(cfg)
    sc = cfg.scoring
    streams_of(cfg)  # one clear error when there is nothing to score
    checker = RecordChecker(load_contract(cfg.dataset))
    where = serving_endpoint(cfg)
    endpoint = ModelEndpoint(
        where.host, where.port, cfg.serving.model_name, timeout_s=sc.request_timeout_s
    )
    engine = open_engine(cfg, consumer)
    return Scorer(
        engine,
        checker,
        endpoint,
        batch_size=sc.batch_size,
        max_wait_ms=sc.max_wait_ms,
        max_in_flight=sc.max_in_flight,
        claim_idle_s=sc.claim_idle_s,
        max_deliveries=sc.max_deliveries,
        report_s=report_s,
        status_file=status_file,
    )


def cli_main(argv: list[str]) -> int:
    """``python -m trainyard score-stream --pipeline P [...]``.

    Returns:
        0 when stopped (SIGTERM) or done; 1 when it gave up (``--exit-when-idle`` with the
        model server failing: what it read stays pending) or its supervisor died, and on a
        trainyard error (the message names it).
    """
    parser = ArgumentParser(
        prog="python -m trainyard score-stream",
        description="Score a pipeline's input stream with its served champion.",
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--consumer", help="member name in the group (default host-pid)")
    parser.add_argument("--status-file", type=Path, help="write progress and lag here (JSON)")
    parser.add_argument(
        "--report-s", type=positive_float, default=5.0, help="report every N seconds"
    )
    parser.add_argument("--max-records", type=positive_int, help="stop after reading N records")
    parser.add_argument(
        "--exit-when-idle",
        type=positive_float,
        metavar="S",
        help="stop after S seconds with nothing read and nothing in flight (exit 0); "
        "with batches in flight, after S seconds with nothing read or scored while the "
        "model server fails: exit 1, what was read left pending for the next scorer",
    )
    parser.add_argument(
        "--supervise",
        action="store_true",
        help="run the scorer as a child process, restarting it when it dies",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start or restart the pipeline's supervised scorer in the background, as the "
        "deploy step does (a running scorer keeps the contract and config it started with)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.restart:
        pid = start_local_scorer(args.pipeline)
        pids = local_scorer_pids_text(args.pipeline, pid)
        print(f"scorer running ({pids}); log {scorer_dir(args.pipeline) / LOG_FILE}")
        cfg = load_pipeline(args.pipeline)
        if why := model_unreachable(cfg):
            print(f"warning: {why}: {waiting_for_the_model(cfg)}", file=sys.stderr)
        return 0
    if args.supervise:
        child = [a for a in argv if a != "--supervise"]
        cmd = [sys.executable, "-m", "trainyard", "score-stream", *child]
        stale = STALE_AFTER_REPORTS * args.report_s
        return supervise(cmd, status_file=args.status_file, stale_after_s=stale)
    scorer = build_scorer(args.pipeline, args.consumer, args.status_file, args.report_s)

    def _term(signum: int, _frame: Any) -> None:
        if why := supervisor_gone():  # PR_SET_PDEATHSIG: nobody asked it to stop
            log.error("signal %d: %s; finishing what is in flight, then exiting", signum, why)
            scorer.fail(why)
            return
        log.info("signal %d: finishing what is in flight, then exiting", signum)
        scorer.stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    if why := supervisor_gone():  # it died before the death signal was set up
        log.error("%s", why)
        scorer.fail(why)
    log.info(
        "scoring %s: %s %s -> %s (dead letters %s), group %s as %s, model %s at %s:%d",
        args.pipeline,
        scorer.engine.name,
        scorer.engine.streams.input,
        scorer.engine.streams.output,
        scorer.engine.streams.dead_letter,
        scorer.engine.streams.group,
        scorer.engine.consumer,
        scorer.endpoint.model,
        scorer.endpoint.host,
        scorer.endpoint.port,
    )
    try:
        scorer.run(args.max_records, args.exit_when_idle)
    finally:
        scorer.engine.close()
    return 1 if scorer.error else 0


def _pdeathsig() -> None:  # pragma: no cover - runs in the child before exec
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def supervise(
    cmd: list[str],
    max_backoff_s: float = 30.0,
    status_file: Path | None = None,
    stale_after_s: float | None = None,
) -> int:
    """Run ``cmd`` and start it again whenever it exits other than by our SIGTERM.

    The child dies with the supervisor (``PR_SET_PDEATHSIG``: its SIGTERM handler tells
    that from a deliberate stop by :data:`SUPERVISOR_ENV`, and its status says
    ``failed``); SIGTERM to the supervisor is passed on, waited for, and ends it with 0.
    Restarts back off from 1 s to ``max_backoff_s`` (reset after a run of a minute). A
    child that has not written ``status_file`` for ``stale_after_s`` is hung (a scorer
    reports also while it waits for the model server): it is killed, and the status file
    says so.
    """
    import subprocess

    stopping = threading.Event()
    proc: subprocess.Popen[bytes] | None = None

    def _term(signum: int, _frame: Any) -> None:
        stopping.set()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
    backoff = 1.0
    while not stopping.is_set():
        started = time.monotonic()
        proc = subprocess.Popen(cmd, preexec_fn=_pdeathsig, env=env)
        code = _wait_alive(proc, status_file, stale_after_s, stopping)
        if stopping.is_set():
            break
        if time.monotonic() - started > 60:
            backoff = 1.0
        log.warning("scorer exited with %s; restarting in %.0f s", code, backoff)
        if stopping.wait(backoff):
            break
        backoff = min(backoff * 2, max_backoff_s)
    return 0


def _wait_alive(
    proc: Any, status_file: Path | None, stale_after_s: float | None, stopping: threading.Event
) -> int:
    """``proc``'s exit code; it is killed first if ``status_file`` goes stale."""
    import subprocess

    since = time.time()
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if status_file is None or stale_after_s is None or stopping.is_set():
            continue
        try:
            last = max(since, status_file.stat().st_mtime)
        except OSError:
            last = since
        if time.time() - last < stale_after_s:
            continue
        why = f"wrote no status for {time.time() - last:.0f} s (hung?): killed by its supervisor"
        log.error("scorer pid %d %s", proc.pid, why)
        proc.kill()
        code = proc.wait()
        try:
            doc = orjson.loads(status_file.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            doc = {}
        if isinstance(doc, dict):
            atomic_write_json(status_file, {**doc, "state": "failed", "error": why})
        return code


# --------------------------------------------------------------------------- local process

PID_FILE = "scorer.pid"
LOG_FILE = "scorer.log"
STATUS_FILE = "status.json"
START_LOCK = "start.lock"


def scorer_dir(pipeline: str) -> Path:
    """Where a pipeline's local scorer keeps its pid, log and status files."""
    return get_settings().volume_root / "_scoring" / pipeline


def _alive(pid: int) -> bool:
    return process_alive(pid)


def _ours(pid: int) -> bool:
    return cmdline_has(pid, b"score-stream")


def local_scorer_pid(pipeline: str) -> int | None:
    """The running local scorer's (supervisor's) pid, or None."""
    try:
        pid = int((scorer_dir(pipeline) / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and _ours(pid) else None


def local_scorer_pids_text(pipeline: str, supervisor: int) -> str:
    """``supervisor pid X, scorer pid Y``: the pid file's process and the scorer it runs.

    ``Y`` is the status file's ``pid`` (the scorer process, whose ``supervisor_pid`` is
    ``X``) while that process runs; between a scorer's death and its restart there is none.

    Args:
        pipeline: The pipeline whose local scorer it is.
        supervisor: The supervisor's pid (the pid file's).

    Returns:
        The text, for "scorer running (...)".
    """
    try:
        doc = orjson.loads((scorer_dir(pipeline) / STATUS_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        doc = None
    if not isinstance(doc, dict):
        doc = {}
    child = doc.get("pid")
    if (
        isinstance(child, int)
        and doc.get("supervisor_pid") == supervisor
        and _alive(child)
        and _ours(child)
    ):
        return f"supervisor pid {supervisor}, scorer pid {child}"
    return f"supervisor pid {supervisor}, its scorer restarting"


def stop_local_scorer(pipeline: str, timeout_s: float = 30.0) -> bool:
    """SIGTERM the pipeline's local scorer (it commits what is in flight), then SIGKILL.

    Returns:
        True if one was running.
    """
    folder = scorer_dir(pipeline)
    pid = local_scorer_pid(pipeline)
    if pid is None:
        (folder / PID_FILE).unlink(missing_ok=True)
        return False
    terminate(pid, timeout_s, group=True)
    (folder / PID_FILE).unlink(missing_ok=True)
    return True


def stop_all_local_scorers() -> list[str]:
    """Stop every local scorer of this volume root (``make stop``); the pipelines stopped."""
    root = get_settings().volume_root / "_scoring"
    stopped = []
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if folder.is_dir() and stop_local_scorer(folder.name):
            stopped.append(folder.name)
    return stopped


def start_local_scorer(pipeline: str, timeout_s: float = 60.0) -> int:
    """Start (or restart) the pipeline's scorer as a detached, supervised process.

    ``python -m trainyard score-stream --pipeline P --supervise`` in a session of its own,
    its pid in ``<volume root>/_scoring/<P>/scorer.pid``, its log in ``scorer.log``, its
    progress in ``status.json``. A running one is stopped first (it commits what it has
    in flight), so the new one reads the current config.

    Returns:
        The supervisor's pid.

    Raises:
        ConfigError: If the pipeline has no ``scoring.stream``.
        RedisServerError, StreamError: If its Redis server cannot be started or reached.
        TrainyardError: If it exits or reports nothing within ``timeout_s`` (with its log).
    """
    from trainyard.contracts import load_contract

    cfg = load_pipeline(pipeline)
    streams_of(cfg)
    # what the new scorer would fail on, before the running one is stopped
    ensure_own_names(cfg)
    RecordChecker(load_contract(cfg.dataset))
    if cfg.scoring.stream is not None and cfg.scoring.stream.engine == "redis":
        open_engine(cfg).close()  # the Redis server answers (started if it is ours)
    folder = scorer_dir(pipeline)
    folder.mkdir(parents=True, exist_ok=True)
    # Two deploys at once: the second waits, then stops the first one's scorer and starts
    # its own, so one scorer (the pid file's) runs.
    with open(folder / START_LOCK, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(pipeline, folder, timeout_s)


def _start_locked(pipeline: str, folder: Path, timeout_s: float) -> int:
    import subprocess

    import trainyard

    stop_local_scorer(pipeline)
    status = folder / STATUS_FILE
    status.unlink(missing_ok=True)
    plugins_dir = str(Path(trainyard.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugins_dir, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable, "-m", "trainyard", "score-stream", "--pipeline", pipeline,
        "--supervise", "--status-file", str(status),
    ]  # fmt: skip
    log_path = folder / LOG_FILE
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    (folder / PID_FILE).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrainyardError(f"scorer of {pipeline} exited ({proc.returncode}); log {log_path}")
        if status.is_file():
            return proc.pid
        time.sleep(0.1)
    raise TrainyardError(
        f"scorer of {pipeline} reported nothing in {timeout_s:.0f}s; log {log_path}"
    )
