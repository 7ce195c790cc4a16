"""One stream interface, two back-ends: Redis Streams (embedded default) and Kafka (cluster).

The scorer sees a :class:`StreamEngine`: ``read`` new records as a member of a consumer
group, ``claim`` records a dead member read but never acknowledged, ``commit`` scores and
dead letters *then* acknowledge the records they came from, ``lag`` and ``produce``.

* **Redis Streams** (:class:`RedisStreams`, redis-py with hiredis): ``XREADGROUP`` (the
  group is created at the stream's start with ``MKSTREAM``, so records produced before the
  first scorer count), ``XPENDING`` and ``XCLAIM`` of entries idle longer than the claim
  time, one at a time with their delivery counts, and ``commit`` as one Lua script, which
  Redis runs atomically: the ``XADD`` of every score and dead letter, then the ``XACK`` of
  their inputs. A killed scorer therefore leaves a batch either written and acknowledged,
  or neither (pending, claimed by the next scorer). Every call ends within a deadline
  (:mod:`~trainyard.streaming.redis_client`): a server that stops answering, or answers a
  byte at a time, fails it with a :class:`StreamError`.
* **Kafka** (:class:`KafkaStreams`, confluent-kafka): a consumer group with auto commit
  off; ``commit`` produces every output (idempotent producer, ``acks=all``), waits for
  each delivery, then commits the next offset of each partition synchronously. A kill
  between the two re-delivers the batch to the partition's next owner (rebalance does
  what claims do for Redis), so outputs may repeat: they are keyed by record id
  and carry the input's position (``source``), so a duplicate is recognisable. Reads wait
  at most their ``block_ms``, deliveries ``delivery_timeout_s``, and librdkafka ends a
  synchronous offset commit that finds no group coordinator after ``session.timeout.ms``.

Records are JSON objects: the Redis entry field ``value`` (an optional ``key`` field), the
Kafka message value (the message key is optional). Outputs are JSON too: a Redis entry
``key`` + ``value``, a Kafka message with the record id as key.
"""

from __future__ import annotations

import abc
import functools
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import redis

from trainyard.errors import TrainyardError
from trainyard.fsutil import redact_url
from trainyard.streaming.redis_client import REDIS_DEADLINE_S, redis_client

log = logging.getLogger("trainyard.streaming")


class StreamError(TrainyardError):
    """A stream engine failed (the message names the engine, stream and reason)."""


class Message(NamedTuple):
    """A record read from the input stream (a tuple: one is made per record read).

    Attributes:
        id: Its position: a Redis entry id, or ``<topic>/<partition>/<offset>``.
        value: The record (JSON bytes).
        key: The message key, when the producer gave one.
        partition: Kafka partition (None for Redis).
        offset: Kafka offset (None for Redis).
        fields: A Redis entry without a ``value`` field: its fields as a JSON object (its
            dead letter keeps them; ``value`` is then empty).
        deliveries: A claimed record: how many times the group has delivered it, this
            time included (None when read as new).
    """

    id: str
    value: bytes
    key: str | None = None
    partition: int | None = None
    offset: int | None = None
    fields: bytes | None = None
    deliveries: int | None = None


class Output(NamedTuple):
    """A record for an output stream: keyed by the record id, its document as JSON bytes.

    A batch of scores is encoded at once (:func:`encode_scores`); :meth:`of` encodes any
    other document.
    """

    key: str
    value: bytes

    @classmethod
    def of(cls, key: str, doc: dict[str, Any]) -> Output:
        """An output whose document is ``doc``, encoded with orjson."""
        return cls(key, orjson.dumps(doc))


_output = functools.partial(tuple.__new__, Output)
"""``Output`` of a ``(key, value)`` pair without its Python-level ``__new__`` (a score each)."""


