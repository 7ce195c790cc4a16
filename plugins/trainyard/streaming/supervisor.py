"""The scorer's supervisor: ``score-stream --supervise`` runs the scorer as its child.

It starts the scorer again whenever it exits other than by a deliberate stop (backing off
from 1 s to 30 s), and kills a hung one: a scorer writes its status file every report
interval, also while it waits for the model server, so a status older than
:data:`STALE_AFTER_REPORTS` reports means it is stuck. The child dies with its supervisor
(``PR_SET_PDEATHSIG``) and can tell that from a stop asked for (:func:`supervisor_gone`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from trainyard.fsutil import atomic_write_json

log = logging.getLogger("trainyard.streaming")

STALE_AFTER_REPORTS = 12
"""A scorer that wrote no status for this many report intervals is hung and killed by its
supervisor: 60 s at the default 5 s (it reports also while it waits for the model server).
On Kubernetes the liveness probe's limit is ``k8s.scoring.STALE_AFTER_S``."""
SUPERVISOR_ENV = "TRAINYARD_SCORER_SUPERVISOR"
"""Set by :func:`supervise` in its child's environment: the supervisor's pid."""


def supervisor_pid() -> int | None:
    """The pid of the :func:`supervise` process that started this scorer, or None."""
    try:
        return int(os.environ[SUPERVISOR_ENV])
    except (KeyError, ValueError):
        return None


def supervisor_gone() -> str | None:
    """Why this supervised scorer has lost its supervisor, or None.

    None when it is not supervised, or its supervisor is still its parent. The child
    dies with its supervisor (``PR_SET_PDEATHSIG`` sends SIGTERM), by which time the
    kernel has given it another parent: that SIGTERM is no deliberate stop.
    """
    pid = supervisor_pid()
    if pid is None or os.getppid() == pid:
        return None
    return (
        f"its supervisor (pid {pid}) died: nothing would restart this scorer, so it "
        "stopped; start it again (score-stream --restart, or the deploy step)"
    )


def _pdeathsig() -> None:  # pragma: no cover - runs in the child before exec
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def supervise(
    cmd: list[str],
    max_backoff_s: float = 30.0,
    status_file: Path | None = None,
    stale_after_s: float | None = None,
) -> int:
    """Run ``cmd`` and start it again whenever it exits other than by our SIGTERM.

    The child dies with the supervisor (``PR_SET_PDEATHSIG``: its SIGTERM handler tells
    that from a deliberate stop by :data:`SUPERVISOR_ENV`, and its status says
    ``failed``); SIGTERM to the supervisor is passed on, waited for, and ends it with 0.
    Restarts back off from 1 s to ``max_backoff_s`` (reset after a run of a minute). A
    child that has not written ``status_file`` for ``stale_after_s`` is hung (a scorer
    reports also while it waits for the model server): it is killed, and the status file
    says so.
    """
    stopping = threading.Event()
    proc: subprocess.Popen[bytes] | None = None

    def _term(signum: int, _frame: Any) -> None:
        stopping.set()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
    backoff = 1.0
    while not stopping.is_set():
        started = time.monotonic()
        proc = subprocess.Popen(cmd, preexec_fn=_pdeathsig, env=env)
        code = _wait_alive(proc, status_file, stale_after_s, stopping)
        if stopping.is_set():
            break
        if time.monotonic() - started > 60:
            backoff = 1.0
        log.warning("scorer exited with %s; restarting in %.0f s", code, backoff)
        if stopping.wait(backoff):
            break
        backoff = min(backoff * 2, max_backoff_s)
    return 0


def _wait_alive(
    proc: Any, status_file: Path | None, stale_after_s: float | None, stopping: threading.Event
) -> int:
    """``proc``'s exit code; it is killed first if ``status_file`` goes stale."""
    since = time.time()
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if status_file is None or stale_after_s is None or stopping.is_set():
            continue
        try:
            last = max(since, status_file.stat().st_mtime)
        except OSError:
            last = since
        if time.time() - last < stale_after_s:
            continue
        why = f"wrote no status for {time.time() - last:.0f} s (hung?): killed by its supervisor"
        log.error("scorer pid %d %s", proc.pid, why)
        proc.kill()
        code = proc.wait()
        try:
            doc = orjson.loads(status_file.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            doc = {}
        if isinstance(doc, dict):
            atomic_write_json(status_file, {**doc, "state": "failed", "error": why})
        return code
