"""Arriving data starts a run: ``trigger.stream`` as an Airflow ``AssetWatcher``.

A pipeline with ``trigger.stream`` is also scheduled on the Asset
``trainyard.arrivals.<pipeline>``, watched by a trigger in Airflow's triggerer. Every
message on the stream becomes one Asset event whose payload carries the interval to stage
(``ds``, or ``interval_start`` and ``interval_end``); the run's ``arrivals`` task picks
one (:func:`claim`) and its ``stage`` task stages it.

* ``engine: redis`` (the embedded default): :class:`RedisStreamTrigger` reads a Redis
  *stream* with a consumer group. A message is acknowledged only after its event was
  handed to the triggerer, so one sent while the triggerer was down starts its run when it
  comes back; the redis provider's ``redis+pubsub`` queue loses such messages and reaches
  Redis over TCP only, while the project's server listens on its Unix socket alone.
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
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from trainyard.config import PipelineConfig, TriggerStreamConfig

log = logging.getLogger("trainyard.orchestration.stream_trigger")

CONSUMER = "airflow-triggerer"
"""The Redis consumer name (one triggerer reads a group; a restarted one reads its pending)."""


class BadMessage(ValueError):
    """A trigger message that names no valid interval (the message says why)."""


def _day(value: str, field: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value[:10])
    except (TypeError, ValueError):
        raise BadMessage(f"{field} {value!r} is not a date (YYYY-MM-DD)") from None


def message_interval(fields: Mapping[str, Any]) -> dict[str, str]:
    """The interval a "new data" message asks to stage.

    Args:
        fields: The message: ``ds``, or ``interval_start`` and ``interval_end`` (ISO dates
            or datetimes), or neither (the run stages its own date). A single ``data`` or
            ``value`` field holding JSON with those keys is read the same way.

    Returns:
        ``{"interval_start": ..., "interval_end": ...}`` as dates, or ``{}``.

    Raises:
        BadMessage: For a field that is not a date, an end before its start, a start
            without an end, or unknown fields.
    """
    fields = {str(k): v for k, v in fields.items()}
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
            "a message holds ds, or interval_start and interval_end"
        )
    if "ds" in fields:
        if len(fields) > 1:
            raise BadMessage("ds and interval_start/interval_end are exclusive")
        day = _day(str(fields["ds"]), "ds").isoformat()
        return {"interval_start": day, "interval_end": day}
    if not fields:
        return {}
    if set(fields) != {"interval_start", "interval_end"}:
        raise BadMessage("interval_start and interval_end go together")
    start = _day(str(fields["interval_start"]), "interval_start")
    end = _day(str(fields["interval_end"]), "interval_end")
    if end < start:
        raise BadMessage(f"interval_end {end} is before interval_start {start}")
    return {"interval_start": start.isoformat(), "interval_end": end.isoformat()}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisStreamTrigger(BaseEventTrigger):
    """One event per message of a Redis stream, read with a consumer group.

    Args:
        stream: The stream's key.
        group: The consumer group (created at the stream's start, so earlier messages count).
        url: The Redis server (default: ``TRAINYARD_REDIS_URL``, else the project's own,
            started if needed).
        poll_interval: Seconds a read blocks waiting for a message.
    """

    def __init__(
        self, stream: str, group: str, url: str | None = None, poll_interval: float = 1.0
    ) -> None:
        super().__init__()
        self.stream, self.group, self.url, self.poll_interval = stream, group, url, poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and arguments (how the triggerer re-creates it)."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream": self.stream,
                "group": self.group,
                "url": self.url,
                "poll_interval": self.poll_interval,
            },
        )

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
        try:
            await client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except Exception as e:  # BUSYGROUP: it exists, which is the usual case
            if "BUSYGROUP" not in str(e):
                await client.aclose()
                raise
        return client

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event per message: this consumer's pending ones first, then new ones."""
        client = await self._connect()
        rejected = f"{self.stream}.rejected"
        try:
            pending = True
            while True:
                reply = await client.xreadgroup(
                    self.group,
                    CONSUMER,
                    {self.stream: "0" if pending else ">"},
                    count=16,
                    block=None if pending else max(int(self.poll_interval * 1000), 1),
                )
                entries = reply[0][1] if reply else []
                if pending and not entries:
                    pending = False
                    continue
                for raw_id, raw_fields in entries:
                    entry_id = _text(raw_id)
                    fields = {_text(k): _text(v) for k, v in (raw_fields or {}).items()}
                    try:
                        interval = message_interval(fields)
                    except BadMessage as e:
                        log.warning("%s %s: %s (copied to %s)", self.stream, entry_id, e, rejected)
                        await client.xadd(rejected, {**fields, "id": entry_id, "reason": str(e)})
                    else:
                        yield TriggerEvent({"stream": self.stream, "id": entry_id, **interval})
                    await client.xack(self.stream, self.group, entry_id)
        finally:
            await client.aclose()


def kafka_message(message: Any) -> dict[str, Any] | None:
    """The Kafka trigger's ``apply_function``: a message's interval, None to skip it.

    Args:
        message: A ``confluent_kafka.Message`` whose value is a JSON object (or empty).

    Returns:
        The event payload (``topic``, ``partition``, ``offset`` and the interval), or None
        (logged) for a message that names no valid interval.
    """
    raw = message.value()
    where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
    try:
        fields = json.loads(raw) if raw else {}
        if not isinstance(fields, dict):
            raise BadMessage(f"{raw!r:.80} is not a JSON object")
        interval = message_interval(fields)
    except (ValueError, TypeError) as e:
        log.warning("%s: %s (skipped)", where, e)
        return None
    return {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        **interval,
    }


def stream_trigger(cfg: PipelineConfig, stream: TriggerStreamConfig) -> BaseEventTrigger:
    """The trigger watching a pipeline's ``trigger.stream``."""
    if stream.engine == "kafka":
        from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

        return MessageQueueTrigger(
            scheme="kafka",
            topics=[stream.name],
            apply_function=f"{__name__}.kafka_message",
            kafka_config_id=stream.kafka_config_id,
            poll_interval=stream.poll_interval_s,
        )
    return RedisStreamTrigger(
        stream.name,
        stream.group or f"trainyard-trigger-{cfg.name}",
        stream.url,
        stream.poll_interval_s,
    )


def arrival_id(payload: Mapping[str, Any]) -> str:
    """A message's identity: its Redis entry id, or Kafka topic:partition:offset."""
    if "topic" in payload:
        return f"{payload['topic']}:{payload['partition']}:{payload['offset']}"
    return str(payload["id"])


def claim(
    state_path: Path, events: list[dict[str, Any]], run_id: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Pick a run's arrival among every announced one no run took yet.

    Airflow hands all events queued since a pipeline's last run to one run, and an event
    registered while the scheduler creates a run may start none (two events 15 ms apart
    were seen to). So each run looks at the Asset's recent events, not only its own: it
    takes the oldest no run has taken and returns the others to be sent back to the stream
    (each then starts a run of its own). What was taken is kept in ``state_path`` (under
    a lock, so two runs never take the same); a retried task gets its earlier pick.

    Args:
        state_path: The pipeline's ``arrivals.json``.
        events: Payloads of the arrivals Asset's recent events, oldest first.
        run_id: This run.

    Returns:
        This run's arrival (None: nothing left) and the ones to send back.
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
        mine = [e for e in events if taken.get(arrival_id(e)) == run_id]
        if mine:
            return mine[0], []
        free = [e for e in events if arrival_id(e) not in taken]
        if not free:
            return None, []
        first, rest = free[0], free[1:]
        taken[arrival_id(first)] = run_id
        for e in rest:
            taken[arrival_id(e)] = f"sent back by {run_id}"
        seen = {arrival_id(e) for e in events}
        state = {"taken": {k: v for k, v in taken.items() if k in seen}}
        atomic_write_json(state_path, state)
        return first, rest


def requeue(stream: TriggerStreamConfig, payloads: list[dict[str, Any]]) -> None:
    """Send arrivals back to the stream as new messages (each then starts a run of its own)."""
    messages = [
        {"interval_start": p["interval_start"], "interval_end": p["interval_end"]} for p in payloads
    ]
    if not messages:
        return
    if stream.engine == "kafka":
        from airflow.providers.apache.kafka.hooks.produce import KafkaProducerHook

        producer = KafkaProducerHook(kafka_config_id=stream.kafka_config_id).get_producer()
        for m in messages:
            producer.produce(stream.name, value=json.dumps(m).encode())
        if producer.flush(30):
            raise RuntimeError(f"kafka topic {stream.name}: arrivals not acknowledged in 30 s")
        return
    import redis

    from trainyard.settings import get_settings
    from trainyard.streaming import redis_server

    url = stream.url or get_settings().redis_url or redis_server.ensure_running()
    client = redis.Redis.from_url(url)
    try:
        for m in messages:
            client.xadd(stream.name, m)
    finally:
        client.close()


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
        if run.run_type != "asset_triggered":
            start, end = run_interval(context)
            return {"arrival": None, "interval_start": start, "interval_end": end}
        recent = context["inlet_events"][asset].ascending(False).limit(RECENT_EVENTS)
        events = [
            e.extra["payload"]
            for e in reversed(list(recent))
            if isinstance((e.extra or {}).get("payload"), dict)
            and e.extra["payload"].get("interval_start")
        ]
        state = Path(Layout(get_settings().volume_root).models(cfg.name)) / "arrivals.json"
        mine, rest = claim(state, events, context["run_id"])
        if rest:
            requeue(stream, rest)
            log.info(
                "%d more announced interval(s) no run took: sent back to %s (%s)",
                len(rest),
                stream.name,
                ", ".join(p["interval_start"] for p in rest),
            )
        if mine is None:
            raise AirflowSkipException(
                f"every interval announced on {stream.name} was taken by another run"
            )
        log.info(
            "staging %s .. %s (message %s on %s)",
            mine["interval_start"],
            mine["interval_end"],
            arrival_id(mine),
            stream.name,
        )
        return {
            "arrival": arrival_id(mine),
            "interval_start": mine["interval_start"],
            "interval_end": mine["interval_end"],
        }

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