def encode_scores(
    keys: list[Any],
    sources: list[str],
    scores: list[float],
    classes: list[int | None],
    versions: int | list[int | None],
) -> list[Output]:
    """The output documents ``{id, score, class_id, version, source}``, one per record.

    Formatted directly (a few hundred thousand a second are written), byte for byte what
    ``orjson.dumps`` writes for each document: the scores, the keys and the sources are
    each formatted by one ``orjson.dumps`` of the batch's list (a NaN or infinite score is
    null). Anything else (ids that are not strings, a version per row) is encoded a
    document at a time.

    Args:
        keys: Record ids (the key column's values: strings, or another JSON value).
        sources: Input positions (stream entry ids, ``topic/partition/offset``).
        scores: Per record score (floats).
        classes: Per record class id, or None.
        versions: The model version that scored the batch, or one per record.
    """
    if (
        isinstance(versions, int)
        and set(map(type, scores)) <= {float}
        and set(map(type, keys)) | set(map(type, sources)) <= {str}
    ):
        head = b'{"id":"%b","score":%b,"class_id":%b,"version":' + b"%d" % versions
        fmt = head + b',"source":"%b"}'
        docs = [
            fmt % (k, t, b"null" if c is None else b"%d" % c, src)
            for k, t, c, src in zip(
                _json_strings(keys), score_texts(scores), classes, _json_strings(sources),
                strict=True,
            )
        ]  # fmt: skip
        return list(map(_output, zip(keys, docs, strict=True)))
    each = [versions] * len(keys) if isinstance(versions, int) else versions
    return [
        Output.of(k, {"id": k, "score": s, "class_id": c, "version": v, "source": src})
        for k, src, s, c, v in zip(keys, sources, scores, classes, each, strict=True)
    ]


def _json_strings(strings: list[str]) -> list[bytes]:
    """Each string as ``orjson.dumps`` writes it, without its quotes: one call for all.

    Inside a JSON string every quote is escaped, so ``","`` only ever separates two.
    """
    return orjson.dumps(strings)[2:-2].split(b'","') if strings else []


def score_texts(scores: list[float]) -> list[bytes]:
    """Each score as ``orjson.dumps`` writes it (one call for the batch; null if not finite)."""
    return orjson.dumps(scores)[1:-1].split(b",") if scores else []


@dataclass(frozen=True)
class Streams:
    """The three streams (Redis stream keys or Kafka topics) and the consumer group."""

    input: str
    output: str
    dead_letter: str
    group: str


class StreamEngine(abc.ABC):
    """What the scorer needs from a stream engine."""

    name: str = "?"

    def __init__(self, streams: Streams, consumer: str | None = None) -> None:
        """Remember the streams and this member's name (default ``<host>-<pid>``)."""
        import os

        self.streams = streams
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"

    @abc.abstractmethod
    def read(self, count: int, block_ms: int) -> list[Message]:
        """Up to ``count`` new records for this member, waiting up to ``block_ms`` for one."""

    @abc.abstractmethod
    def claim(self, min_idle_ms: int, count: int, skip: Set[str] = frozenset()) -> list[Message]:
        """Records read and not acknowledged for ``min_idle_ms``, now ours.

        Not ``skip`` (those this member has in flight); each with its ``deliveries``. A
        record a member read and never acknowledged may be what stopped that member: the
        engines that count deliveries hand them over one at a time.
        """

    @abc.abstractmethod
    def commit(self, scores: Sequence[Output], dead: Sequence[Output], done: Sequence[Message]):
        """Write ``scores`` and ``dead`` letters, then acknowledge ``done`` (never before)."""

    @abc.abstractmethod
    def lag(self) -> dict[str, int | None]:
        """``lag`` (records not yet read by the group) and ``pending`` (read, not acked)."""

    @abc.abstractmethod
    def produce(self, records: Sequence[tuple[str | None, bytes]], stream: str | None = None):
        """Append ``(key, value)`` records to ``stream`` (default: the input stream)."""

    def release(self, messages: Sequence[Message]) -> None:  # noqa: B027 - optional
        """Give back records read and not committed, not counting this delivery.

        For a member that stops for a reason not its records' (the stream engine refused
        a commit): the next member's claim must not take them for poison. Engines that
        count no deliveries have nothing to undo.

        Raises:
            StreamError: If the engine cannot be told.
        """

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


# --------------------------------------------------------------------------- Redis


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


COMMIT_SCRIPT = """
for _, key in ipairs({KEYS[1], KEYS[2]}) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not a stream')
  end
end
local i = 4
for n, key in ipairs({KEYS[1], KEYS[2]}) do
  for _ = 1, tonumber(ARGV[n + 1]) do
    redis.call('XADD', key, '*', 'key', ARGV[i], 'value', ARGV[i + 1])
    i = i + 2
  end
end
local acked = 0
while i <= #ARGV do
  local last = math.min(i + 999, #ARGV)
  acked = acked + redis.call('XACK', KEYS[3], ARGV[1], unpack(ARGV, i, last))
  i = last + 1
end
return acked
"""
"""The commit: KEYS output, dead letters, input; ARGV group, score count, dead-letter count,
then ``key value`` per output and the entry ids to acknowledge."""


