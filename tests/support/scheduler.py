"""The one Airflow standalone every scheduler scenario shares (``tests/e2e/scheduler``).

A real ``make standalone`` (``python -m trainyard.standalone run``: scheduler, triggerer,
dag-processor and API server) on the project's PostgreSQL, stopped as ``make stop`` stops
it (the stop is checked: exit 0, nothing of it left). Starting and stopping one costs
about a minute; the scenarios used to start five.

Each scenario has pipelines (DAG ids) and datasets of its own in one project, declared in
:func:`pipelines`: a test must not assume it owns the ``trainyard_training`` pool (1 slot)
or that its DAG is the only one. The project's env holds what any scenario needs from
the start: the contracts, a real SMTP server's connection, the Redis server's folder.
A new scheduler scenario adds its pipelines here instead of starting a standalone of its
own (``tests/support/guard.py`` fails a module that does).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.guard import SHARED_ENV
from tests.support.harness import (
    ROOT,
    Inbox,
    Project,
    StandaloneEnv,
    admin_password,
    make_project,
    standalone_group,
    start_standalone,
    stop_standalone,
    wait_http,
)
from tests.support.ports import free_ports

SMALL_TRANSACTIONS = {"epochs": 1, "workers": 1, "attempt_timeout_s": 300}
"""The backfill's trainings: what it checks is which runs train, not the strategy."""

STREAM_TRAINING = {"epochs": 0, "workers": 1}
"""The stream scenarios' trainings: what they check is which runs start, and their days."""


def _digits(dataset: str, **updates: Any) -> dict[str, Any]:
    """A copy of the digits pipeline, manual runs only, on a dataset of its own."""
    return {"from": "digits", "dataset": dataset, "schedule": None, **updates}


def pipelines(raw_transactions: Path) -> dict[str, dict[str, Any]]:
    """Every scenario's pipelines, by name (``make_project``'s ``extra_pipelines``)."""
    return {
        # test_ui_plugin: a promotion, a 0-epoch rejection, a typo; and a contract violation
        "digits_ui": _digits("digits", training={"epochs": 2, "workers": 1}),
        "digits_strict": _digits("digits_strict"),
        # test_standalone: the trigger form (it sets epochs 1 over the config's 2)
        "digits_form": _digits("digits_form", training={"epochs": 2, "workers": 1}),
        # test_standalone: a backfill, and a pipeline its snapshots trigger
        "transactions": {
            "from": "transactions",
            "source": {"url": str(raw_transactions)},
            "training": SMALL_TRANSACTIONS,
        },
        "transactions_shadow": {
            "from": "transactions",
            "source": {"url": str(raw_transactions)},
            "schedule": None,
            "trigger_on_dataset": True,
            "training": SMALL_TRANSACTIONS,
        },
        # test_approval: a person approves, through the browser and the API
        "digits_approval": _digits(
            "digits_approval",
            training={"epochs": 2, "workers": 1},
            # a person decides here, not the numbers: the second candidate, trained on the
            # same data, may come out a little worse than the first (it failed the champion
            # check in a fresh clone's make test), so both gates pass whatever the seed does
            gate={
                "approval": "required",
                "approvers": {"roles": ["op"]},  # alice; not the triggerer, admin
                "approval_timeout_h": 1,
                "thresholds": {"accuracy": {"min": 0.5}},
                "champion": {"metric": "accuracy", "max_regression": 1.0},
            },
            notify={
                "email": ["ml-team@example.com"],
                "events": ["rejection", "promotion"],
                "smtp_conn_id": "smtp_approval",
            },
        ),
        # test_stream_trigger_e2e: runs started by messages on a Redis stream (which runs
        # start and what they stage is checked, not the model: its trainings are 0 epochs,
        # which the gate rejects; the runs succeed)
        "digits_stream": _digits(
            "digits_stream",
            training=STREAM_TRAINING,
            trigger={"stream": {"name": "digits_stream.arrivals", "poll_interval_s": 0.5}},
        ),
        "digits_paused": _digits(
            "digits_paused",
            training=STREAM_TRAINING,
            trigger={
                "stream": {
                    "name": "digits_paused.arrivals",
                    "poll_interval_s": 0.5,
                    "redeliver_after_s": 20,
                }
            },
        ),
    }


