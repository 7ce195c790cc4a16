"""``make standalone`` when one of Airflow's components dies: a real standalone on the
project's PostgreSQL, its scheduler killed with SIGKILL.

Found by a cold user: ``airflow standalone`` went on without its scheduler (a zombie), a
triggered run stayed queued with no message anywhere, and nothing said why.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.support.harness import (
    make_project,
    standalone_group,
    start_standalone,
    wait_http,
)
from tests.support.ports import free_port
from trainyard.standalone import group_members

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _component(standalone_pid: int, name: str, deadline_s: float = 120) -> psutil.Process:
    """The running ``airflow <name>`` child of the standalone process."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for child in psutil.Process(standalone_pid).children():
            try:
                if child.cmdline()[-1:] == [name]:
                    return child
            except psutil.Error:
                continue
        time.sleep(0.5)
    raise TimeoutError(f"no airflow {name} under {standalone_pid}")


def test_a_killed_scheduler_stops_standalone_with_the_reason(tmp_path: Path) -> None:
    api_port = free_port()
    project = make_project(tmp_path, {"schedule": None}, api_port=api_port)
    project.start_postgres()
    log_path = tmp_path / "standalone.log"
    try:
        with log_path.open("w") as log:
            proc = start_standalone(project, api_port, log)
            try:
                pgid = standalone_group(project)
                wait_http(f"http://127.0.0.1:{api_port}/api/v2/monitor/health", 240)
                scheduler = _component(pgid, "scheduler")  # airflow standalone leads the group
                time.sleep(3)  # the wrapper has seen every component run
                os.kill(scheduler.pid, signal.SIGKILL)
                code = proc.wait(timeout=90)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
        text = log_path.read_text()
        assert code == 1, text[-3000:]
        assert "Airflow's scheduler exited" in text and "make standalone" in text, text[-3000:]
        end = time.monotonic() + 30
        while group_members(pgid) and time.monotonic() < end:
            time.sleep(0.5)
        assert group_members(pgid) == [], "standalone's processes were left running"
        assert not (Path(project.env["AIRFLOW_HOME"]) / "standalone.json").exists()
    finally:
        project.stop_postgres()