LAG_SCRIPT = """
local n, start, most = 0, '(' .. ARGV[1], tonumber(ARGV[2])
while n < most do
  local want = math.min(1000, most - n)
  local page = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', want)
  n = n + #page
  if #page < want then break end
  start = '(' .. page[#page][1]
end
return n
"""
"""Entries of stream KEYS[1] after id ARGV[1], counted up to ARGV[2]."""
LAG_COUNT_MAX = 1000
"""The most entries :data:`LAG_SCRIPT` counts: about 2 ms of Redis's time a report."""


def _raw(reply: Any, **_options: Any) -> Any:
    """A reply as hiredis parsed it (redis-py's own parsing of entries into dicts skipped)."""
    return reply


def _entry_message(entry_id: bytes | str, fields: list[bytes]) -> Message:
    """A Redis entry (its field/value list) as a :class:`Message`.

    The record is the ``value`` field, the optional ``key`` field its key; an entry with
    no ``value`` field keeps its fields (``Message.fields``) for its dead letter.
    """
    f = dict(zip(fields[::2], fields[1::2], strict=True))
    key = f.get(b"key")
    value = f.get(b"value")
    others = None
    if value is None:
        text = {_s(k): v.decode("utf-8", "replace") for k, v in f.items()}
        others = orjson.dumps(text)
    return Message(
        _s(entry_id), b"" if value is None else value, None if key is None else _s(key),
        fields=others,
    )  # fmt: skip


_message = functools.partial(tuple.__new__, Message)
"""``Message`` of all its fields, without its Python-level ``__new__`` (one a record read)."""


def _messages(entries: Any) -> list[Message]:
    """The entries of a stream reply (hiredis's lists) as Messages; deleted ones skipped."""
    out = []
    for entry_id, fields in entries or ():
        if len(fields or ()) == 2 and fields[0] == b"value":  # what producers usually write
            out.append(_message((entry_id.decode(), fields[1], None, None, None, None, None)))
        elif fields:  # None: deleted while pending
            out.append(_entry_message(entry_id, fields))
    return out


