"""One stream interface, two back-ends: Redis Streams (embedded default) and Kafka (cluster).

The scorer sees a :class:`StreamEngine`: ``read`` new records as a member of a consumer
group, ``claim`` records a dead member read but never acknowledged, ``commit`` scores and
dead letters *then* acknowledge the records they came from, ``lag`` and ``produce``.

* **Redis Streams** (:class:`RedisStreams`): ``XREADGROUP`` (the group is created at the
  stream's start with ``MKSTREAM``, so records produced before the first scorer count),
  ``XPENDING`` and ``XCLAIM`` of entries idle longer than the claim time, one at a time
  with their delivery counts, and ``commit`` as one Lua
  script, which Redis runs atomically: the ``XADD`` of every score and dead letter, then
  the ``XACK`` of their inputs. A killed scorer therefore leaves a
  batch either written and acknowledged, or neither (pending, claimed by the next scorer).
* **Kafka** (:class:`KafkaStreams`, confluent-kafka): a consumer group with auto commit
  off; ``commit`` produces every output (idempotent producer, ``acks=all``), waits for
  each delivery, then commits the next offset of each partition synchronously. A kill
  between the two re-delivers the batch to the partition's next owner (rebalance does
  what claims do for Redis), so outputs may repeat: they are keyed by record id
  and carry the input's position (``source``), so a duplicate is recognisable.

Records are JSON objects: the Redis entry field ``value`` (an optional ``key`` field), the
Kafka message value (the message key is optional). Outputs are JSON too: a Redis entry
``key`` + ``value``, a Kafka message with the record id as key.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import socket
import threading
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from trainyard import native
from trainyard.errors import TrainyardError
from trainyard.fsutil import redact_url

log = logging.getLogger("trainyard.streaming")
_hotpath = native.load("trainyard.streaming._hotpath")


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


def encode_scores(
    keys: list[str],
    sources: list[str],
    scores: list[float],
    classes: list[int | None],
    versions: int | list[int | None],
) -> list[Output]:
    """The output documents ``{id, score, class_id, version, source}``, one per record.

    Formatted directly (a few hundred thousand a second are written), byte for byte what
    ``orjson.dumps`` writes for each document: the scores are formatted by one
    ``orjson.dumps`` of the batch's list (a NaN or infinite score is null).

    Args:
        keys: Record ids.
        sources: Input positions (stream entry ids, ``topic/partition/offset``).
        scores: Per record score (floats).
        classes: Per record class id, or None.
        versions: The model version that scored the batch, or one per record.
    """
    if isinstance(versions, int) and set(map(type, scores)) <= {float}:
        head = b'{"id":%b,"score":%b,"class_id":%b,"version":' + b"%d" % versions
        fmt = head + b',"source":%b}'
        dumps = orjson.dumps
        texts = score_texts(scores)
        return [
            Output(k, fmt % (dumps(k), t, b"null" if c is None else b"%d" % c, dumps(src)))
            for k, src, t, c in zip(keys, sources, texts, classes, strict=True)
        ]
    each = [versions] * len(keys) if isinstance(versions, int) else versions
    return [
        Output.of(k, {"id": k, "score": s, "class_id": c, "version": v, "source": src})
        for k, src, s, c, v in zip(keys, sources, scores, classes, each, strict=True)
    ]


def score_texts(scores: list[float]) -> list[bytes]:
    """Each score as ``orjson.dumps`` writes it (one call for the batch; null if not finite)."""
    return orjson.dumps(scores)[1:-1].split(b",") if scores else []


@dataclass
class Scores:
    """A batch's scores, one row per record, as the scorer hands them to ``commit``.

    The engine encodes them (:meth:`outputs`, or the Redis engine's packer in C, which
    writes the same bytes straight into the commit).

    Attributes:
        keys: Record ids.
        sources: Input positions.
        scores: Per record score.
        classes: Per record class id, or None.
        versions: The model version that scored the batch, or one per record.
    """

    keys: list[str]
    sources: list[str]
    scores: list[float]
    classes: list[int | None]
    versions: int | list[int | None]

    def __len__(self) -> int:
        return len(self.keys)

    def outputs(self) -> list[Output]:
        """The output records (:func:`encode_scores`)."""
        return encode_scores(self.keys, self.sources, self.scores, self.classes, self.versions)


ScoreOutputs = Scores | Sequence[Output]
"""What ``commit`` writes to the output stream: a batch's :class:`Scores` or outputs."""


