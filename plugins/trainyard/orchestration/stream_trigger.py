"""Arriving data starts a run: ``trigger.stream`` as an Airflow ``AssetWatcher``.

A pipeline with ``trigger.stream`` is also scheduled on the Asset
``trainyard.arrivals.<pipeline>``, watched by a trigger in Airflow's triggerer. Every
message on the stream becomes one Asset event whose payload carries the interval to stage
(``ds``, or ``interval_start`` and ``interval_end``); the run's ``arrivals`` task picks
one (:func:`claim`) and its ``stage`` task stages it.

* ``engine: redis`` (the embedded default): :class:`RedisStreamTrigger` reads a Redis
  *stream* with a consumer group. A message is acknowledged only by the run that takes it
  (:func:`acknowledge`), so one sent while the triggerer was down starts its run when it
  comes back, and one whose event started no run (the DAG was paused: Airflow records the
  event and queues no run) is handed over again; the redis provider's ``redis+pubsub``
  queue loses such messages and reaches Redis over TCP only, while the project's server
  listens on its Unix socket alone.
* ``engine: kafka`` (a cluster): common-messaging's ``MessageQueueTrigger`` with the Kafka
  provider (``scheme="kafka"``), :func:`kafka_message` as its ``apply_function``.

Each run takes one announced interval no run took yet (:func:`claim`) and sends the
others back to the stream. A message that names no valid interval is not dropped
silently: the Redis trigger copies it with the reason to ``<name>.rejected``; the Kafka
one logs it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from trainyard.config import PipelineConfig, TriggerStreamConfig

log = logging.getLogger("trainyard.orchestration.stream_trigger")

CONSUMER = "airflow-triggerer"
"""The Redis consumer name (one triggerer reads a group; a restarted one reads its pending)."""
MAX_BACKOFF_S = 30.0
"""The longest wait before the trigger reads a failing Redis again."""


class BadMessage(ValueError):
    """A trigger message that names no valid interval (the message says why)."""


_DAY = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def _day(value: Any, field: str) -> dt.date:
    if not isinstance(value, str) or not _DAY.match(value):
        raise BadMessage(f"{field} {value!r} is not a date (YYYY-MM-DD)")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise BadMessage(f"{field} {value!r} is not a date (YYYY-MM-DD)") from None


def message_interval(
    fields: Mapping[str, Any],
    not_before: str | None = None,
    today: dt.date | None = None,
) -> dict[str, str]:
    """The interval a "new data" message asks to stage.

    Args:
        fields: The message: ``ds`` (a day: the interval ``[ds, ds + 1 day)``, as a daily
            scheduled run's), or ``interval_start`` and ``interval_end`` (days, the end
            excluded), or neither (the run stages the day it runs). A single ``data`` or
            ``value`` field holding a JSON object with those keys is read the same way.
            ``arrival`` (a sent-back copy's original message id) is kept apart.
        not_before: The pipeline's ``start_date`` (ISO): earlier days are refused.
        today: Today (UTC); days after it are refused (their data cannot have arrived).

    Returns:
        ``{"interval_start": ..., "interval_end": ...}`` as ISO dates, or ``{}``.

    Raises:
        BadMessage: For a day that is not ``YYYY-MM-DD``, out of range, an end not after
            its start, a start without an end, or unknown fields.
    """
    fields = {str(k): v for k, v in fields.items() if k not in ("arrival", "resent_by")}
    if set(fields) in ({"data"}, {"value"}):
        raw = next(iter(fields.values()))
        try:
            inner = json.loads(raw)
        except (TypeError, ValueError):
            raise BadMessage(f"{raw!r:.80} is not JSON") from None
        if not isinstance(inner, dict):
            raise BadMessage(f"{raw!r:.80} is not a JSON object")
        fields = inner
    unknown = sorted(set(fields) - {"ds", "interval_start", "interval_end"})
    if unknown:
        raise BadMessage(
            f"unknown field(s) {', '.join(map(repr, unknown))}: "
            "a message holds ds, or interval_start and interval_end, or nothing"
        )
    if not fields:
        return {}
    if "ds" in fields:
        if len(fields) > 1:
            raise BadMessage("ds and interval_start/interval_end are exclusive")
        start = end = _day(fields["ds"], "ds")
    elif set(fields) != {"interval_start", "interval_end"}:
        raise BadMessage("interval_start and interval_end go together")
    else:
        start = _day(fields["interval_start"], "interval_start")
        end = _day(fields["interval_end"], "interval_end")
        if end <= start:
            raise BadMessage(
                f"interval_end {end} is not after interval_start {start} (the end is excluded)"
            )
    today = today or dt.datetime.now(dt.UTC).date()
    if start > today:
        raise BadMessage(f"{start} is after today ({today}): its data cannot have arrived")
    if not_before and start < dt.date.fromisoformat(not_before[:10]):
        raise BadMessage(f"{start} is before the pipeline's start_date {not_before[:10]}")
    if "ds" in fields:
        end = start + dt.timedelta(days=1)
    return {"interval_start": start.isoformat(), "interval_end": end.isoformat()}


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Take a left-behind call's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def split_days(arrival: dict[str, Any]) -> list[dict[str, Any]]:
    """An arrival spanning several days as one arrival a day, oldest first.

    For a source partitioned by day (``{ds}`` in its URL, one file a day), a run stages
    one day: the first day keeps the arrival's id, each later day is ``<id>@<day>``.

    Args:
        arrival: ``id``, ``interval_start`` and ``interval_end`` (ISO days, end excluded).
    """
    start = dt.date.fromisoformat(arrival["interval_start"][:10])
    end = dt.date.fromisoformat(arrival["interval_end"][:10])
    out = []
    for n in range((end - start).days or 1):
        day = start + dt.timedelta(days=n)
        out.append(
            {
                **arrival,
                "id": arrival["id"] if n == 0 else f"{arrival['id']}@{day.isoformat()}",
                "interval_start": day.isoformat(),
                "interval_end": (day + dt.timedelta(days=1)).isoformat(),
            }
        )
    return out


def retry_stream(stream: TriggerStreamConfig, pipeline: str) -> str:
    """Where a pipeline's runs send back arrivals they did not take (its own, not shared)."""
    return f"{stream.name}.retry.{pipeline}"


class RedisStreamTrigger(BaseEventTrigger):
    """One event per message of a Redis stream (and the pipeline's retry stream).

    Args:
        stream: The stream's key.
        group: The consumer group (created at the stream's start, so earlier messages count).
        url: The Redis server (default: ``TRAINYARD_REDIS_URL``, else the project's own,
            started if needed).
        poll_interval: Seconds a read blocks waiting for a message.
        retry: The pipeline's retry stream (:func:`retry_stream`), read with the same group.
        not_before: The pipeline's start date: earlier days are rejected.
        redeliver_after: Seconds after which a message handed over that no run acknowledged
            yet (:func:`acknowledge`) is handed over again.
        deadline: Seconds one call to Redis may take (beyond a read's ``poll_interval``;
            default ``trainyard.streaming.redis_client.REDIS_DEADLINE_S``): a server that
            stops answering, or answers a byte at a time, is left, logged, and connected to
            again after a back-off (1 s doubling to :data:`MAX_BACKOFF_S`), for as long as
            it fails.
    """

    def __init__(
        self,
        stream: str,
        group: str,
        url: str | None = None,
        poll_interval: float = 1.0,
        retry: str | None = None,
        not_before: str | None = None,
        redeliver_after: float = 60.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.stream, self.group, self.url, self.poll_interval = stream, group, url, poll_interval
        self.retry, self.not_before, self.redeliver_after = retry, not_before, redeliver_after
        if deadline is None:
            from trainyard.streaming.redis_client import REDIS_DEADLINE_S

            deadline = REDIS_DEADLINE_S
        self.deadline = deadline
        self._failures = 0  # calls failed in a row (the back-off)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and arguments (how the triggerer re-creates it)."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream": self.stream,
                "group": self.group,
                "url": self.url,
                "poll_interval": self.poll_interval,
                "retry": self.retry,
                "not_before": self.not_before,
                "redeliver_after": self.redeliver_after,
                "deadline": self.deadline,
            },
        )

    @property
    def _streams(self) -> list[str]:
        return [self.stream, *([self.retry] if self.retry else [])]

    async def _call(self, call: Awaitable[Any], block_s: float = 0.0) -> Any:
        """``await call``, which must end within :attr:`deadline` (plus ``block_s``).

        The call runs as a task of its own that is waited for, not awaited: at the deadline
        it is cancelled and left behind. A redis-py read that swallowed the cancellation of
        an ``asyncio.timeout`` kept its deadline from firing, and the trigger read for ever.
        """
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.deadline + block_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        task.add_done_callback(_retrieve)
        raise TimeoutError

    async def _connect(self) -> Any:
        import redis.asyncio as aioredis

        url = self.url
        if not url:
            from trainyard.settings import get_settings

            url = get_settings().redis_url
        if not url:
            from trainyard.streaming import redis_server

            url = await asyncio.to_thread(redis_server.ensure_running)
        client = aioredis.from_url(url)
        for key in self._streams:
            try:
                await self._call(client.xgroup_create(key, self.group, id="0", mkstream=True))
            except Exception as e:  # BUSYGROUP: it exists, which is the usual case
                if "BUSYGROUP" not in str(e):
                    await self._close(client)
                    raise
        return client

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event per message: this consumer's pending ones first, then new ones.

        A good message is not acknowledged here but by the run that takes it
        (:func:`acknowledge`): Airflow records an event of a paused DAG's Asset and starts
        no run for it, ever, and the triggerer keeps a paused DAG's trigger running until
        the dag-processor next parses its file. So a message stays pending until a run has
        it; one pending longer than ``redeliver_after`` seconds is handed over again, and
        all of them whenever the trigger starts (the DAG unpaused, the triggerer back).

        A Redis that fails a call (down, refusing, or not answering within
        :attr:`deadline`) is logged and read again after a back-off; nothing is lost
        meanwhile, the messages wait in the stream.
        """
        import redis

        while True:
            try:
                async for event in self._events():
                    yield event
            except (TimeoutError, redis.RedisError, OSError) as e:
                self._failures += 1
                wait = min(2.0 ** (self._failures - 1), MAX_BACKOFF_S)
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if isinstance(e, TimeoutError):
                    why = f"no whole answer within {self.deadline:g} s"
                log.warning("redis stream %s: %s; reading it again in %g s", self.stream, why, wait)
                await asyncio.sleep(wait)

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        """:meth:`run`'s events, on one connection, until a call to Redis fails."""
        client = await self._connect()
        loop = asyncio.get_running_loop()
        try:
            min_idle: float = 0  # at start: every pending one
            every = max(self.redeliver_after / 2, self.poll_interval)
            due = loop.time()
            while True:
                if loop.time() >= due:
                    for key in self._streams:
                        async for event in self._pending(client, key, min_idle):
                            yield event
                    min_idle, due = self.redeliver_after, loop.time() + every
                reply = await self._call(
                    client.xreadgroup(
                        self.group,
                        CONSUMER,
                        {key: ">" for key in self._streams},
                        count=16,
                        block=max(int(self.poll_interval * 1000), 1),
                    ),
                    self.poll_interval,
                )
                self._failures = 0
                for raw_key, entries in reply or []:
                    for raw_id, raw_fields in entries:
                        found = await self._event(client, _text(raw_key), raw_id, raw_fields)
                        if found is not None:
                            yield found
        finally:
            await self._close(client)

    async def _close(self, client: Any) -> None:
        """Close ``client``'s connections, waiting at most :attr:`deadline` (a stuck peer)."""
        try:
            await self._call(client.aclose())
        except (TimeoutError, OSError) as e:
            log.debug("redis stream %s: closing: %r", self.stream, e)

    async def _pending(self, client: Any, key: str, min_idle: float) -> AsyncIterator[TriggerEvent]:
        """Events again for this consumer's entries of ``key`` pending ``min_idle`` s or more.

        ``XAUTOCLAIM`` restarts each one's idle time: the next time is ``redeliver_after``
        later. Entries deleted from the stream meanwhile are acknowledged (nothing to run).
        """
        start = "0-0"
        while True:
            reply = await self._call(
                client.xautoclaim(key, self.group, CONSUMER, int(min_idle * 1000), start, count=64)
            )
            start, entries = _text(reply[0]), reply[1]
            gone = [_text(i) for i in (reply[2] if len(reply) > 2 else [])]
            gone += [_text(i) for i, fields in entries if fields is None]
            if gone:
                await self._call(client.xack(key, self.group, *gone))
            for raw_id, raw_fields in entries:
                if raw_fields is not None:
                    event = await self._event(client, key, raw_id, raw_fields)
                    if event is not None:
                        log.info(
                            "%s %s: no run took it yet, announced again",
                            key,
                            event.payload["entry"]["id"],
                        )
                        yield event
            if start == "0-0":
                return

    async def _event(
        self, client: Any, key: str, raw_id: Any, raw_fields: Mapping[Any, Any] | None
    ) -> TriggerEvent | None:
        """A message's event (left pending), or None for a bad one (copied, acknowledged)."""
        entry_id = _text(raw_id)
        fields = {_text(k): _text(v) for k, v in (raw_fields or {}).items()}
        try:
            interval = message_interval(fields, self.not_before)
        except BadMessage as e:
            rejected = f"{self.stream}.rejected"
            log.warning("%s %s: %s (copied to %s)", key, entry_id, e, rejected)
            copy = {"id": entry_id, "reason": str(e), "message": json.dumps(fields)}
            await self._call(client.xadd(rejected, copy))
            await self._call(client.xack(key, self.group, entry_id))
            return None
        event: dict[str, Any] = {"stream": self.stream, "id": entry_id, **interval}
        if fields.get("arrival"):  # a copy a run sent back
            event["id"], event["resent_by"] = fields["arrival"], fields.get("resent_by", "?")
        event["entry"] = {"stream": key, "id": entry_id, "group": self.group}
        return TriggerEvent(event)


