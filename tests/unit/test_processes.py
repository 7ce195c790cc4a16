"""``fsutil.process_alive``: what "stop the scorer, then start one" waits on."""

from __future__ import annotations

import subprocess
import sys
import time

from trainyard.fsutil import process_alive


def test_a_zombie_of_another_process_counts_as_gone() -> None:
    """A scorer's supervisor started by a process that is still running (an Airflow worker,
    a test) and not waiting for it stays a zombie once it exits: ``--restart`` from
    elsewhere waited for it for ever."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, time; q = subprocess.Popen(['true']); print(q.pid, flush=True);"
         " time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while process_alive(child):  # it exits at once; a zombie until its parent waits
            assert time.monotonic() < deadline, "the exited child still counts as alive"
            time.sleep(0.05)
        assert process_alive(parent.pid)
    finally:
        parent.kill()
        parent.wait()
    assert not process_alive(parent.pid)
