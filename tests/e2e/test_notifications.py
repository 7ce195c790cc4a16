"""``notify:`` e-mails a promotion, a gate rejection and a failure, through a real SMTP server.

aiosmtpd listens on loopback; the pipeline's Airflow connection (``AIRFLOW_CONN_...``)
points Airflow's ``SmtpNotifier`` at it; three ``airflow dags test`` runs of a dataset the
project does not ship (breast cancer, one CSV per day) end in each outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.daily_csv import pipeline as pipeline_dict
from tests.support.daily_csv import use_contracts, write_days
from tests.support.harness import Inbox, Project, init_airflow, make_project
from tests.support.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAYS = ["2026-11-01", "2026-11-02"]
TO = ["ml-team@example.com", "oncall@example.com"]


@pytest.fixture(scope="module")
def inbox() -> Iterator[tuple[Inbox, int]]:
    from aiosmtpd.controller import Controller

    box, port = Inbox(), free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    yield box, port
    controller.stop()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, inbox: tuple[Inbox, int]) -> Project:
    tmp = tmp_path_factory.mktemp("notify")
    proj = make_project(tmp)
    raw = tmp / "raw"
    write_days(raw, DAYS[:1])  # the second day's file never arrives
    proj.raw = raw  # type: ignore[attr-defined]
    use_contracts(proj.env, tmp / "contracts")
    proj.env["AIRFLOW_CONN_SMTP_TEST"] = json.dumps(
        {
            "conn_type": "smtp",
            "host": "127.0.0.1",
            "port": inbox[1],
            "extra": {"disable_ssl": True, "disable_tls": True, "timeout": 10},
        }
    )
    _write(proj, accuracy_min=0.5)
    init_airflow(proj)
    yield proj
    proj.stop_server()


def _write(project: Project, accuracy_min: float, fail_run_on_reject: bool = False) -> None:
    # a candidate that exists to be rejected (accuracy >= 0.9999) trains no epoch
    epochs = 0 if accuracy_min > 0.99 else 2
    cfg = pipeline_dict(
        project.raw,  # type: ignore[attr-defined]
        training={"epochs": epochs, "workers": 1},
        gate={
            "metrics": ["accuracy", "loss"],
            "thresholds": {"accuracy": {"min": accuracy_min}},
            "fail_run_on_reject": fail_run_on_reject,
        },
        serving={"model_name": "cancer", "port": project.port},
        notify={"email": TO, "smtp_conn_id": "smtp_test", "from_email": "trainyard@example.com"},
    )
    (project.home / "pipelines" / "cancer.yaml").write_text(yaml.safe_dump(cfg))


def _run(project: Project, day: str) -> Any:
    nxt = f"2026-11-{int(day[-2:]) + 1:02d}T03:00:00+00:00"
    return project.airflow("dags", "test", "trainyard_cancer", nxt)


def test_a_promotion_is_mailed_with_the_served_version_and_metrics(project, inbox) -> None:
    box, _ = inbox
    out = _run(project, DAYS[0])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert box.subjects() == ["[trainyard] cancer: version 1 promoted and served"]
    assert sorted(box.recipients[0]) == sorted(TO)
    assert str(box.messages[0]["From"]) == "trainyard@example.com"
    body = box.body(0)
    assert "accuracy" in body and f":{project.port}/v1/models/cancer" in body


def test_a_gate_rejection_is_mailed_with_the_reason(project, inbox) -> None:
    box, _ = inbox
    _write(project, accuracy_min=0.9999)
    out = _run(project, DAYS[0])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert box.subjects()[1:] == ["[trainyard] cancer: gate rejected version 2"]
    body = box.body(1)
    assert "threshold:accuracy" in body and "&gt;= 0.9999" in body, body
    assert "champion" in body  # side by side with the champion's metrics


def test_a_failure_is_mailed_with_the_task_and_the_error(project, inbox) -> None:
    box, _ = inbox
    out = _run(project, DAYS[1])  # 2026-11-02.csv does not exist; when_missing: fail
    assert out.returncode != 0
    assert box.subjects()[2:] == ["[trainyard] cancer: task stage failed"]
    body = box.body(2)
    assert "2026-11-02.csv" in body and "does not exist" in body, body


def test_a_rejection_that_fails_the_run_is_mailed_as_a_rejection(project, inbox) -> None:
    """Found by a new user: with fail_run_on_reject the gate fails, and only a bare
    "task gate failed" was mailed, without the gate report."""
    box, _ = inbox
    _write(project, accuracy_min=0.9999, fail_run_on_reject=True)
    out = _run(project, DAYS[0])
    assert out.returncode != 0
    # the inputs are the last run's: its candidate (version 2) is reused and judged again
    assert box.subjects()[3:] == ["[trainyard] cancer: gate rejected version 2"]
    assert "threshold:accuracy" in box.body(3) and "&gt;= 0.9999" in box.body(3)