def outputs_of(scores: ScoreOutputs) -> Sequence[Output]:
    """``scores`` as output records."""
    return scores.outputs() if isinstance(scores, Scores) else scores


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
    def commit(self, scores: ScoreOutputs, dead: Sequence[Output], done: Sequence[Message]):
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


def resp(*args: bytes | str | int) -> bytes:
    """One command in Redis's wire protocol (RESP2 array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(parts)


COMMIT_SCRIPT = b"""
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
COMMIT_SHA = hashlib.sha1(COMMIT_SCRIPT).hexdigest().encode()


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


def _pack_outputs(outputs: Sequence[Output]) -> bytes:
    """Each output's key and value as RESP bulk strings."""
    return b"".join(
        b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(k), k, len(o.value), o.value)
        for k, o in ((o.key.encode(), o) for o in outputs)
    )


def pack_scores(scores: ScoreOutputs) -> tuple[int, bytes]:
    """How many outputs, and their keys and documents as RESP bulk strings.

    A batch scored by one version goes through the C packer when it is built (its scores
    formatted by one ``orjson.dumps``); anything the packer does not take (types other
    than the plain ones) is packed by the Python path, to the same bytes.
    """
    if _hotpath is not None and isinstance(scores, Scores) and isinstance(scores.versions, int):
        s = scores
        if set(map(type, s.scores)) <= {float}:
            texts = orjson.dumps(s.scores)
            packed = _hotpath.scores_resp(s.keys, s.sources, texts, s.classes, s.versions)
            if packed is not None:
                return len(s), packed
    outputs = outputs_of(scores)
    return len(outputs), _pack_outputs(outputs)


