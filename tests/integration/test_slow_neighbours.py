"""A slow neighbour never holds trainyard: every call out has a total deadline.

A model port that answered one byte every 0.3 s made each plugin page view hang, and 50
views froze Airflow's API server; a dripping MLflow held ``register`` (and the mirror lock)
until the task's 30-minute timeout. Real servers on loopback drip or stay silent here.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.streams import slow_http_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["dripping", "silent"])
def slow_port(request: pytest.FixtureRequest) -> Iterator[int]:
    with slow_http_server(drip=request.param == "dripping") as port:
        yield port


def test_the_serving_client_gives_up_at_its_deadline(slow_port: int) -> None:
    from trainyard.serving.client import ServingClient

    began = time.monotonic()
    with pytest.raises(TimeoutError, match="no whole answer within 1 s"):
        ServingClient("127.0.0.1", slow_port, timeout=1.0).status("digits")
    assert time.monotonic() - began < 2.0


def test_the_deadline_is_named_whichever_timer_fires_first(monkeypatch) -> None:
    # found under load (three xdist workers): the socket's own timeout fired before the
    # watchdog's, and the stream scorer reported a bare "TimeoutError: timed out"
    from trainyard.serving.client import ServingClient

    late = ServingClient._expire
    monkeypatch.setattr(ServingClient, "_expire", lambda self, e: (time.sleep(1.5), late(self, e)))
    with slow_http_server(drip=False) as port:
        url = f"http://127.0.0.1:{port}/v1/models/digits"
        with pytest.raises(TimeoutError, match=f"^GET {url}: no whole answer within 1 s$"):
            ServingClient("127.0.0.1", port, timeout=1.0).status("digits")


def test_fifty_page_views_of_a_slow_model_server_end_at_once(
    slow_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.serving.status import server_answer

    raw = yaml.safe_load((ROOT / "dags" / "pipelines" / "digits.yaml").read_text())
    raw["serving"]["port"] = slow_port
    (tmp_path / "digits.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("TRAINYARD_PIPELINES_DIR", str(tmp_path))
    monkeypatch.delenv("TRAINYARD_RUNNER", raising=False)
    began = time.monotonic()
    with cf.ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: server_answer("digits"), range(50)))
    assert time.monotonic() - began < 3.0
    assert all("error" in (a or {"error": "no answer yet"}) for a in answers)


def test_a_dripping_tracker_leaves_the_step_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.config import TrackingConfig, load_pipeline
    from trainyard.registry import Registry
    from trainyard.tracking import mirror

    with slow_http_server(drip=True) as port:
        monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_SLOW", f"http://127.0.0.1:{port}")
        tracking = TrackingConfig(backend="mlflow", conn_id="mlflow_slow", deadline_s=2)
        cfg = load_pipeline("digits").model_copy(update={"tracking": tracking})
        began = time.monotonic()
        assert mirror(cfg, Registry(tmp_path / "_models", "digits")) is None
        assert time.monotonic() - began < 4.0


def test_openlineage_http_ends_at_its_deadline_then_skips_the_endpoint(slow_port: int) -> None:
    """``"type": "http"`` built as the provider builds it: the first emit ends at its
    total deadline, the next ones fail at once while the endpoint is marked down."""
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    from trainyard.orchestration import lineage_transport

    lineage_transport.install()
    url = f"http://127.0.0.1:{slow_port}"
    lineage_transport._down_marker(url).unlink(missing_ok=True)
    client = OpenLineageClient(config={"transport": {"type": "http", "url": url, "timeout": 1}})
    assert isinstance(client.transport, lineage_transport.DeadlineHttpTransport)
    event = RunEvent(
        eventType=RunState.START,
        eventTime="2026-11-28T00:00:00+00:00",
        run=Run(runId="0190e2b5-8f3a-7c4e-9a41-5b8f0f3c2d11"),
        job=Job(namespace="trainyard", name="slow"),
        producer="https://example.invalid/trainyard",
    )
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="did not finish within 1 s"):
            client.transport.emit(event)
        assert time.monotonic() - began < 2.0
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="missed its deadline"):
            client.transport.emit(event)
        assert time.monotonic() - began < 0.2
    finally:
        lineage_transport._down_marker(url).unlink(missing_ok=True)