def _contracts(folder: Path, datasets: set[str]) -> Path:
    """The shipped contracts, a copy of digits' per dataset, and digits_strict's million rows."""
    shutil.copytree(ROOT / "data_contracts", folder)
    digits = yaml.safe_load((folder / "digits.yaml").read_text())
    for dataset in sorted(datasets - {"digits", "transactions"}):
        contract = {**digits, "dataset": dataset}
        if dataset == "digits_strict":  # the same images as a dataset that wants a million
            contract["rules"] = {**digits["rules"], "row_count": {"min": 1_000_000}}
        (folder / f"{dataset}.yaml").write_text(yaml.safe_dump(contract, sort_keys=False))
    return folder


@dataclass
class Scheduler:
    """The running standalone, its project, and the servers beside it."""

    project: Project
    base: str
    password: str
    inbox: Inbox
    redis_url: str

    def env(self) -> StandaloneEnv:
        """A fresh API client with admin credentials (its ``runs`` start empty)."""
        return StandaloneEnv(self.project, self.base, self.password)

    def wait_for_dag(self, dag: str, deadline_s: float = 240) -> None:
        """Wait until the dag-processor has parsed ``dag`` (it parses after the start)."""
        client = self.env()
        end = time.monotonic() + deadline_s
        while client.get(f"/api/v2/dags/{dag}")[0] != 200:
            assert time.monotonic() < end, f"{dag} never appeared"
            time.sleep(1)


@contextmanager
def shared_standalone(tmp: Path) -> Iterator[Scheduler]:
    """Start the standalone with every scenario's pipelines in ``tmp``; stop it as
    ``make stop`` does, and check that nothing of it is left."""
    from aiosmtpd.controller import Controller

    from trainyard.streaming import redis_server

    api_port, smtp_port = free_ports(2)
    inbox = Inbox()
    smtp = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    extra = pipelines(tmp / "raw" / "transactions" / "{ds}.csv")
    project = make_project(tmp, {"schedule": None}, api_port=api_port, extra_pipelines=extra)
    datasets = {"digits"} | {spec.get("dataset", spec["from"]) for spec in extra.values()}
    redis_dir = tmp / "redis"
    project.env.update(
        TRAINYARD_CONTRACTS_DIR=str(_contracts(tmp / "contracts", datasets)),
        TRAINYARD_REDIS_DIR=str(redis_dir),
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="True",
        # test_approval: an approver (op) and an ordinary user besides the admin
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin,alice:op,mallory:user",
        AIRFLOW_CONN_SMTP_APPROVAL=json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": smtp_port,
                "extra": {"disable_ssl": True, "disable_tls": True, "timeout": 10},
            }
        ),
        **{SHARED_ENV: "scheduler"},
    )
    assert project.postgres is not None
    redis_url = redis_server.ensure_running(redis_dir)
    project.start_postgres()
    log = (tmp / "standalone.log").open("w")
    proc = start_standalone(project, api_port, log)
    base = f"http://127.0.0.1:{api_port}"
    pgid = None
    try:
        pgid = standalone_group(project)
        wait_http(f"{base}/api/v2/monitor/health", 240)
        # The execution API builds its versioned routes on its first request, in the
        # api-server's event loop: measured here 5 s to 26 s on a busy 2-core machine,
        # during which no request is answered. The first task would meet it; this does.
        wait_http(f"{base}/execution/health", 240)
        pool = project.airflow("pools", "set", "trainyard_training", "1", "training", timeout=120)
        assert pool.returncode == 0, pool.stderr[-2000:]
        yield Scheduler(project, base, admin_password(project), inbox, redis_url)
    finally:
        try:
            if pgid is None:
                proc.kill()
            else:  # after runs: the LocalExecutor's workers exist, and must go too
                stop_standalone(project, proc, pgid, by_make_stop=True)
        finally:
            project.stop_server()
            project.stop_postgres()
            redis_server.stop(redis_dir)
            smtp.stop()
            log.close()