class RedisStreams(StreamEngine):
    """Redis Streams through redis-py (hiredis parser)."""

    name = "redis"

    def __init__(
        self,
        url: str,
        streams: Streams,
        consumer: str | None = None,
        socket_timeout_s: float = 30.0,
    ) -> None:
        """Connect and create the consumer group at the input stream's start if missing.

        Raises:
            StreamError: If the server does not answer or refuses the group.
        """
        import redis

        super().__init__(streams, consumer)
        self.url = redact_url(url)  # as messages and logs show it: no password
        self._redis = redis
        try:
            self.r = redis.Redis.from_url(url, socket_timeout=socket_timeout_s, protocol=2)
        except ValueError as e:
            raise StreamError(f"redis URL {self.url!r}: {e}") from None
        self._create_group()
        self._claim_from = "0-0"
        self._local = threading.local()  # each thread's own connection and reply parser
        self._lock = threading.Lock()
        self._conns: list[Any] = []

    def _create_group(self) -> None:
        """The consumer group at the input stream's start (the stream too), unless it exists."""
        redis = self._redis
        group = self.streams.group
        try:
            self.r.xgroup_create(self.streams.input, group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise StreamError(f"redis {self.url}: cannot create group {group}: {e}") from e
        except redis.RedisError as e:
            raise StreamError(f"redis {self.url}: {type(e).__name__}: {e}") from e

    @staticmethod
    def _messages(entries: Any) -> list[Message]:
        out = []
        for entry_id, fields in entries or ():
            if fields is None:  # deleted while pending
                continue
            flat = (
                [x for pair in fields.items() for x in pair] if isinstance(fields, dict) else fields
            )
            out.append(_entry_message(entry_id, flat))
        return out

    def _call(self, command: bytes, entries: bool = False) -> Any:
        """Send one packed command on the engine's own connection; its raw reply.

        With ``entries`` (an ``XREADGROUP``), a reply of plain entries is read straight
        into Messages by the C module and comes back as ``(messages, end)``.

        Raises:
            redis.ResponseError: If Redis answers with an error.
        """
        (reply,) = self._call_many(command, 1, entries)
        if isinstance(reply, Exception):
            raise self._redis.ResponseError(str(reply))
        return reply

    def _read_reply(self, command: bytes) -> Any:
        try:
            return self._call(command, entries=True)
        except self._redis.ResponseError as e:
            if not str(e).startswith("NOGROUP"):
                raise StreamError(f"redis {self.url}: {e}") from None
        # the input stream (and with it the group) was deleted: start again at its start
        log.warning(
            "redis %s: stream %s has no group %s (deleted?): created again at its start",
            self.url, self.streams.input, self.streams.group,
        )  # fmt: skip
        self._create_group()
        return self._call(command, entries=True)

    def read(self, count: int, block_ms: int) -> list[Message]:
        """``XREADGROUP GROUP <g> <me> COUNT n BLOCK ms STREAMS <in> >``."""
        command = resp(
            "XREADGROUP", "GROUP", self.streams.group, self.consumer, "COUNT", count,
            "BLOCK", max(1, block_ms), "STREAMS", self.streams.input, ">",
        )  # fmt: skip
        got = self._read_reply(command)
        if isinstance(got, tuple):  # read by the C module (hiredis gives lists)
            return got[0]
        if not got:
            return []
        out = []
        for entry_id, fields in got[0][1]:
            if len(fields) == 2 and fields[0] == b"value":  # what producers usually write
                out.append(Message(entry_id.decode(), fields[1]))
            elif fields:
                out.append(_entry_message(entry_id, fields))
        return out

    def claim(self, min_idle_ms: int, count: int, skip: Set[str] = frozenset()) -> list[Message]:
        """``XPENDING`` (idle ones, from where the last call stopped), then ``XCLAIM`` of one.

        The first idle entry not in ``skip``, alone: it may be what stopped the scorer
        that read it, and alone it stops only its own scorer. ``XAUTOCLAIM`` would also
        claim what this member has in flight and so count a delivery of it each time: the
        counts must say how many scorers took a record, for :meth:`Scorer._prepare` to
        dead-letter one that stops every scorer. A deleted entry is acknowledged.
        """
        s = self.streams
        try:
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
        except self._redis.RedisError as e:
            raise StreamError(f"redis {self.url}: {type(e).__name__}: {e}") from e
        before = {_s(row["message_id"]): row["times_delivered"] for row in take}
        return [m._replace(deliveries=before[m.id] + 1) for m in self._messages(entries)]

    def release(self, messages: Sequence[Message]) -> None:
        """``XCLAIM ... RETRYCOUNT <deliveries before ours> JUSTID``: this delivery uncounted.

        They stay pending with this member, claimable by the next once idle.
        """
        s = self.streams
        by_count: dict[int, list[str]] = {}
        for m in messages:
            by_count.setdefault((m.deliveries or 1) - 1, []).append(m.id)
        try:
            for count, ids in by_count.items():
                self.r.xclaim(
                    s.input, s.group, self.consumer, 0, ids, retrycount=count, justid=True
                )
        except self._redis.RedisError as e:
            raise StreamError(f"redis {self.url}: {type(e).__name__}: {e}") from e

    def _forget_idle_members(self, min_idle_ms: int) -> None:
        for c in self.r.xinfo_consumers(self.streams.input, self.streams.group):
            name = _s(c["name"])
            if name != self.consumer and c["pending"] == 0 and c["idle"] > min_idle_ms:
                self.r.xgroup_delconsumer(self.streams.input, self.streams.group, name)

    def commit(self, scores: ScoreOutputs, dead: Sequence[Output], done: Sequence[Message]) -> None:
        """One script (:data:`COMMIT_SCRIPT`): ``XADD`` every output, then ``XACK``.

        Redis runs a script as one and writes its effects to the append-only file as one
        transaction (dropped when the file is loaded if a crash cut it short), so a killed
        scorer leaves a batch written and acknowledged, or neither. Unlike ``MULTI``, a
        script stops at the first command that fails: an output key that is not a stream
        is refused before anything is written, and nothing is acknowledged after a
        failed ``XADD``.

        Raises:
            StreamError: If Redis refuses the batch (the records stay pending).
        """
        n_scores, packed = pack_scores(scores)
        self.commit_packed(n_scores, packed, dead, done)

    def commit_packed(
        self, n_scores: int, packed: bytes, dead: Sequence[Output], done: Sequence[Message]
    ) -> None:
        """:meth:`commit` of ``n_scores`` outputs already packed.

        ``packed`` is each output's key and document as RESP bulk strings, as
        :func:`pack_scores` packs them.

        Raises:
            StreamError: If Redis refuses the batch (the records stay pending).
        """
        args = [
            b"3", self.streams.output.encode(), self.streams.dead_letter.encode(),
            self.streams.input.encode(), self.streams.group.encode(),
            b"%d" % n_scores, b"%d" % len(dead),
        ]  # fmt: skip
        ids = [m.id for m in done]
        acks = (
            _hotpath.bulk_strings(ids)
            if _hotpath is not None
            else b"".join(b"$%d\r\n%b\r\n" % (len(i), i) for i in map(str.encode, ids))
        )
        count = 2 + len(args) + 2 * (n_scores + len(dead)) + len(done)
        body = b"".join(
            [*(b"$%d\r\n%b\r\n" % (len(a), a) for a in args), packed, _pack_outputs(dead), acks]
        )
        for verb, script in ((b"EVALSHA", COMMIT_SHA), (b"EVAL", COMMIT_SCRIPT)):
            head = b"*%d\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
                count,
                len(verb),
                verb,
                len(script),
                script,
            )
            (reply,) = self._call_many(head + body, 1)
            if not isinstance(reply, Exception):
                return
            if not str(reply).startswith("NOSCRIPT"):  # else: load it, once per server start
                break
        raise StreamError(f"redis {self.url}: {reply}; the batch stays pending")

    def _call_many(self, commands: bytes, replies: int, entries: bool = False) -> list[Any]:
        """Send packed commands at once and read ``replies`` replies (errors as values).

        The hot path (read, commit) skips redis-py's per-argument packing and per-reply
        parsing, which cost more than Redis itself: the bytes go out on the engine's own
        connection (one per thread: the scorer reads on one while it commits on another)
        and hiredis parses what comes back. With ``entries`` (one ``XREADGROUP``), the C
        module reads a reply of plain entries straight into Messages instead, as
        ``(messages, end)``; anything else it leaves to hiredis. A broken connection is
        dropped and reopened on the next call.
        """
        import hiredis

        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = self.r.connection_pool.get_connection()
            local.reader = hiredis.Reader()
            with self._lock:
                self._conns.append(conn)
        out: list[Any] = []
        try:
            sock = conn._sock
            sock.sendall(commands)
            reader = local.reader
            if entries and _hotpath is not None and not reader.has_data():
                data = bytearray()
                while (got := _hotpath.stream_reply(data, Message)) is None:
                    if not (chunk := sock.recv(1 << 16)):
                        raise ConnectionError(f"redis {self.url}: connection closed")
                    data += chunk
                if got is not False:
                    if got[1] < len(data):  # more than the one reply asked for: keep it
                        reader.feed(bytes(data[got[1] :]))
                    return [got]
                reader.feed(bytes(data))
            while len(out) < replies:
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(1 << 16)
                    if not data:
                        raise ConnectionError(f"redis {self.url}: connection closed")
                    reader.feed(data)
                else:
                    out.append(reply)
        except BaseException as e:
            conn.disconnect()
            self.r.connection_pool.release(conn)
            local.conn = None
            with self._lock:
                self._conns.remove(conn)
            if isinstance(e, OSError | self._redis.RedisError):
                raise StreamError(f"redis {self.url}: {type(e).__name__}: {e}") from e
            raise
        return out

    def lag(self) -> dict[str, int | None]:
        """``lag`` (entries after the group's last delivered id) and ``pending``.

        The entries are counted (:data:`LAG_SCRIPT`) up to :data:`LAG_COUNT_MAX`; beyond
        that Redis's own ``lag`` from ``XINFO GROUPS`` is taken, or the cap (then: at
        least that many) when Redis has none. Redis's figure alone is not enough: a Redis
        restarted from its append-only file has no count until the group next reaches
        the stream's end, and after a SIGKILL it can keep a wrong one.
        """
        for g in self.r.xinfo_groups(self.streams.input):
            if _s(g["name"]) == self.streams.group:
                last = _s(g["last-delivered-id"])
                lag = self.r.eval(LAG_SCRIPT, 1, self.streams.input, last, LAG_COUNT_MAX)
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
        return [_s(i) for i in pipe.execute()]

    def close(self) -> None:
        """Close the connections."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.disconnect()
        self._local = threading.local()
        self.r.close()


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

    def commit(self, scores: ScoreOutputs, dead: Sequence[Output], done: Sequence[Message]) -> None:
        """Produce every output, wait for all deliveries, then commit the inputs' offsets.

        Raises:
            StreamError: If an output was not delivered (nothing is committed then, so the
                records are read again).
        """
        outputs = outputs_of(scores)
        for topic, outs in ((self.streams.output, outputs), (self.streams.dead_letter, dead)):
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
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=self._delivered)
                return
            except BufferError:  # local queue full: let deliveries drain
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
