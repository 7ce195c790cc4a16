"""A slow neighbour never holds the scorer (issue 34): every call out has a total deadline.

A per-read socket timeout let a Redis or model server that answers one byte at a time
hold the scorer for ever. Here a real Redis sits behind a loopback proxy that stops
answering or drips, and the model server is a loopback peer that never answers whole:
each call fails at its deadline, the scorer backs off (the model server) or ends
``failed`` for its supervisor to restart (Redis), and its status file says why.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support.streams import CONTRACT, StallingProxy, make_records, slow_http_server
from trainyard.contracts import parse_contract_text
from trainyard.streaming import redis_server
from trainyard.streaming.engines import Output, RedisStreams, StreamError, Streams
from trainyard.streaming.model_endpoint import ModelEndpoint
from trainyard.streaming.records import RecordChecker
from trainyard.streaming.scorer import Scorer

STREAMS = Streams("bw.in", "bw.out", "bw.dead", "bw-group")


@pytest.fixture(scope="module")
def redis_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("bounded") / "redis"
    redis_server.ensure_running(folder)
    try:
        yield folder
    finally:
        redis_server.stop(folder)


@pytest.fixture
def proxy(redis_dir: Path) -> Iterator[StallingProxy]:
    with StallingProxy(redis_server.socket_path(redis_dir)) as p:
        yield p


def _ends_by(seconds: float, call, match: str) -> None:
    began = time.monotonic()
    with pytest.raises(StreamError, match=match):
        call()
    assert time.monotonic() - began < seconds


@pytest.mark.parametrize("mode", ["silent", "drip"])
def test_each_redis_call_ends_at_its_deadline(proxy: StallingProxy, mode: str) -> None:
    engine = RedisStreams(proxy.url, STREAMS, consumer="c", deadline_s=1.0)
    try:
        engine.r.delete(*STREAMS.__dict__.values())
        engine.produce([(None, b'{"id": "ev-1"}'), (None, b'{"id": "ev-2"}')])
        (first,) = engine.read(1, 10)
        proxy.mode = mode  # every reply from now on: none, or a byte every 0.3 s
        late = r"redis redis://127\.0\.0\.1:\d+/0: TimeoutError: no whole answer within 1 s"
        _ends_by(2.5, lambda: engine.read(10, 10), late)
        out = [Output.of("ev-1", {"id": "ev-1", "score": 0.5})]
        _ends_by(2.5, lambda: engine.commit(out, [], [first]), late)
        _ends_by(2.5, engine.lag, late)
        _ends_by(2.5, lambda: engine.claim(0, 10), late)
        _ends_by(2.5, lambda: RedisStreams(proxy.url, STREAMS, deadline_s=1.0), late)
    finally:
        proxy.mode = "pass"
        engine.close()


def test_a_scorer_whose_redis_stalls_ends_failed_and_says_why(
    proxy: StallingProxy, tmp_path: Path
) -> None:
    """It stops (its supervisor restarts it) instead of waiting for ever."""
    checker = RecordChecker(parse_contract_text(CONTRACT, Path("events.yaml")))
    status = tmp_path / "status.json"
    with slow_http_server(drip=False) as model_port:  # never asked: nothing to score
        scorer = Scorer(
            RedisStreams(proxy.url, STREAMS, consumer="s", deadline_s=1.0),
            checker,
            ModelEndpoint("127.0.0.1", model_port, "events", timeout_s=1.0),
            report_s=0.2,
            status_file=status,
        )
        failed: list[BaseException] = []

        def run() -> None:
            try:
                scorer.run()
            except BaseException as e:
                failed.append(e)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        time.sleep(1.0)  # reading an empty stream, reporting
        assert orjson.loads(status.read_bytes())["state"] == "running"
        proxy.mode = "silent"
        began = time.monotonic()
        runner.join(10)
        assert not runner.is_alive(), "the scorer waited for a silent Redis"
        assert time.monotonic() - began < 4.0
        proxy.mode = "pass"
        scorer.engine.close()
    assert failed and isinstance(failed[0], StreamError)
    doc = orjson.loads(status.read_bytes())
    assert doc["state"] == "failed"
    assert "TimeoutError: no whole answer within 1 s" in doc["error"]


@pytest.mark.parametrize("drip", [False, True], ids=["silent", "dripping"])
def test_a_model_server_that_never_answers_whole_is_retried_and_reported(
    redis_dir: Path, tmp_path: Path, drip: bool
) -> None:
    """Each request ends at its deadline; the scorer backs off, says so, and with
    ``--exit-when-idle`` gives up, its records left pending."""
    url = redis_server.url(redis_dir)
    producer = RedisStreams(url, STREAMS, consumer="producer")
    producer.r.delete(*STREAMS.__dict__.values())
    records, _ = make_records(10)
    producer.produce([(None, v) for v in records])
    checker = RecordChecker(parse_contract_text(CONTRACT, Path("events.yaml")))
    status = tmp_path / "status.json"
    with slow_http_server(drip=drip) as port:
        scorer = Scorer(
            RedisStreams(url, STREAMS, consumer="s"),
            checker,
            ModelEndpoint("127.0.0.1", port, "events", timeout_s=1.0),
            report_s=0.2,
            status_file=status,
        )
        seen: list[dict] = []
        watch = threading.Event()

        def watcher() -> None:
            while not watch.wait(0.1):
                with contextlib.suppress(OSError, orjson.JSONDecodeError):
                    seen.append(orjson.loads(status.read_bytes()))

        threading.Thread(target=watcher, daemon=True).start()
        began = time.monotonic()
        try:
            scorer.run(exit_when_idle_s=3.0)
        finally:
            watch.set()
            scorer.engine.close()
        took = time.monotonic() - began
    assert took < 8.0, took
    metadata = f"http://127.0.0.1:{port}/v1/models/events/labels/stable/metadata"
    late = f"GET {metadata}: no whole answer within 1 s"
    running = [d for d in seen if d.get("state") == "running" and d.get("server") != "ok"]
    assert running and late in running[-1]["server"]  # reported while it retried
    doc = orjson.loads(status.read_bytes())
    assert doc["state"] == "failed" and late in doc["error"]
    assert "nothing read or scored for 3 s (--exit-when-idle)" in doc["error"]
    assert scorer.left_pending == 10
    assert producer.r.xpending(STREAMS.input, STREAMS.group)["pending"] == 10
    producer.r.delete(*STREAMS.__dict__.values())
    producer.close()