def kafka_message(message: Any, not_before: str | None = None) -> dict[str, Any] | None:
    """The Kafka trigger's ``apply_function``: a message's interval, None to skip it.

    Args:
        message: A ``confluent_kafka.Message`` whose value is a JSON object (or empty).
        not_before: The pipeline's start date: earlier days are refused.

    Returns:
        The event payload (``topic``, ``partition``, ``offset``, ``id`` and the interval),
        or None (logged) for a message that names no valid interval.
    """
    raw = message.value()
    where = f"{message.topic()}:{message.partition()}:{message.offset()}"
    try:
        fields = json.loads(raw) if raw else {}
        if not isinstance(fields, dict):
            raise BadMessage(f"{raw!r:.80} is not a JSON object")
        interval = message_interval(fields, not_before)
    except (ValueError, TypeError) as e:
        log.warning("%s: %s (skipped)", where, e)
        return None
    payload = {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "id": str(fields.get("arrival") or where),
        **interval,
    }
    if fields.get("arrival"):
        payload["resent_by"] = str(fields.get("resent_by") or "?")
    return payload


def stream_trigger(cfg: PipelineConfig, stream: TriggerStreamConfig) -> BaseEventTrigger:
    """The trigger watching a pipeline's ``trigger.stream`` (and its retry stream)."""
    retry = retry_stream(stream, cfg.name)
    if stream.engine == "kafka":
        from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

        return MessageQueueTrigger(
            scheme="kafka",
            topics=[stream.name, retry],
            apply_function=f"{__name__}.kafka_message",
            apply_function_kwargs={"not_before": cfg.start_date.isoformat()},
            kafka_config_id=stream.kafka_config_id or "kafka_default",
            poll_interval=stream.poll_interval_s,
        )
    return RedisStreamTrigger(
        stream.name,
        stream.group or f"trainyard-trigger-{cfg.name}",
        stream.url,
        stream.poll_interval_s,
        retry,
        cfg.start_date.isoformat(),
        stream.redeliver_after_s,
    )


