"""The scoring loop: read, check, score, write, acknowledge (``score-stream``'s job).

It reads the pipeline's input stream as a member of its consumer group, checks every
record against the dataset's contract (:class:`~trainyard.streaming.records.RecordChecker`;
failures go to the dead-letter stream with the reason), scores the rest in micro-batches
on the version the ``stable`` label names
(:class:`~trainyard.streaming.model_endpoint.ModelEndpoint`) and writes ``{id, score,
class_id, version, source}`` per record to the output stream, keyed by the record id.
Inputs are acknowledged only with or after their outputs (:meth:`StreamEngine.commit`): at
least once.

**Back-pressure.** At most ``max_in_flight`` batches are at the server and at most
``2 * max_in_flight + 1`` read and not yet committed (the others are being checked or
committed: a thread of its own writes each batch's scores while the next is read); while
that many are, the scorer reads nothing more, so memory stays bounded and unread records
wait in the stream. A failing model server (refused, 5xx, time-out) is retried with
back-off for as long as it fails; records it refuses with 400 are scored one by one and
those it still refuses are dead-lettered with its message. A stream engine that fails
(Redis refusing a commit, or not answering within its deadline) ends the run ``failed``,
its error in the status file; the supervisor starts the scorer again. Lag
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
make valid records poison. A hung scorer writes no status: its supervisor
(:mod:`~trainyard.streaming.supervisor`) kills it, as the Deployment's liveness probe does
on Kubernetes.
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures as cf
import gc
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from trainyard.config import PipelineConfig, load_pipeline
from trainyard.errors import ConfigError
from trainyard.fsutil import atomic_write_json
from trainyard.pipelines import ensure_own_names
from trainyard.settings import get_settings, serving_endpoint
from trainyard.streaming.engines import (
    KafkaStreams,
    Message,
    Output,
    RedisStreams,
    StreamEngine,
    StreamError,
    Streams,
    encode_scores,
)
from trainyard.streaming.model_endpoint import ModelEndpoint, ServerRefused, Stopped, scores_of
from trainyard.streaming.records import RecordChecker, show_value
from trainyard.streaming.redis_client import REDIS_DEADLINE_S
from trainyard.streaming.supervisor import supervisor_pid

log = logging.getLogger("trainyard.streaming")

MAX_ID_CHARS = 1024
"""A longer record id is not copied into its dead letter (the entry id keys it instead)."""
MAX_DEAD_VALUE_BYTES = 65536
"""How much of a refused record a dead letter keeps."""
GC_THRESHOLD = 50_000
"""Allocations between young-generation collections while scoring (Python's default: 700)."""


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
    # a read waits up to max_wait_ms for records: its deadline is that much longer
    deadline_s = REDIS_DEADLINE_S + cfg.scoring.max_wait_ms / 1000
    return RedisStreams(url, streams, consumer, deadline_s=deadline_s)


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
        scores: list[Output] = []
        if batch.future is not None:
            got: _Scored = batch.future.result()
            if got.refused:
                why = "model server refused the record: "
                got = got.rows(batch.dead_letter_rows({i: why + r for i, r in got.refused.items()}))
            scores = encode_scores(batch.keys, batch.sources, got.scores, got.classes, got.versions)
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
