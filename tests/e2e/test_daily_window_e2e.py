"""A dataset the project does not ship, over time, through real Airflow (``dags test``).

scikit-learn's breast cancer data as one CSV per day (generated here) and a pipeline that
trains on the last 3 validated intervals. Day 1 stages and validates (a dry run); day 2's
file breaks the contract, is rejected, fixed, and then passes (dry runs); day 3 trains
once on the whole window (3 snapshots, every row of the three days) and is served;
re-running day 2 trains on the data up to day 2 and does not replace the champion trained
up to day 3, and with ``fail_run_on_reject`` that rejection fails the run.

``notify:`` mails each outcome through a real SMTP server: aiosmtpd on loopback, which the
pipeline's Airflow connection (``AIRFLOW_CONN_...``) points Airflow's ``SmtpNotifier`` at.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.daily_csv import pipeline as pipeline_dict
from tests.support.daily_csv import read_csv, use_contracts, write_csv, write_days
from tests.support.harness import Inbox, Project, init_airflow, make_project
from tests.support.ports import free_port

# each test runs a few whole DAG runs; on a shared 2-core machine one takes minutes
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAYS = [f"2026-11-0{i}" for i in range(1, 4)]
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
    tmp = tmp_path_factory.mktemp("daily")
    proj = make_project(tmp)
    raw = tmp / "raw"
    proj.rows = write_days(raw, DAYS)  # type: ignore[attr-defined]
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
    _write(proj)
    init_airflow(proj)
    yield proj
    proj.stop_server()


def _write(project: Project, fail_run_on_reject: bool = False) -> None:
    cfg = pipeline_dict(
        project.raw,  # type: ignore[attr-defined]
        training={"window": {"intervals": 3}, "epochs": 3, "workers": 1},
        gate={
            "metrics": ["accuracy", "loss"],
            "thresholds": {"accuracy": {"min": 0.5}},
            # metrics may even regress a lot: only time may keep a candidate out here
            "champion": {"metric": "accuracy", "max_regression": 0.5},
            "fail_run_on_reject": fail_run_on_reject,
        },
        serving={"model_name": "cancer", "port": project.port},
        notify={"email": TO, "smtp_conn_id": "smtp_test", "from_email": "trainyard@example.com"},
    )
    (project.home / "pipelines" / "cancer.yaml").write_text(yaml.safe_dump(cfg))


def _run(project: Project, day: str, conf: dict | None = None):
    # a run at 03:00 of the next day covers ``day`` (the cron's data interval)
    nxt = f"2026-11-{int(day[-2:]) + 1:02d}T03:00:00+00:00"
    args = ["dags", "test", "trainyard_cancer", nxt]
    if conf:
        args += ["--conf", json.dumps(conf)]
    return project.airflow(*args)


def _last(project: Project) -> dict:
    return json.loads((project.volume_root / "_models" / "cancer" / "last_run.json").read_text())


def _interval_record(project: Project, day: str) -> dict:
    # keyed by the interval's UTC instants (volumes.interval_key): the day's midnight
    (path,) = (project.volume_root / "cancer" / "intervals").glob(f"{day}T000000+0000__*.json")
    return json.loads(path.read_text())


def test_days_are_staged_and_validated_without_training(project: Project, inbox) -> None:
    out = _run(project, DAYS[0], {"dry_run": True})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = _last(project)
    assert run["stage"]["interval"][0].startswith(DAYS[0])
    assert run["validate"]["success"] is True and "train" not in run
    assert inbox[0].subjects() == []  # nothing promoted, rejected or failed


def test_a_rejected_day_is_mailed_fixed_then_passes(project: Project, inbox) -> None:
    box, _ = inbox
    path = project.raw / f"{DAYS[1]}.csv"
    good = read_csv(path)
    bad = [dict(r) for r in good]
    bad[5]["mean_radius"] = "-3.0"
    write_csv(path, bad)
    out = _run(project, DAYS[1], {"dry_run": True})
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "ValidationFailed" in text and "mean_radius" in text
    # a failure is mailed with the task and the error
    assert box.subjects() == ["[trainyard] cancer: task validate failed"]
    assert sorted(box.recipients[0]) == sorted(TO)
    assert "ValidationFailed" in box.body(0) and "mean_radius" in box.body(0), box.body(0)
    rejected = _interval_record(project, DAYS[1])["snapshot_id"]
    listed = project.trainyard("snapshots", "list", "cancer")
    line = next(t for t in listed.stdout.splitlines() if t.split()[1:2] == [rejected])
    assert "REJECTED" in line and "mean_radius" in line
    write_csv(path, good)  # the upstream fix
    out = _run(project, DAYS[1], {"dry_run": True})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = _last(project)
    assert run["validate"]["success"] is True
    assert run["stage"]["replaced"] == rejected
    assert f"snapshot {rejected} was rejected" in run["stage"]["checked"]
    assert _interval_record(project, DAYS[1])["snapshot_id"] == run["stage"]["snapshot_id"]
    assert len(box.subjects()) == 1


def test_the_last_day_trains_on_the_whole_window(project: Project, inbox) -> None:
    box, _ = inbox
    out = _run(project, DAYS[2])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    run = _last(project)
    assert len(run["validate"]["window"]) == 3
    assert run["evaluate"]["verdict"] == "promote", run["evaluate"]["reason"]
    assert run["deploy"]["version"] == 1
    # a promotion is mailed with the served version and its metrics
    assert box.subjects()[1:] == ["[trainyard] cancer: version 1 promoted and served"]
    assert str(box.messages[1]["From"]) == "trainyard@example.com"
    assert "accuracy" in box.body(1) and f":{project.port}/v1/models/cancer" in box.body(1)
    version_dir = project.volume_root / "_models" / "cancer" / "versions" / "1"
    meta = json.loads((version_dir / "metadata.json").read_text())
    read = meta["snapshots"]
    assert len(read) == 3
    assert [s["interval"][0][:10] for s in read] == DAYS
    assert [s["rows"] for s in read] == [project.rows[d] for d in DAYS]
    assert meta["rows"] == sum(project.rows.values()) == 569
    assert meta["rows"] > max(project.rows.values())
    assert meta["window"] == {"intervals": 3}
    assert meta["data_until"].startswith(DAYS[2])
    inputs = json.loads((version_dir / "inputs.json").read_text())
    assert inputs["train_examples"] > max(project.rows.values())
    # every snapshot of the window is kept while the version names it
    gc = project.trainyard("snapshots", "gc", "cancer", "--keep", "1", "--dry-run")
    assert gc.returncode == 0 and "would delete 1:" in gc.stdout  # only the rejected one
    summary = project.trainyard("summary", "--pipeline", "cancer")
    assert "served        version 1" in summary.stdout


def test_an_old_day_rerun_does_not_replace_the_newer_champion(project: Project, inbox) -> None:
    box, _ = inbox
    out = _run(project, DAYS[1])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    # a gate rejection is mailed with the reason, beside the champion's metrics
    assert box.subjects()[2:] == ["[trainyard] cancer: gate rejected version 2"]
    assert "time:data" in box.body(2) and "champion" in box.body(2), box.body(2)
    run = _last(project)
    assert "not re-read" in run["stage"]["checked"]
    assert [e["interval"][0][:10] for e in run["validate"]["window"]] == DAYS[:2]
    assert run["register"]["version"] == 2
    assert run["evaluate"]["verdict"] == "reject"
    assert "older than the champion's" in run["evaluate"]["reason"]
    assert "deploy" not in run
    champion = json.loads(
        (project.volume_root / "_models" / "cancer" / "champion.json").read_text()
    )
    assert champion["version"] == 1
    gate_md = project.volume_root / "_models" / "cancer" / "versions" / "2" / "gate.md"
    assert "time:data" in gate_md.read_text() and "older than the champion's" in gate_md.read_text()
    meta = json.loads(Path(gate_md.parent / "metadata.json").read_text())
    assert len(meta["snapshots"]) == 2 and meta["data_until"].startswith(DAYS[1])


def test_a_rejection_that_fails_the_run_is_mailed_as_a_rejection(project: Project, inbox) -> None:
    """Found by a new user: with fail_run_on_reject the gate fails, and only a bare
    "task gate failed" was mailed, without the gate report."""
    box, _ = inbox
    _write(project, fail_run_on_reject=True)
    out = _run(project, DAYS[1])
    assert out.returncode != 0
    # the inputs are the last run's: its candidate (version 2) is reused and judged again
    assert box.subjects()[3:] == ["[trainyard] cancer: gate rejected version 2"]
    assert "time:data" in box.body(3) and "older than the champion" in box.body(3)
