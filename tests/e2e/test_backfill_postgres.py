"""Backfills created while the scheduler writes, on the project's PostgreSQL, for real.

The project's PostgreSQL (``trainyard.metadb``) starts in the test's folder, ``airflow db
migrate`` runs against it, a real ``airflow scheduler`` and ``airflow dag-processor`` run,
and ``airflow backfill create`` (the README's command) creates backfills of four DAGs one
after the other while the scheduler is busy running the earlier ones. On SQLite such a
create could fail with "database is locked"; here each is accepted on its first try, the
scheduler survives and every backfill run succeeds.

The DAGs are small on purpose (EmptyOperator tasks, which the scheduler itself marks
done), so the test measures the database, not training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from trainyard.metadb import Cluster, ensure_running, stop

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_IDS = [f"pg_probe_{i}" for i in range(4)]
DAG_FILE = f"""
import datetime as dt

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

for dag_id in {DAG_IDS!r}:
    with DAG(
        dag_id,
        schedule="@daily",
        start_date=dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc),
        catchup=False,
    ) as dag:
        EmptyOperator(task_id="a") >> EmptyOperator(task_id="b") >> EmptyOperator(task_id="c")
    globals()[dag_id] = dag
"""
DAYS = 7  # runs per backfill


def _airflow(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("airflow")), *args],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _rows(cluster: Cluster, sql: str) -> list[tuple]:
    conn = psycopg2.connect(host=str(cluster.socket_dir), dbname="airflow", user="airflow")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def airflow_on_postgres(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Cluster, dict[str, str], Path, subprocess.Popen[bytes]]]:
    tmp = tmp_path_factory.mktemp("pgbackfill")
    (tmp / "dags").mkdir()
    (tmp / "dags" / "probe_dags.py").write_text(DAG_FILE)
    (tmp / "plugins").mkdir()
    cluster = Cluster(tmp / "postgres")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(tmp / "airflow"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=cluster.url(),
        AIRFLOW__CORE__DAGS_FOLDER=str(tmp / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(tmp / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__SCHEDULER__CATCHUP_BY_DEFAULT="False",
        # the dag-processor writes on every cycle too, as it would when files change
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="5",
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
    )
    timings: dict[str, float] = {}
    began = time.monotonic()
    ensure_running(cluster)
    timings["postgres_start_s"] = time.monotonic() - began
    began = time.monotonic()
    out = _airflow(env, "db", "migrate")
    assert out.returncode == 0, out.stderr[-3000:]
    timings["db_migrate_s"] = time.monotonic() - began
    out = _airflow(env, "dags", "reserialize")
    assert out.returncode == 0, out.stderr[-3000:]
    scheduler = _start(env, tmp / "scheduler.log", "scheduler")
    processor = _start(env, tmp / "dag-processor.log", "dag-processor")
    try:
        deadline = time.monotonic() + 180
        while True:  # the scheduler has heartbeat into the database: it is writing
            check = _airflow(env, "jobs", "check", "--job-type", "SchedulerJob", timeout=60)
            if check.returncode == 0:
                break
            assert scheduler.poll() is None, (tmp / "scheduler.log").read_text()[-3000:]
            assert time.monotonic() < deadline, check.stdout + check.stderr
            time.sleep(2)
        (tmp / "timings.json").write_text(json.dumps(timings))
        yield cluster, env, tmp, scheduler
    finally:
        _end(processor)
        _end(scheduler)
        stop(cluster)


def test_backfills_are_created_while_the_scheduler_runs(
    airflow_on_postgres: tuple[Cluster, dict[str, str], Path, subprocess.Popen[bytes]],
) -> None:
    cluster, env, tmp, scheduler = airflow_on_postgres
    created: dict[str, float] = {}
    for dag_id in DAG_IDS:
        began = time.monotonic()
        out = _airflow(
            env,
            "backfill",
            "create",
            "--dag-id",
            dag_id,
            "--from-date",
            "2026-11-01T00:00",
            "--to-date",
            f"2026-11-{DAYS:02d}T00:00",
            "--max-active-runs",
            "3",
        )
        created[dag_id] = time.monotonic() - began
        said = out.stdout + out.stderr
        assert out.returncode == 0, said[-3000:]
        assert "locked" not in said.lower(), said[-3000:]
        # the scheduler is running the backfills created before this one
        assert scheduler.poll() is None, (tmp / "scheduler.log").read_text()[-3000:]

    deadline = time.monotonic() + 600
    while True:
        states = dict(
            _rows(
                cluster,
                "SELECT dag_id || ':' || state, count(*) FROM dag_run "
                "WHERE run_type = 'backfill' GROUP BY dag_id, state",
            )
        )
        if states == {f"{d}:success": DAYS for d in DAG_IDS}:
            break
        assert scheduler.poll() is None, (tmp / "scheduler.log").read_text()[-3000:]
        assert time.monotonic() < deadline, states
        time.sleep(3)
    done = _rows(cluster, "SELECT count(*) FROM backfill WHERE completed_at IS NOT NULL")
    deadline = time.monotonic() + 120
    while done[0][0] < len(DAG_IDS) and time.monotonic() < deadline:
        time.sleep(3)
        done = _rows(cluster, "SELECT count(*) FROM backfill WHERE completed_at IS NOT NULL")
    assert done[0][0] == len(DAG_IDS)

    assert scheduler.poll() is None, "the scheduler survived the backfills"
    for log in ("scheduler.log", "dag-processor.log"):
        assert "database is locked" not in (tmp / log).read_text(errors="replace").lower()
    timings = json.loads((tmp / "timings.json").read_text())
    print(
        f"postgres start {timings['postgres_start_s']:.1f} s, db migrate "
        f"{timings['db_migrate_s']:.1f} s, backfill create (CLI, under a running scheduler): "
        + ", ".join(f"{s:.1f} s" for s in created.values())
    )
