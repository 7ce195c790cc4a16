"""``make standalone``'s wrapper (:mod:`trainyard.standalone`) without Airflow: the
refusals, and ``stop`` of a recorded process group whose processes ignore SIGTERM (as
Airflow 3.3's LocalExecutor workers did, which a cold user found left running)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_ports
from trainyard.standalone import group_members

# a group leader that ignores SIGTERM, and a child of it that does too
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child])
print("ready", flush=True)
time.sleep(600)
"""


def _wrapper(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIRFLOW_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "trainyard.standalone", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_stop_ends_a_group_that_ignores_sigterm_and_a_second_start_is_refused(
    tmp_path: Path,
) -> None:
    group = subprocess.Popen(
        [sys.executable, "-c", STUBBORN],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert group.stdout is not None and group.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(group_members(group.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(group_members(group.pid)) == 2
        record = tmp_path / "standalone.json"
        record.write_text(json.dumps({"pid": group.pid, "pgid": group.pid, "port": 18080}))
        again = _wrapper(tmp_path, "run", "--port", "18080")
        assert again.returncode == 2
        assert "already runs for this checkout (port 18080" in again.stderr
        check = _wrapper(tmp_path, "check")  # make standalone's first step
        assert check.returncode == 2 and "stop it first (make stop)" in check.stderr
        stopped = _wrapper(tmp_path, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == (
            "Airflow standalone stopped (port 18080) (2 processes needed SIGKILL)"
        )
        assert group_members(group.pid) == [] and not record.exists()
        assert _wrapper(tmp_path, "stop").stdout.strip() == "Airflow standalone: not running"
    finally:
        if group_members(group.pid):
            os.killpg(group.pid, 9)
        group.wait(timeout=10)


def test_sigterm_to_the_wrapper_stops_a_group_that_ignores_it(tmp_path: Path) -> None:
    """``kill %1`` on ``make standalone``: SIGTERM to the wrapper ends all of Airflow's group
    (here a stand-in ``airflow`` that ignores SIGTERM, as the LocalExecutor's workers do),
    exits 0 and removes the record. The real standalone of tests/e2e/scheduler is stopped
    the other way, as ``make stop`` does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "airflow"
    fake.write_text(f"#!{sys.executable}\n{STUBBORN}")
    fake.chmod(0o755)
    api, worker_logs, trigger_logs = free_ports(3)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_logs),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_logs),
    }
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "trainyard.standalone", "run", "--port", str(api)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    record = tmp_path / "standalone.json"
    pgid = None
    try:
        deadline = time.monotonic() + 60
        while pgid is None or len(group_members(pgid)) < 2:
            assert time.monotonic() < deadline and wrapper.poll() is None, "no group"
            if pgid is None and record.is_file():
                pgid = int(json.loads(record.read_text())["pgid"])
            time.sleep(0.1)
        wrapper.send_signal(signal.SIGTERM)
        out, _ = wrapper.communicate(timeout=60)
        assert wrapper.returncode == 0, out
        assert "stopping Airflow standalone (SIGTERM)" in out, out
        assert group_members(pgid) == [] and not record.exists()
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
        if pgid is not None and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


def test_a_taken_port_is_named_with_another_to_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = _wrapper(tmp_path, "run", "--port", str(port))
    assert out.returncode == 2
    assert f"port {port} on 127.0.0.1 is taken (another Airflow?)" in out.stderr
    assert "make standalone AIRFLOW_PORT=" in out.stderr


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, port: str) -> None:
    out = _wrapper(tmp_path, "run", "--port", port)
    assert out.returncode == 2 and f"--port {port}: not a TCP port" in out.stderr


def test_a_taken_log_server_port_is_named_before_airflow_starts(tmp_path: Path) -> None:
    """Found by a cold user: with the worker log server's port taken, standalone started
    and ran without a log server, saying so in one line of its output."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        taken = s.getsockname()[1]
        env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
        env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(taken)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            api = free.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "trainyard.standalone", "run", "--port", str(api)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    assert f"port {taken} (Airflow's worker log server) is taken" in out.stderr
    assert "export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=" in out.stderr
    assert not (tmp_path / "standalone.json").exists()
