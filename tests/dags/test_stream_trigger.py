"""``trigger.stream``: a "new data" message starts a run (the trigger on a real Redis server)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard.config import ConfigError, parse_pipeline
from trainyard.orchestration.stream_trigger import (
    BadMessage,
    RedisStreamTrigger,
    acknowledge,
    claim,
    kafka_message,
    message_interval,
    requeue,
    split_days,
    stream_trigger,
)
from trainyard.streaming import redis_server

ROOT = Path(__file__).resolve().parents[2]


TODAY = dt.date(2026, 11, 25)


@pytest.mark.parametrize(
    ("fields", "interval"),
    [
        # a day is the interval of a daily scheduled run of that day: the end is excluded
        ({"ds": "2026-11-20"}, ("2026-11-20", "2026-11-21")),
        ({"interval_start": "2026-11-20", "interval_end": "2026-11-23"},
         ("2026-11-20", "2026-11-23")),
        ({"data": '{"ds": "2026-11-19"}'}, ("2026-11-19", "2026-11-20")),
        ({"ds": "2026-11-25"}, ("2026-11-25", "2026-11-26")),  # today
        ({}, None),
        ({"data": "{}"}, None),  # the day the run runs
        ({"arrival": "1-0", "resent_by": "r", "ds": "2026-11-20"}, ("2026-11-20", "2026-11-21")),
    ],
)  # fmt: skip
def test_a_message_names_the_interval_to_stage(fields: dict, interval: tuple | None) -> None:
    got = message_interval(fields, "2026-11-01", TODAY)
    assert (tuple(got.values()) if got else None) == interval


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"ds": "2026-13-45"}, "ds '2026-13-45' is not a date (YYYY-MM-DD)"),
        # found by a new user: the first 10 characters were read and the rest dropped
        ({"ds": "2026-11-24garbage"}, "is not a date"),
        ({"ds": "20261124"}, "is not a date"),
        ({"ds": "2026-11-24T00:00:00"}, "is not a date"),
        ({"data": '{"ds": 20261113}'}, "ds 20261113 is not a date"),
        # ... and any day was staged, 9999-12-31 included
        ({"ds": "9999-12-31"}, "after today (2026-11-25): its data cannot have arrived"),
        ({"ds": "2026-10-31"}, "before the pipeline's start_date 2026-11-01"),
        ({"ds": "x", "interval_start": "2026-11-20"}, "exclusive"),
        ({"interval_start": "2026-11-20"}, "go together"),
        ({"interval_start": "2026-11-21", "interval_end": "2026-11-21"}, "is not after"),
        ({"day": "2026-11-20"}, "unknown field(s) 'day'"),
        ({"data": "not json"}, "is not JSON"),
        ({"data": "[1]"}, "not a JSON object"),
    ],
)
def test_a_bad_message_is_one_clear_error(fields: dict, reason: str) -> None:
    with pytest.raises(BadMessage, match=re.escape(reason)):
        message_interval(fields, "2026-11-01", TODAY)


async def _take(trigger: RedisStreamTrigger, n: int) -> list[dict[str, Any]]:
    """The first ``n`` events; the generator is then closed (none is acknowledged)."""
    events = []
    gen = trigger.run()
    try:
        async for event in gen:
            events.append(event.payload)
            if len(events) == n:
                break
    finally:
        await gen.aclose()
    return events


def test_redis_trigger_fires_per_message_and_rejects_bad_ones_loudly(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.xadd("arrivals", {"ds": "2026-11-20"})
    client.xadd("arrivals", {"ds": "not-a-day", "reason": "hello", "id": "42"})
    client.xadd("arrivals", {"interval_start": "2026-11-21", "interval_end": "2026-11-23"})
    trigger = RedisStreamTrigger("arrivals", "g", redis_url, 0.1, "arrivals.retry.p")
    events = asyncio.run(_take(trigger, 2))
    assert [(e["interval_start"], e["interval_end"]) for e in events] == [
        ("2026-11-20", "2026-11-21"),
        ("2026-11-21", "2026-11-23"),
    ]
    rejected = client.xrange("arrivals.rejected")
    assert len(rejected) == 1
    fields = rejected[0][1]
    assert fields[b"reason"].startswith(b"unknown field(s) 'id', 'reason'")
    # the sender's own fields are kept whole (found by a new user: id and reason were lost)
    assert json.loads(fields[b"message"]) == {"ds": "not-a-day", "reason": "hello", "id": "42"}

    # a good message is acknowledged by the run that takes it, not by the trigger: until
    # then a restarted trigger hands it over again first, then what arrived meanwhile
    assert client.xpending("arrivals", "g")["pending"] == 2
    client.xadd("arrivals", {"ds": "2026-11-23"})
    again = asyncio.run(
        _take(RedisStreamTrigger("arrivals", "g", redis_url, 0.1, "arrivals.retry.p"), 3)
    )
    assert [e["interval_start"] for e in again] == ["2026-11-20", "2026-11-21", "2026-11-23"]
    assert [e["id"] for e in again[:2]] == [e["id"] for e in events]
    assert again[0]["entry"] == {"stream": "arrivals", "id": events[0]["id"], "group": "g"}
    # another pipeline's group sees every message on its own
    other = asyncio.run(_take(RedisStreamTrigger("arrivals", "g2", redis_url, 0.1), 3))
    assert [e["interval_start"] for e in other] == ["2026-11-20", "2026-11-21", "2026-11-23"]
    # the trigger is re-created from what it serializes
    path, kwargs = trigger.serialize()
    assert path == "trainyard.orchestration.stream_trigger.RedisStreamTrigger"
    assert kwargs == {"stream": "arrivals", "group": "g", "url": redis_url, "poll_interval": 0.1,
                      "retry": "arrivals.retry.p", "not_before": None,
                      "redeliver_after": 60.0, "deadline": 10.0}  # fmt: skip


def _pipeline(tmp_path: Path, trigger: dict[str, Any], **more: Any) -> Any:
    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    raw.update(trigger=trigger, **more)
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(raw))
    return parse_pipeline(path)


def test_each_run_takes_one_arrival_no_run_took_and_sends_the_rest_back(
    redis_url: str, tmp_path: Path
) -> None:
    import redis

    cfg = _pipeline(tmp_path, {"stream": {"name": "arrivals", "url": redis_url}})
    stream = cfg.trigger.stream
    state = tmp_path / "arrivals.json"
    day = [{"id": f"1-{i}", **message_interval({"ds": f"2026-11-2{i}"})} for i in range(3)]
    sent: list[list[dict]] = []

    def keep(rest: list[dict]) -> None:
        sent.append(rest)
        requeue(stream, "digits", "A", rest)

    # run A was handed two events; it takes the oldest and sends the other back
    assert claim(state, day[:2], "A", keep) == day[0]
    assert sent == [[day[1]]]
    # to the pipeline's own retry stream (other pipelines on "arrivals" never see it),
    # keeping the original's id; the trigger reads it back as a new arrival
    assert redis.Redis.from_url(redis_url).xlen("arrivals") == 0
    trigger = stream_trigger(cfg, stream)
    (copy,) = asyncio.run(_take(trigger, 1))
    assert {k: v for k, v in copy.items() if k != "entry"} == {
        "stream": "arrivals", "id": "1-1", "resent_by": "A",
        "interval_start": "2026-11-21", "interval_end": "2026-11-22"}  # fmt: skip
    assert copy["entry"]["stream"] == "arrivals.retry.digits"
    # A's retry gets its own pick again, sending nothing twice
    assert claim(state, day[:2], "A", keep) == day[0] and len(sent) == 1
    # run B sees an event that started no run (Airflow's race): it takes it
    assert claim(state, day, "B", keep) == day[2]
    # run C, started by the copy A sent back, takes it
    assert claim(state, [*day, copy], "C", keep) == copy
    # a run with nothing left to take gets nothing
    assert claim(state, [*day, copy], "D", keep) is None

    # a failure to send back leaves nothing marked: the task's retry sends again
    def broken(rest: list[dict]) -> None:
        raise ConnectionError("redis down")

    more = [{"id": f"2-{i}", **message_interval({"ds": f"2026-11-1{i}"})} for i in range(2)]
    with pytest.raises(ConnectionError):
        claim(state, more, "E", broken)
    assert claim(state, more, "E", keep) == more[0] and sent[-1] == [more[1]]


def test_kafka_trigger_is_common_messagings_and_reads_json_values(tmp_path: Path) -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from trainyard.orchestration.stream_trigger import stream_trigger

    cfg = _pipeline(tmp_path, {"stream": {"engine": "kafka", "name": "lake.digits"}})
    trigger = stream_trigger(cfg, cfg.trigger.stream)
    assert isinstance(trigger, MessageQueueTrigger)
    path, kwargs = trigger.serialize()
    assert path.endswith("kafka.triggers.await_message.AwaitMessageTrigger")
    assert kwargs["topics"] == ["lake.digits", "lake.digits.retry.digits"]
    assert kwargs["apply_function"] == "trainyard.orchestration.stream_trigger.kafka_message"
    assert kwargs["apply_function_kwargs"] == {"not_before": cfg.start_date.isoformat()}

    class Message:
        def __init__(self, value: bytes | None) -> None:
            self._value = value

        def value(self) -> bytes | None:
            return self._value

        def topic(self) -> str:
            return "lake.digits"

        def partition(self) -> int:
            return 3

        def offset(self) -> int:
            return 41

    got = kafka_message(Message(json.dumps({"ds": "2026-11-20"}).encode()))
    assert got == {"topic": "lake.digits", "partition": 3, "offset": 41, "id": "lake.digits:3:41",
                   "interval_start": "2026-11-20", "interval_end": "2026-11-21"}  # fmt: skip
    assert kafka_message(Message(b"{broken")) is None


def test_trigger_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trigger\.stream\.name"):
        _pipeline(tmp_path, {"stream": {"name": "bad name!"}})
    with pytest.raises(ConfigError, match="url and group are for engine redis"):
        _pipeline(tmp_path, {"stream": {"engine": "kafka", "name": "t", "group": "g"}})
    # found by a new user: these were accepted
    with pytest.raises(ConfigError, match="'http://x' is not a Redis URL"):
        _pipeline(tmp_path, {"stream": {"name": "t", "url": "http://x"}})
    with pytest.raises(ConfigError, match="kafka_config_id is for engine kafka"):
        _pipeline(tmp_path, {"stream": {"name": "t", "kafka_config_id": "k"}})
    with pytest.raises(ConfigError, match="kafka_config_id"):
        _pipeline(tmp_path, {"stream": {"engine": "kafka", "name": "t", "kafka_config_id": ""}})
    with pytest.raises(ConfigError, match="poll_interval_s"):
        _pipeline(tmp_path, {"stream": {"name": "t", "poll_interval_s": float("nan")}})
    with pytest.raises(ConfigError, match="redeliver_after_s is for engine redis"):
        _pipeline(tmp_path, {"stream": {"engine": "kafka", "name": "t", "redeliver_after_s": 5}})


def test_the_dag_is_scheduled_on_the_watched_asset_or_its_cron(tmp_path: Path) -> None:
    from airflow.sdk import AssetAny
    from airflow.serialization.serialized_objects import DagSerialization

    from trainyard.orchestration.graph import build_dag
    from trainyard.settings import get_settings

    cfg = _pipeline(
        tmp_path, {"stream": {"name": "arrivals"}}, schedule="0 2 * * *", trigger_on_dataset=True
    )
    dag = build_dag(cfg, get_settings())
    assets = dag.timetable.asset_condition
    assert isinstance(assets, AssetAny)
    names = sorted(a.name for a in assets.objects)
    assert names == ["trainyard.arrivals.digits", "trainyard.dataset.digits"]
    watched = next(a for a in assets.objects if a.name == "trainyard.arrivals.digits")
    assert [w.name for w in watched.watchers] == ["trainyard_digits_arrivals"]
    assert "arrivals" in dag.task_dict and "stage" in dag.task_dict["arrivals"].downstream_task_ids
    # what the dag-processor records: the Asset keeps its watcher (an inlet naming the same
    # Asset without it once left "0 watchers currently running" in the triggerer)
    from airflow.dag_processing.collection import AssetModelOperation
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    lazy = LazyDeserializedDAG(data=DagSerialization.to_dict(dag))
    collected = AssetModelOperation.collect({dag.dag_id: lazy}).assets
    arrivals = next(a for (name, _), a in collected.items() if name.startswith("trainyard.arr"))
    assert len(arrivals.watchers) == 1


def test_a_multi_day_arrival_becomes_one_run_a_day(redis_url: str, tmp_path: Path) -> None:
    """For a source with one file a day, days after the first go back as arrivals of their own.

    (A cold user's arrival of 2026-11-18..2026-11-20 staged 2026-11-18 alone.)
    """
    span = {"interval_start": "2026-11-18", "interval_end": "2026-11-21"}
    arrival = {"id": "9-0", **message_interval(span, None, TODAY)}
    days = split_days(arrival)
    assert [(d["id"], d["interval_start"], d["interval_end"]) for d in days] == [
        ("9-0", "2026-11-18", "2026-11-19"),
        ("9-0@2026-11-19", "2026-11-19", "2026-11-20"),
        ("9-0@2026-11-20", "2026-11-20", "2026-11-21"),
    ]
    one = {"id": "9-1", **message_interval({"ds": "2026-11-18"}, None, TODAY)}
    assert split_days(one) == [one]

    cfg = _pipeline(tmp_path, {"stream": {"name": "arrivals", "url": redis_url}})
    requeue(cfg.trigger.stream, "digits", "A", days[1:])
    copies = asyncio.run(_take(stream_trigger(cfg, cfg.trigger.stream), 2))
    assert [(c["id"], c["interval_start"]) for c in copies] == [
        ("9-0@2026-11-19", "2026-11-19"),
        ("9-0@2026-11-20", "2026-11-20"),
    ]


def test_a_message_no_run_took_is_announced_again_until_a_run_takes_it(
    redis_url: str, tmp_path: Path
) -> None:
    """Found by a new user: messages sent just after ``airflow dags pause`` never ran.

    The triggerer runs a paused DAG's trigger until the dag-processor next parses its file,
    and Airflow records the events of a paused DAG's Asset without queueing a run, then or
    at the unpause. The trigger acknowledged each message once handed over (pending 0), so
    nothing ran until an unrelated message came. Now a message stays pending until a run
    takes it (``claim`` acknowledges it), and one still pending after
    ``redeliver_after_s`` is announced again by the same, still running trigger.
    """
    import redis

    cfg = _pipeline(
        tmp_path,
        {"stream": {"name": "arrivals", "url": redis_url, "poll_interval_s": 0.1,
                    "redeliver_after_s": 0.5}},
    )  # fmt: skip
    stream = cfg.trigger.stream
    client = redis.Redis.from_url(redis_url)
    first = client.xadd("arrivals", {"ds": "2026-11-19"}).decode()
    second = client.xadd("arrivals", {"ds": "2026-11-19"}).decode()  # sent twice

    # events while the DAG is paused start no run: the trigger announces both again
    events = asyncio.run(_take(stream_trigger(cfg, stream), 4))
    assert [e["id"] for e in events] == [first, second, first, second]
    assert client.xpending("arrivals", "trainyard-trigger-digits")["pending"] == 2

    # the run started after the unpause sees all four: each arrival counts once
    sent: list[list[str]] = []

    def keep(rest: list[dict]) -> None:
        sent.append([e["id"] for e in rest])
        requeue(stream, "digits", "A", rest)

    state = tmp_path / "arrivals.json"
    acks = []

    def ack(resolved: list[dict]) -> None:
        acks.append(acknowledge(stream, resolved))

    assert claim(state, events, "A", keep, ack)["id"] == first
    assert sent == [[second]] and acks == [2]
    assert client.xpending("arrivals", "trainyard-trigger-digits")["pending"] == 0
    # what was taken is not announced again; the copy sent back is, once, until taken
    copies = asyncio.run(_take(stream_trigger(cfg, stream), 2))
    assert [(c["id"], c.get("resent_by")) for c in copies] == [(second, "A")] * 2
    assert claim(state, [*events, *copies], "B", keep, ack) == copies[0]
    assert sent == [[second]] and acks == [2, 1]
    assert client.xpending("arrivals.retry.digits", "trainyard-trigger-digits")["pending"] == 0
    # a retried task gets its pick again and acknowledges nothing twice
    assert claim(state, [*events, *copies], "B", keep, ack) == copies[0] and acks[-1] == 0
    client.close()


@pytest.mark.parametrize("mode", ["silent", "drip"])
def test_the_redis_trigger_outlives_a_redis_that_stops_answering(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34: a Redis that answered nothing, or a byte at a time, held the trigger's read
    for ever. Each call now has a deadline: the trigger logs it, backs off, reads again, and
    the messages sent meanwhile start their runs once Redis answers."""
    import redis

    from tests.support.streams import StallingProxy

    redis_dir = tmp_path / "redis"
    url = redis_server.ensure_running(redis_dir)
    client = redis.Redis.from_url(url)
    first = client.xadd("arrivals", {"ds": "2026-11-19"}).decode()
    try:
        with StallingProxy(redis_server.socket_path(redis_dir)) as proxy:
            trigger = RedisStreamTrigger("arrivals", "g", proxy.url, 0.1, deadline=1.0)
            assert trigger.serialize()[1]["deadline"] == 1.0

            async def watch() -> list[str]:
                ids: list[str] = []

                async def collect() -> None:
                    async for event in trigger.run():
                        ids.append(event.payload["id"])

                task = asyncio.create_task(collect())
                try:
                    while not ids:
                        await asyncio.sleep(0.05)
                    proxy.mode = mode  # Redis stops answering whole
                    second = client.xadd("arrivals", {"ds": "2026-11-20"}).decode()
                    await asyncio.sleep(2.5)  # a read fails at its deadline, then again
                    assert second not in ids
                    proxy.mode = "pass"
                    async with asyncio.timeout(15):
                        while second not in ids:
                            await asyncio.sleep(0.05)
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                return ids

            with caplog.at_level("WARNING", "trainyard.orchestration.stream_trigger"):
                ids = asyncio.run(watch())
        # the first is announced again (still pending: no run took it), then the second
        assert ids[0] == first and ids[-1] != first and set(ids[1:-1]) <= {first}
        warned = [r.getMessage() for r in caplog.records]
        assert any(
            "redis stream arrivals: no whole answer within 1 s; reading it again in 1 s" in w
            for w in warned
        ), warned
    finally:
        client.close()
        redis_server.stop(redis_dir)


def test_a_call_that_swallows_its_cancellation_still_ends_at_the_deadline() -> None:
    """The silent-Redis test above once hung for its 600 s: the trigger's read had passed
    its ``asyncio.timeout``, whose cancellation redis-py's read swallowed, so the read went
    on with no deadline left. A call that swallows cancellations (for 3 s here) must still
    end the trigger's wait at its deadline, and be cancelled, not awaited, there."""
    import time

    swallowed: list[float] = []

    async def stubborn() -> str:
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                await asyncio.sleep(end - time.monotonic())
            except asyncio.CancelledError:
                swallowed.append(time.monotonic())
        return "answered late"

    async def call() -> float:
        trigger = RedisStreamTrigger("arrivals", "g", "redis://127.0.0.1:1/0", 0.1, deadline=0.2)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await trigger._call(stubborn())
        return time.monotonic() - start

    took = asyncio.run(call())
    assert took < 1.0 and swallowed, (took, swallowed)


def test_a_run_acknowledging_on_a_silent_redis_fails_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``arrivals`` task's acknowledge and send-back calls end; the task's retry goes on."""
    import time

    import redis

    from tests.support.streams import StallingProxy
    from trainyard.streaming import redis_client

    redis_dir = tmp_path / "redis"
    redis_server.ensure_running(redis_dir)
    monkeypatch.setattr(redis_client, "REDIS_DEADLINE_S", 1.0)
    try:
        with StallingProxy(redis_server.socket_path(redis_dir)) as proxy:
            cfg = _pipeline(tmp_path, {"stream": {"name": "arrivals", "url": proxy.url}})
            stream = cfg.trigger.stream
            proxy.mode = "silent"
            entry = {"stream": "arrivals", "group": "g", "id": "1-0"}
            for call in (
                lambda: acknowledge(stream, [{"id": "1-0", "entry": entry}]),
                lambda: requeue(stream, "digits", "A", [{"id": "1-0", "ds": "2026-11-19"}]),
            ):
                began = time.monotonic()
                with pytest.raises(redis.TimeoutError, match="no whole answer within 1 s"):
                    call()
                assert time.monotonic() - began < 2.5
    finally:
        redis_server.stop(redis_dir)
