"""``trigger.stream``: a "new data" message starts a run (the trigger on a real Redis server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard.config import ConfigError, parse_pipeline
from trainyard.orchestration.stream_trigger import (
    BadMessage,
    RedisStreamTrigger,
    claim,
    kafka_message,
    message_interval,
    requeue,
)
from trainyard.streaming import redis_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("fields", "interval"),
    [
        ({"ds": "2026-11-20"}, ("2026-11-20", "2026-11-20")),
        ({"interval_start": "2026-11-20T00:00:00+00:00", "interval_end": "2026-11-21"},
         ("2026-11-20", "2026-11-21")),
        ({"data": '{"ds": "2026-11-19"}'}, ("2026-11-19", "2026-11-19")),
        ({}, None),
    ],
)  # fmt: skip
def test_a_message_names_the_interval_to_stage(fields: dict, interval: tuple | None) -> None:
    got = message_interval(fields)
    assert (tuple(got.values()) if got else None) == interval


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"ds": "2026-13-45"}, "ds '2026-13-45' is not a date"),
        ({"ds": "x", "interval_start": "2026-11-20"}, "exclusive"),
        ({"interval_start": "2026-11-20"}, "go together"),
        ({"interval_start": "2026-11-21", "interval_end": "2026-11-20"}, "is before"),
        ({"day": "2026-11-20"}, "unknown field(s) 'day'"),
        ({"data": "not json"}, "is not JSON"),
        ({"data": "[1]"}, "not a JSON object"),
    ],
)
def test_a_bad_message_is_one_clear_error(fields: dict, reason: str) -> None:
    with pytest.raises(BadMessage, match=reason.replace("(", r"\(").replace(")", r"\)")):
        message_interval(fields)


@pytest.fixture
def redis_url(tmp_path: Path):
    url = redis_server.ensure_running(tmp_path / "redis")
    yield url
    redis_server.stop(tmp_path / "redis")


async def _take(trigger: RedisStreamTrigger, n: int) -> list[dict[str, Any]]:
    """The first ``n`` events; the generator is then closed (the last one is not acked)."""
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
    client.xadd("arrivals", {"ds": "not-a-day"})
    client.xadd("arrivals", {"interval_start": "2026-11-21", "interval_end": "2026-11-22"})
    trigger = RedisStreamTrigger("arrivals", "g", redis_url, poll_interval=0.1)
    events = asyncio.run(_take(trigger, 2))
    assert [(e["interval_start"], e["interval_end"]) for e in events] == [
        ("2026-11-20", "2026-11-20"),
        ("2026-11-21", "2026-11-22"),
    ]
    rejected = client.xrange("arrivals.rejected")
    assert len(rejected) == 1 and rejected[0][1][b"reason"].startswith(b"ds 'not-a-day'")

    # the second event was handed over but not acknowledged (its generator was closed):
    # a restarted trigger delivers it again first, then what arrived meanwhile
    client.xadd("arrivals", {"ds": "2026-11-23"})
    again = asyncio.run(_take(RedisStreamTrigger("arrivals", "g", redis_url, 0.1), 2))
    assert [e["interval_start"] for e in again] == ["2026-11-21", "2026-11-23"]
    assert again[0]["id"] == events[1]["id"]
    # another pipeline's group sees every message on its own
    other = asyncio.run(_take(RedisStreamTrigger("arrivals", "g2", redis_url, 0.1), 3))
    assert [e["interval_start"] for e in other] == ["2026-11-20", "2026-11-21", "2026-11-23"]
    # the trigger is re-created from what it serializes
    path, kwargs = trigger.serialize()
    assert path == "trainyard.orchestration.stream_trigger.RedisStreamTrigger"
    assert kwargs == {"stream": "arrivals", "group": "g", "url": redis_url, "poll_interval": 0.1}


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
    state = tmp_path / "arrivals.json"
    day = [{"id": f"1-{i}", **message_interval({"ds": f"2026-11-2{i}"})} for i in range(4)]
    # run A was handed two events; it takes the oldest and sends the other back
    mine, rest = claim(state, day[:2], "A")
    assert (mine, rest) == (day[0], [day[1]])
    requeue(cfg.trigger.stream, rest)
    sent = redis.Redis.from_url(redis_url).xrange("arrivals")
    assert [f[b"interval_start"] for _, f in sent] == [b"2026-11-21"]
    # A's retry gets its own pick again, sending nothing twice
    assert claim(state, day[:2], "A") == (day[0], [])
    # run B sees an event that started no run (Airflow's race): it takes it
    assert claim(state, day[:3], "B") == (day[2], [])
    # run C, started by the sent-back message, takes that one
    assert claim(state, [*day[:3], day[3]], "C") == (day[3], [])
    # a run with nothing left to take gets nothing
    assert claim(state, day, "D") == (None, [])
    taken = json.loads(state.read_text())["taken"]
    assert taken == {"1-0": "A", "1-1": "sent back by A", "1-2": "B", "1-3": "C"}


def test_kafka_trigger_is_common_messagings_and_reads_json_values(tmp_path: Path) -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from trainyard.orchestration.stream_trigger import stream_trigger

    cfg = _pipeline(tmp_path, {"stream": {"engine": "kafka", "name": "lake.digits"}})
    trigger = stream_trigger(cfg, cfg.trigger.stream)
    assert isinstance(trigger, MessageQueueTrigger)
    path, kwargs = trigger.serialize()
    assert path.endswith("kafka.triggers.await_message.AwaitMessageTrigger")
    assert kwargs["topics"] == ["lake.digits"]
    assert kwargs["apply_function"] == "trainyard.orchestration.stream_trigger.kafka_message"

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
    assert got == {"topic": "lake.digits", "partition": 3, "offset": 41,
                   "interval_start": "2026-11-20", "interval_end": "2026-11-20"}  # fmt: skip
    assert kafka_message(Message(b"{broken")) is None


def test_trigger_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trigger\.stream\.name"):
        _pipeline(tmp_path, {"stream": {"name": "bad name!"}})
    with pytest.raises(ConfigError, match="url and group are for engine redis"):
        _pipeline(tmp_path, {"stream": {"engine": "kafka", "name": "t", "group": "g"}})


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