def arrival_id(payload: Mapping[str, Any]) -> str:
    """An arrival's identity: its message's Redis entry id or Kafka topic:partition:offset.

    A sent-back copy keeps its original's, marked with the run that sent it back.
    """
    resent = payload.get("resent_by")
    return f"{payload['id']} (sent back by {resent})" if resent else str(payload["id"])


def claim(
    state_path: Path,
    events: list[dict[str, Any]],
    run_id: str,
    send_back: Callable[[list[dict[str, Any]]], None],
    acknowledge: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any] | None:
    """Pick a run's arrival among every announced one no run took yet.

    Airflow hands all events queued since a pipeline's last run to one run, and an event
    registered while the scheduler creates a run may start none (two events 15 ms apart
    were seen to). So each run looks at the Asset's recent events, not only its own: it
    takes the oldest no run has taken and sends the others back (to the pipeline's retry
    stream: each copy then starts a run of its own). What was taken is kept in
    ``state_path`` under a lock, so two runs never take the same, and only once the others
    were sent back (a failure to send leaves everything to the task's retry); a retried
    task gets its earlier pick. An arrival announced twice (its message handed over again,
    see :meth:`RedisStreamTrigger.run`) counts once.

    Args:
        state_path: The pipeline's ``arrivals.json``.
        events: Payloads of the arrivals Asset's recent events, oldest first.
        run_id: This run.
        send_back: Sends arrivals back (:func:`requeue`).
        acknowledge: Called, once what was taken is recorded, with the events whose
            arrival a run took or that were sent back (:func:`acknowledge`).

    Returns:
        This run's arrival, or None when every one was taken.
    """
    import fcntl

    from trainyard.fsutil import atomic_write_json

    state_path.parent.mkdir(parents=True, exist_ok=True)
    with open(state_path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(state_path.read_text()) if state_path.exists() else {}
        except ValueError:
            state = {}
        taken: dict[str, str] = state.get("taken") or {}

        def done(pick: dict[str, Any] | None) -> dict[str, Any] | None:
            if acknowledge is not None:
                acknowledge([e for e in events if arrival_id(e) in taken])
            return pick

        mine = [e for e in events if taken.get(arrival_id(e)) == run_id]
        if mine:
            return done(mine[0])
        free, announced = [], set(taken)
        for e in events:  # oldest first; an arrival announced again counts once
            if arrival_id(e) not in announced:
                announced.add(arrival_id(e))
                free.append(e)
        if not free:
            return done(None)
        first, rest = free[0], free[1:]
        if rest:
            send_back(rest)
        taken[arrival_id(first)] = run_id
        for e in rest:
            taken[arrival_id(e)] = f"sent back by {run_id}"
        seen = {arrival_id(e) for e in events}
        atomic_write_json(state_path, {"taken": {k: v for k, v in taken.items() if k in seen}})
        return done(first)


def requeue(
    stream: TriggerStreamConfig, pipeline: str, run_id: str, payloads: list[dict[str, Any]]
) -> None:
    """Send arrivals back, to the pipeline's retry stream (each copy then starts a run).

    A copy keeps its original's interval and id (``arrival``) and names the run that sent
    it back (``resent_by``); other pipelines reading the same stream never see it.
    """
    messages = []
    for p in payloads:
        m = {"arrival": str(p["id"]), "resent_by": run_id}
        m.update({k: p[k] for k in ("interval_start", "interval_end") if k in p})
        messages.append(m)
    retry = retry_stream(stream, pipeline)
    if stream.engine == "kafka":
        from airflow.providers.apache.kafka.hooks.produce import KafkaProducerHook

        hook = KafkaProducerHook(kafka_config_id=stream.kafka_config_id or "kafka_default")
        producer = hook.get_producer()
        for m in messages:
            producer.produce(retry, value=json.dumps(m).encode())
        if producer.flush(30):
            raise RuntimeError(f"kafka topic {retry}: arrivals not acknowledged in 30 s")
        return
    with _redis_client(stream) as client:
        for m in messages:
            client.xadd(retry, m, maxlen=100_000, approximate=True)


def acknowledge(stream: TriggerStreamConfig, payloads: list[dict[str, Any]]) -> int:
    """Acknowledge the Redis messages of arrivals a run took or sent back (``XACK``).

    Until then a message stays pending in its trigger's consumer group, and the trigger
    hands it over again (:meth:`RedisStreamTrigger.run`). Events without an ``entry``
    (Kafka's, or an older trainyard's, acknowledged by their trigger) are left alone.

    Args:
        stream: The pipeline's trigger stream (its engine and Redis URL).
        payloads: Payloads of the arrivals' Asset events (their ``entry``).

    Returns:
        How many entries were pending until now.
    """
    entries: dict[tuple[str, str], set[str]] = {}
    for p in payloads:
        entry = p.get("entry")
        if isinstance(entry, dict) and {"stream", "group", "id"} <= set(entry):
            entries.setdefault((str(entry["stream"]), str(entry["group"])), set()).add(
                str(entry["id"])
            )
    if not entries or stream.engine != "redis":
        return 0
    with _redis_client(stream) as client:
        return sum(
            int(client.xack(key, group, *sorted(ids))) for (key, group), ids in entries.items()
        )


@contextmanager
def _redis_client(stream: TriggerStreamConfig) -> Iterator[Any]:
    """A Redis client for ``stream``: its ``url``, else the project's (started if need be).

    Every call ends within ``redis_client.REDIS_DEADLINE_S`` (a silent or dripping server
    raises ``redis.TimeoutError``, and the task's retry takes over).
    """
    from trainyard.settings import get_settings
    from trainyard.streaming import redis_client, redis_server

    url = stream.url or get_settings().redis_url or redis_server.ensure_running()
    client = redis_client.redis_client(url, redis_client.REDIS_DEADLINE_S)
    try:
        yield client
    finally:
        client.close()
        client.connection_pool.disconnect()


RECENT_EVENTS = 500
"""How many of the arrivals Asset's newest events a run looks at for one no run took."""


def arrivals_task(cfg: PipelineConfig, asset: Asset) -> Any:
    """The task that picks this run's interval: an arrival no run took, or the run's own."""
    from airflow.sdk import task
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.layout import Layout
    from trainyard.orchestration.inputs import run_interval
    from trainyard.settings import get_settings

    stream = cfg.trigger.stream
    assert stream is not None

    @task(task_id="arrivals", retries=2, inlets=[asset])
    def pick_arrival(**context: Any) -> dict[str, Any]:
        run = context["dag_run"]
        start, end = run_interval(context, cfg.schedule)
        if run.run_type != "asset_triggered":
            return {"arrival": None, "interval_start": start, "interval_end": end}
        recent = context["inlet_events"][asset].ascending(False).limit(RECENT_EVENTS)
        events = [
            e.extra["payload"]
            for e in reversed(list(recent))
            if isinstance((e.extra or {}).get("payload"), dict) and "id" in e.extra["payload"]
        ]
        run_id = context["run_id"]

        def send_back(rest: list[dict[str, Any]]) -> None:
            requeue(stream, cfg.name, run_id, rest)
            log.info(
                "%d more arrival(s) no run took: sent back to %s (%s)",
                len(rest),
                retry_stream(stream, cfg.name),
                ", ".join(p["id"] for p in rest),
            )

        def ack(resolved: list[dict[str, Any]]) -> None:
            if acked := acknowledge(stream, resolved):
                log.info("acknowledged %d message(s) on %s", acked, stream.name)

        state = Path(Layout(get_settings().volume_root).models(cfg.name)) / "arrivals.json"
        mine = claim(state, events, run_id, send_back, ack)
        if mine is None:
            raise AirflowSkipException(
                f"every arrival announced on {stream.name} was taken by another run"
            )
        if "interval_start" in mine:  # else the message named no day: the day the run runs
            if "{ds}" in cfg.source.url:  # one file a day: a run a day
                days = split_days(mine)
                if len(days) > 1:
                    log.info("%s spans %d days: one run a day", mine["id"], len(days))
                    send_back(days[1:])
                mine = days[0]
            start, end = mine["interval_start"], mine["interval_end"]
        log.info("staging %s .. %s (message %s on %s)", start, end, mine["id"], stream.name)
        return {"arrival": mine["id"], "interval_start": start, "interval_end": end}

    return pick_arrival()


def arrivals_asset(cfg: PipelineConfig) -> Asset | None:
    """The Asset whose watcher starts a run per message (None without ``trigger.stream``).

    The schedule and the ``arrivals`` task's inlet both name it with its watcher: Airflow
    keeps one definition per Asset, and one without the watcher would drop it.
    """
    stream = cfg.trigger.stream
    if stream is None:
        return None
    watchers = [
        AssetWatcher(name=f"trainyard_{cfg.name}_arrivals", trigger=stream_trigger(cfg, stream))
    ]
    return Asset(
        name=f"trainyard.arrivals.{cfg.name}",
        uri=f"trainyard-stream://{stream.engine}/{stream.name}",
        group="trainyard-arrivals",
        watchers=watchers,
    )
