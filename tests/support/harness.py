"""An isolated trainyard + Airflow home for end-to-end tests (real Airflow).

Its metadata database is the project's own PostgreSQL (``trainyard.metadb``, a cluster in
the test's folder) wherever a scheduler runs, and SQLite in the test's folder where a
single process runs (``airflow dags test``).
"""

from __future__ import annotations

import atexit
import email
import email.policy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import yaml

from tests.support.ports import free_port, free_ports
from trainyard.metadb import Cluster, ensure_running, stop

__all__ = ["free_port", "free_ports"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Project:
    """Paths and environment of one isolated project run."""

    home: Path
    env: dict[str, str]
    port: int
    postgres: Cluster | None = None

    def start_postgres(self) -> None:
        """Start this project's PostgreSQL (made on first use), if it has one."""
        if self.postgres is not None:
            ensure_running(self.postgres)

    def stop_postgres(self) -> None:
        """Stop this project's PostgreSQL, if it has one and it runs."""
        if self.postgres is not None:
            stop(self.postgres)

    @property
    def volume_root(self) -> Path:
        return Path(self.env["TRAINYARD_VOLUME_ROOT"])

    def airflow(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run the ``airflow`` CLI of the venv in this project's environment."""
        exe = str(Path(sys.executable).with_name("airflow"))
        return subprocess.run(
            [exe, *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    def trainyard(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run ``python -m trainyard`` in this project's environment."""
        return subprocess.run(
            [sys.executable, "-m", "trainyard", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop_server(self) -> None:
        """Stop the local model server the deploy step started, if any."""
        self.trainyard_py(
            "from trainyard.serving.deploy import stop_local_server\n"
            "from trainyard.settings import get_settings\n"
            "stop_local_server(get_settings().serving_root)\n"
        )

    def trainyard_py(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _merge(base: dict, updates: dict) -> dict:
    out = dict(base)
    for key, value in updates.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def make_project(
    tmp: Path,
    pipeline_overrides: dict | None = None,
    api_port: int | None = None,
    extra_pipelines: dict[str, dict] | None = None,
    database: str | None = None,
) -> Project:
    """Write a pipelines folder (the real pipelines with test overrides) and an env.

    Args:
        tmp: A fresh temporary folder.
        pipeline_overrides: Nested updates to ``dags/pipelines/digits.yaml``.
        api_port: Port of the Airflow API server (standalone tests).
        extra_pipelines: More pipelines by name: ``{"name": {"from": "transactions",
            ...updates}}`` copies a real pipeline config and applies the updates.
        database: ``"postgres"`` (a cluster in ``tmp/postgres``, the default with an API
            server, i.e. where a scheduler runs) or ``"sqlite"`` (``tmp/airflow/airflow.db``,
            the default otherwise).

    Returns:
        The project handle; call ``init_airflow`` before running DAGs.
    """
    port, worker_logs, trigger_logs = free_ports(3, {api_port} if api_port else frozenset())
    pipelines = tmp / "pipelines"
    pipelines.mkdir()
    wanted = {"digits": {"from": "digits", **(pipeline_overrides or {})}, **(extra_pipelines or {})}
    for name, spec in wanted.items():
        updates = {k: v for k, v in spec.items() if k != "from"}
        base = yaml.safe_load((ROOT / "dags" / "pipelines" / f"{spec['from']}.yaml").read_text())
        own = {"name": name, "serving": {"port": port, "model_name": name}}
        cfg = _merge(_merge(base, own), updates)
        (pipelines / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ)
    env.update(
        TRAINYARD_PROJECT_DIR=str(ROOT),
        TRAINYARD_VOLUME_ROOT=str(tmp / "volumes"),
        TRAINYARD_PIPELINES_DIR=str(pipelines),
        TRAINYARD_RUNNER="local",
        AIRFLOW_HOME=str(tmp / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        PYTHONPATH=str(ROOT / "plugins"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    database = database or ("postgres" if api_port else "sqlite")
    postgres = None
    if database == "postgres":
        postgres = Cluster(tmp / "postgres")
        env["TRAINYARD_POSTGRES_DIR"] = str(postgres.root)
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = postgres.url()
    else:  # explicit: the calling shell's env.sh names the project's PostgreSQL
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{tmp / 'airflow' / 'airflow.db'}"
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", None)
    if api_port:
        env.update(
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(api_port),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{api_port}/execution/",
            # standalone's log servers bind every interface: ports of their own
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(worker_logs),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(trigger_logs),
        )
    return Project(home=tmp, env=env, port=port, postgres=postgres)


def init_airflow(project: Project) -> None:
    """Start the project's database server if it has one, migrate, create the pool.

    A SQLite database is a copy of one migrated (with the pool) once per process: the
    migration and the pool cost two Airflow CLI start-ups, about 6 s here.
    """
    db = _sqlite_path(project)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_sqlite(), db)
        return
    project.start_postgres()
    _migrate(project)


def _migrate(project: Project) -> None:
    out = project.airflow("db", "migrate", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    out = project.airflow("pools", "set", "trainyard_training", "1", "training", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def _sqlite_path(project: Project) -> Path | None:
    url = project.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


@functools.cache
def _migrated_sqlite() -> Path:
    """An Airflow SQLite database, migrated and with the training pool (once per process)."""
    folder = tempfile.mkdtemp(prefix="trainyard-airflow-db-")
    atexit.register(shutil.rmtree, folder, True)
    template = make_project(Path(folder))
    _migrate(template)
    db = _sqlite_path(template)
    assert db is not None and db.is_file(), db
    return db


def openlineage_to_file(project: Project, namespace: str) -> Path:
    """Have the project's Airflow write its OpenLineage events to a file (the provider's
    ``file`` transport); return the file's path."""
    events_file = project.home / "openlineage" / "events.jsonl"
    events_file.parent.mkdir()
    project.env.update(
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        AIRFLOW__OPENLINEAGE__NAMESPACE=namespace,
        AIRFLOW__OPENLINEAGE__DISABLED="False",
    )
    return events_file


CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium (Playwright's own browser download does not work here)."""

BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def wait_http(url: str, deadline_s: float) -> None:
    """Wait until ``url`` answers 200."""
    import time
    import urllib.error
    import urllib.request

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {deadline_s} s")


def start_standalone(project: Project, api_port: int, log: IO[str]) -> subprocess.Popen:
    """Start ``make standalone``'s command (:mod:`trainyard.standalone`) for ``project``."""
    return subprocess.Popen(
        [sys.executable, "-m", "trainyard.standalone", "run", "--port", str(api_port)],
        env=project.env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def standalone_group(project: Project, deadline_s: float = 60) -> int:
    """The process group of the project's running standalone (from its record)."""
    record = Path(project.env["AIRFLOW_HOME"]) / "standalone.json"
    end = time.monotonic() + deadline_s
    while not record.is_file():
        if time.monotonic() > end:
            raise TimeoutError(f"{record} was not written")
        time.sleep(0.2)
    return int(json.loads(record.read_text())["pgid"])


def stop_standalone(
    project: Project, proc: subprocess.Popen, pgid: int, by_make_stop: bool = False
) -> None:
    """SIGTERM the standalone as ``kill %1`` does (or stop it as ``make stop`` does); check
    that it exits 0 and that none of its processes is left.

    Found by a cold user: on SIGTERM Airflow's scheduler waited for its LocalExecutor
    workers, which never exit, and the README's ``kill %1`` left all of them running. A
    second one saw ``make standalone`` end "Error 241" when ``make stop`` stopped it.
    """
    import signal

    from trainyard.standalone import group_members

    if by_make_stop:
        stop = subprocess.run(
            [sys.executable, "-m", "trainyard.standalone", "stop"],
            env=project.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stop.returncode == 0 and "standalone stopped" in stop.stdout, stop
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        left = group_members(pgid)
        if left:
            os.killpg(pgid, signal.SIGKILL)
    assert code == 0, code
    assert not left, [p.cmdline() for p in left]
    assert not (Path(project.env["AIRFLOW_HOME"]) / "standalone.json").exists()


@contextmanager
def standalone(project: Project, api_port: int, log_path: Path) -> Iterator[str]:
    """Run ``make standalone``'s command for ``project`` (made with ``api_port``); yield its URL.

    Starts the project's PostgreSQL first if it has one. Stops it all on exit (and checks
    that nothing of standalone is left), then the model server and PostgreSQL.
    """
    project.start_postgres()
    with log_path.open("w") as log:
        proc = start_standalone(project, api_port, log)
        base = f"http://127.0.0.1:{api_port}"
        pgid = None
        try:
            pgid = standalone_group(project)
            wait_http(f"{base}/api/v2/monitor/health", 240)
            pool = project.airflow("pools", "set", "trainyard_training", "1", "training")
            assert pool.returncode == 0, pool.stderr[-2000:]
            yield base
        finally:
            if pgid is None:
                proc.kill()
            else:
                stop_standalone(project, proc, pgid)
            time.sleep(1)
            project.stop_server()
            project.stop_postgres()


def admin_password(project: Project, username: str = "admin") -> str:
    """The password standalone generated for an account (simple auth manager)."""
    import json
    import time

    path = Path(project.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    for _ in range(60):
        if path.exists():
            break
        time.sleep(1)
    return json.loads(path.read_text())[username]


def api_token(base: str, password: str, username: str = "admin") -> str:
    """A JWT for Airflow's API (``POST /auth/token``)."""
    import json
    import urllib.request

    req = urllib.request.Request(
        f"{base}/auth/token",
        data=json.dumps({"username": username, "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["access_token"]


class StandaloneEnv:
    """A running standalone's API with admin credentials, and the runs a test made."""

    def __init__(self, project: Project, base: str, password: str) -> None:
        self.project, self.base, self.password = project, base, password
        self.token = api_token(base, password)
        self.runs: dict[str, dict[str, Any]] = {}

    def get(self, path: str, token: str | None = "default") -> tuple[int, bytes, Any]:
        """GET ``path``; ``token=None`` sends no credentials. Returns status, body, headers."""
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        req = urllib.request.Request(f"{self.base}{path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> Any:
        req = urllib.request.Request(
            f"{self.base}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def api_as(
        self, username: str, path: str, method: str = "GET", body: dict | None = None
    ) -> tuple[int, Any]:
        """Call the API as another account of the simple auth manager: status, JSON body."""
        token = api_token(self.base, admin_password(self.project, username), username)
        req = urllib.request.Request(
            f"{self.base}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def trigger_and_wait(self, conf: dict, dag: str, deadline_s: float = 480) -> dict[str, Any]:
        return self.wait_for_run(self.trigger(conf, dag), dag, deadline_s)

    def trigger(self, conf: dict, dag: str) -> dict[str, Any]:
        """Trigger a manual run of ``dag`` with ``conf``; return it as the API answers."""
        return self.api(f"/api/v2/dags/{dag}/dagRuns", "POST", {"logical_date": None, "conf": conf})

    def wait_for_run(
        self, run: dict[str, Any], dag: str, deadline_s: float = 480
    ) -> dict[str, Any]:
        """Wait until ``run`` (as :meth:`trigger` returned it) ends; return it, ended."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            run = self.api(f"/api/v2/dags/{dag}/dagRuns/{quote(run['dag_run_id'], safe='')}")
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(1)
        raise TimeoutError(f"run {run['dag_run_id']} still {run['state']}")

    def task_states(self, run_id: str, dag: str) -> dict[str, str]:
        tis = self.api(f"/api/v2/dags/{dag}/dagRuns/{quote(run_id, safe='')}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}


class Inbox:
    """What a real SMTP server on loopback received: one parsed message per mail."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.recipients: list[list[str]] = []
        self.changed = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.changed:
            self.messages.append(msg)  # type: ignore[arg-type]
            self.recipients.append(list(envelope.rcpt_tos))
            self.changed.notify_all()
        return "250 OK"

    def subjects(self) -> list[str]:
        return [str(m["Subject"]) for m in self.messages]

    def body(self, i: int) -> str:
        part = self.messages[i].get_body(preferencelist=("html", "plain"))
        return part.get_content() if part is not None else ""


def sign_in(page: Any, base: str, password: str, username: str = "admin") -> None:
    """Sign a Playwright page in to Airflow's UI (as ``admin`` unless told)."""
    page.goto(f"{base}/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/", timeout=30_000)