class RedisStreams(StreamEngine):
    """Redis Streams through redis-py, hiredis parsing, every call within a deadline."""

    name = "redis"

    def __init__(
        self,
        url: str,
        streams: Streams,
        consumer: str | None = None,
        deadline_s: float = REDIS_DEADLINE_S,
    ) -> None:
        """Connect and create the consumer group at the input stream's start if missing.

        Args:
            url: The server (``unix://``, ``redis://`` or ``rediss://``).
            streams: The streams and the group.
            consumer: This member's name in the group.
            deadline_s: The most one call may take, a read's ``BLOCK`` included
                (:func:`~trainyard.streaming.redis_client.redis_client`): a server that
                stops answering, or answers a byte at a time, fails the call by then.

        Raises:
            StreamError: If the server does not answer or refuses the group.
        """
        super().__init__(streams, consumer)
        self.url = redact_url(url)  # as messages and logs show it: no password
        try:
            self.r = redis_client(url, deadline_s)
        except ValueError as e:
            raise StreamError(f"redis URL {self.url!r}: {e}") from None
        # XREADGROUP and XCLAIM replies as hiredis parsed them: the entries' field lists
        # are read straight into Messages
        self.r.set_response_callback("XREADGROUP", _raw)
        self.r.set_response_callback("XCLAIM", _raw)
        self._commit = self.r.register_script(COMMIT_SCRIPT)
        self._lag = self.r.register_script(LAG_SCRIPT)
        self._claim_from = "0-0"
        self._calling(self._create_group)

    def _calling(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, Redis's failures raised as :class:`StreamError`."""
        try:
            return call(*args, **kwargs)
        except redis.RedisError as e:
            raise StreamError(f"redis {self.url}: {type(e).__name__}: {e}") from e

    def _create_group(self) -> None:
        """The consumer group at the input stream's start (the stream too), unless it exists."""
        try:
            self.r.xgroup_create(self.streams.input, self.streams.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise StreamError(
                    f"redis {self.url}: cannot create group {self.streams.group}: {e}"
                ) from e

    def _regrouped(self, call: Callable[[], Any]) -> Any:
        """``call()``; once more after creating the group if the input stream lost it."""
        try:
            return self._calling(call)
        except StreamError as e:
            if not isinstance(e.__cause__, redis.ResponseError) or "NOGROUP" not in str(e):
                raise
        # the input stream (and with it the group) was deleted: start again at its start
        log.warning(
            "redis %s: stream %s has no group %s (deleted?): created again at its start",
            self.url, self.streams.input, self.streams.group,
        )  # fmt: skip
        self._calling(self._create_group)
        return self._calling(call)

    def read(self, count: int, block_ms: int) -> list[Message]:
        """``XREADGROUP GROUP <g> <me> COUNT n BLOCK ms STREAMS <in> >``."""
        s = self.streams
        reply = self._regrouped(
            lambda: self.r.xreadgroup(
                s.group, self.consumer, {s.input: ">"}, count=count, block=max(1, block_ms)
            )
        )
        return _messages(reply[0][1]) if reply else []

    def claim(self, min_idle_ms: int, count: int, skip: Set[str] = frozenset()) -> list[Message]:
        """``XPENDING`` (idle ones, from where the last call stopped), then ``XCLAIM`` of one.

        The first idle entry not in ``skip``, alone: it may be what stopped the scorer
        that read it, and alone it stops only its own scorer. ``XAUTOCLAIM`` would also
        claim what this member has in flight and so count a delivery of it each time: the
        counts must say how many scorers took a record, for the scorer to dead-letter one
        that stops every scorer. A deleted entry is acknowledged.
        """
        return self._calling(self._claim, min_idle_ms, count, skip)

    def _claim(self, min_idle_ms: int, count: int, skip: Set[str]) -> list[Message]:
        s = self.streams
        rows = self.r.xpending_range(
            s.input, s.group, min=self._claim_from, max="+", count=count, idle=min_idle_ms
        )
        take = [row for row in rows if _s(row["message_id"]) not in skip][:1]
        if take:
            self._claim_from = "(" + _s(take[0]["message_id"])
        elif len(rows) == count:
            self._claim_from = "(" + _s(rows[-1]["message_id"])
        else:
            self._claim_from = "-"
            self._forget_idle_members(min_idle_ms)
            return []
        if not take:
            return []
        ids = [_s(row["message_id"]) for row in take]
        entries = self.r.xclaim(s.input, s.group, self.consumer, min_idle_ms, ids)
        got = {_s(i) for i, fields in entries if fields is not None}
        if deleted := [i for i in ids if i not in got]:  # Redis before 7 keeps them
            log.warning("%d pending entries were deleted from %s", len(deleted), s.input)
            self.r.xack(s.input, s.group, *deleted)
        before = {_s(row["message_id"]): row["times_delivered"] for row in take}
        return [m._replace(deliveries=before[m.id] + 1) for m in _messages(entries)]

    def release(self, messages: Sequence[Message]) -> None:
        """``XCLAIM ... RETRYCOUNT <deliveries before ours> JUSTID``: this delivery uncounted.

        They stay pending with this member, claimable by the next once idle.
        """
        s = self.streams
        by_count: dict[int, list[str]] = {}
        for m in messages:
            by_count.setdefault((m.deliveries or 1) - 1, []).append(m.id)
        for count, ids in by_count.items():
            self._calling(
                self.r.xclaim,
                s.input, s.group, self.consumer, 0, ids, retrycount=count, justid=True,
            )  # fmt: skip

    def _forget_idle_members(self, min_idle_ms: int) -> None:
        for c in self.r.xinfo_consumers(self.streams.input, self.streams.group):
            name = _s(c["name"])
            if name != self.consumer and c["pending"] == 0 and c["idle"] > min_idle_ms:
                self.r.xgroup_delconsumer(self.streams.input, self.streams.group, name)

    def commit(
        self, scores: Sequence[Output], dead: Sequence[Output], done: Sequence[Message]
    ) -> None:
        """One script (:data:`COMMIT_SCRIPT`): ``XADD`` every output, then ``XACK``.

        Redis runs a script as one and writes its effects to the append-only file as one
        transaction (dropped when the file is loaded if a crash cut it short), so a killed
        scorer leaves a batch written and acknowledged, or neither. Unlike ``MULTI``, a
        script stops at the first command that fails: an output key that is not a stream
        is refused before anything is written, and nothing is acknowledged after a
        failed ``XADD``.

        Raises:
            StreamError: If Redis refuses the batch or does not answer in time (the
                records stay pending).
        """
        s = self.streams
        args = [s.group, len(scores), len(dead)]
        args += itertools.chain.from_iterable(scores)  # key, value of each
        args += itertools.chain.from_iterable(dead)
        args += [m.id for m in done]
        try:
            self._commit(keys=[s.output, s.dead_letter, s.input], args=args)
        except redis.RedisError as e:
            why = f"{type(e).__name__}: {e}" if not isinstance(e, redis.ResponseError) else e
            raise StreamError(f"redis {self.url}: {why}; the batch stays pending") from e

    def lag(self) -> dict[str, int | None]:
        """``lag`` (entries after the group's last delivered id) and ``pending``.

        The entries are counted (:data:`LAG_SCRIPT`) up to :data:`LAG_COUNT_MAX`; beyond
        that Redis's own ``lag`` from ``XINFO GROUPS`` is taken, or the cap (then: at
        least that many) when Redis has none. Redis's figure alone is not enough: a Redis
        restarted from its append-only file has no count until the group next reaches
        the stream's end, and after a SIGKILL it can keep a wrong one.
        """
        for g in self._calling(self.r.xinfo_groups, self.streams.input):
            if _s(g["name"]) == self.streams.group:
                last = _s(g["last-delivered-id"])
                lag = self._calling(
                    self._lag, keys=[self.streams.input], args=[last, LAG_COUNT_MAX]
                )
                if lag >= LAG_COUNT_MAX and g.get("lag") is not None:
                    lag = max(lag, int(g["lag"]))
                return {"lag": int(lag), "pending": int(g["pending"])}
        return {"lag": None, "pending": None}

    def produce(
        self, records: Sequence[tuple[str | None, bytes]], stream: str | None = None
    ) -> list[str]:
        """``XADD`` each record (fields ``value`` and, if given, ``key``); the entry ids."""
        pipe = self.r.pipeline(transaction=False)
        for key, value in records:
            fields: dict[str, Any] = {"value": value}
            if key is not None:
                fields["key"] = key
            pipe.xadd(stream or self.streams.input, fields)
        return [_s(i) for i in self._calling(pipe.execute)]

    def close(self) -> None:
        """Close the connections."""
        self.r.close()
        self.r.connection_pool.disconnect()


# --------------------------------------------------------------------------- Kafka


def kafka_consumer_config(bootstrap: str, group: str, client_id: str) -> dict[str, Any]:
    """confluent-kafka consumer settings: group member, manual commits, from the start."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "max.poll.interval.ms": 300_000,
        "session.timeout.ms": 45_000,
    }


def kafka_producer_config(bootstrap: str, client_id: str) -> dict[str, Any]:
    """confluent-kafka producer settings: idempotent, every in-sync replica acknowledges."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
    }


def next_offsets(done: Sequence[Message]) -> dict[int, int]:
    """Per partition, the offset to commit after ``done``: one past the highest offset.

    Raises:
        StreamError: If a message has no partition/offset (not read from Kafka).
    """
    out: dict[int, int] = {}
    for m in done:
        if m.partition is None or m.offset is None:
            raise StreamError(f"message {m.id}: no Kafka partition/offset to commit")
        out[m.partition] = max(out.get(m.partition, -1), m.offset + 1)
    return out


class KafkaStreams(StreamEngine):
    """Kafka through confluent-kafka (librdkafka): a consumer group, manual commits."""

    name = "kafka"

    def __init__(
        self,
        bootstrap: str,
        streams: Streams,
        consumer: str | None = None,
        delivery_timeout_s: float = 30.0,
    ) -> None:
        """Create the consumer (subscribed to the input topic) and the producer.

        Nothing connects until the first ``read``/``commit``/``produce``.
        """
        import confluent_kafka

        super().__init__(streams, consumer)
        self._ck = confluent_kafka
        self.bootstrap = bootstrap
        self.delivery_timeout_s = delivery_timeout_s
        # librdkafka's own log lines go through Python logging, not straight to stderr
        klog = logging.getLogger("trainyard.streaming.kafka")
        self.consumer_ = confluent_kafka.Consumer(
            {**kafka_consumer_config(bootstrap, streams.group, self.consumer), "logger": klog}
        )
        self.consumer_.subscribe([streams.input])
        self.producer = confluent_kafka.Producer(
            {**kafka_producer_config(bootstrap, self.consumer), "logger": klog}
        )
        self._errors: list[str] = []
        self._lock = threading.Lock()

    def message(self, m: Any) -> Message:
        """A confluent-kafka message as a :class:`Message`."""
        key = m.key()
        return Message(
            id=f"{m.topic()}/{m.partition()}/{m.offset()}",
            value=m.value() or b"",
            key=None if key is None else _s(key),
            partition=m.partition(),
            offset=m.offset(),
        )

    def read(self, count: int, block_ms: int) -> list[Message]:
        """``consume`` up to ``count`` messages; a fatal client error raises."""
        out = []
        for m in self.consumer_.consume(num_messages=count, timeout=block_ms / 1000):
            err = m.error()
            if err is None:
                out.append(self.message(m))
            elif err.fatal():
                raise StreamError(f"kafka {self.bootstrap}: {err.str()}")
            else:
                log.warning("kafka %s: %s", self.bootstrap, err.str())
        return out

    def claim(self, min_idle_ms: int, count: int, skip: Set[str] = frozenset()) -> list[Message]:
        """Nothing: Kafka hands a dead member's uncommitted offsets over on rebalance."""
        return []

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            with self._lock:
                self._errors.append(f"{msg.topic()}: {err.str()}")

    def commit(
        self, scores: Sequence[Output], dead: Sequence[Output], done: Sequence[Message]
    ) -> None:
        """Produce every output, wait for all deliveries, then commit the inputs' offsets.

        Raises:
            StreamError: If an output was not delivered (nothing is committed then, so the
                records are read again).
        """
        for topic, outs in ((self.streams.output, scores), (self.streams.dead_letter, dead)):
            for o in outs:
                self._send(topic, o.key, o.value)
        self._flush()
        offsets = next_offsets(done)
        if offsets:
            tp = self._ck.TopicPartition
            self.consumer_.commit(
                offsets=[tp(self.streams.input, p, o) for p, o in sorted(offsets.items())],
                asynchronous=False,
            )

    def _send(self, topic: str, key: str | None, value: bytes) -> None:
        deadline = time.monotonic() + self.delivery_timeout_s
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=self._delivered)
                return
            except BufferError:  # local queue full: let deliveries drain, for so long
                if time.monotonic() > deadline:
                    raise StreamError(
                        f"kafka {self.bootstrap}: the producer's queue stayed full for "
                        f"{self.delivery_timeout_s:g}s (no broker takes the outputs?)"
                    ) from None
                self.producer.poll(0.1)

    def _flush(self) -> None:
        left = self.producer.flush(self.delivery_timeout_s)
        with self._lock:
            errors, self._errors = self._errors, []
        if left or errors:
            why = errors[0] if errors else f"{left} messages not delivered"
            raise StreamError(
                f"kafka {self.bootstrap}: outputs not delivered within "
                f"{self.delivery_timeout_s:g}s ({why}); nothing committed"
            )

    def lag(self) -> dict[str, int | None]:
        """High watermark minus position over the assigned partitions (cached watermarks)."""
        total = 0
        try:
            assigned = self.consumer_.assignment()
            for tp in self.consumer_.position(assigned):
                _, high = self.consumer_.get_watermark_offsets(tp, cached=True)
                if high >= 0 and tp.offset >= 0:
                    total += high - tp.offset
        except self._ck.KafkaException:
            return {"lag": None, "pending": None}
        return {"lag": total, "pending": None}

    def produce(
        self, records: Sequence[tuple[str | None, bytes]], stream: str | None = None
    ) -> None:
        """Produce each record and wait for delivery."""
        for key, value in records:
            self._send(stream or self.streams.input, key, value)
        self._flush()

    def close(self) -> None:
        """Leave the group (commits nothing) and drop the producer."""
        self.consumer_.close()
