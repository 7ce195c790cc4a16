"""A pipeline's local scorer as a detached process, found by its pid file.

``start_local_scorer`` runs ``python -m trainyard score-stream --pipeline P --supervise`` in
a session of its own (what the deploy step and ``score-stream --restart`` do), with its
pid, log and status files in ``<volume root>/_scoring/<P>/``: ``scorer.pid`` names the
supervisor, ``status.json`` the scorer it runs (``pid``, ``supervisor_pid``).
``stop_local_scorer`` and ``stop_all_local_scorers`` (``make stop``) end them.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from trainyard.config import load_pipeline
from trainyard.errors import TrainyardError
from trainyard.fsutil import cmdline_has, process_alive, terminate
from trainyard.pipelines import ensure_own_names
from trainyard.settings import get_settings
from trainyard.streaming.records import RecordChecker
from trainyard.streaming.scorer import open_engine, streams_of

PID_FILE = "scorer.pid"
LOG_FILE = "scorer.log"
STATUS_FILE = "status.json"
START_LOCK = "start.lock"


def scorer_dir(pipeline: str) -> Path:
    """Where a pipeline's local scorer keeps its pid, log and status files."""
    return get_settings().volume_root / "_scoring" / pipeline


def _ours(pid: int) -> bool:
    return cmdline_has(pid, b"score-stream")


def local_scorer_pid(pipeline: str) -> int | None:
    """The running local scorer's (supervisor's) pid, or None."""
    try:
        pid = int((scorer_dir(pipeline) / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if process_alive(pid) and _ours(pid) else None


def local_scorer_pids_text(pipeline: str, supervisor: int) -> str:
    """``supervisor pid X, scorer pid Y``: the pid file's process and the scorer it runs.

    ``Y`` is the status file's ``pid`` (the scorer process, whose ``supervisor_pid`` is
    ``X``) while that process runs; between a scorer's death and its restart there is none.

    Args:
        pipeline: The pipeline whose local scorer it is.
        supervisor: The supervisor's pid (the pid file's).

    Returns:
        The text, for "scorer running (...)".
    """
    try:
        doc = orjson.loads((scorer_dir(pipeline) / STATUS_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        doc = None
    if not isinstance(doc, dict):
        doc = {}
    child = doc.get("pid")
    if (
        isinstance(child, int)
        and doc.get("supervisor_pid") == supervisor
        and process_alive(child)
        and _ours(child)
    ):
        return f"supervisor pid {supervisor}, scorer pid {child}"
    return f"supervisor pid {supervisor}, its scorer restarting"


def stop_local_scorer(pipeline: str, timeout_s: float = 30.0) -> bool:
    """SIGTERM the pipeline's local scorer (it commits what is in flight), then SIGKILL.

    Returns:
        True if one was running.
    """
    folder = scorer_dir(pipeline)
    pid = local_scorer_pid(pipeline)
    if pid is None:
        (folder / PID_FILE).unlink(missing_ok=True)
        return False
    terminate(pid, timeout_s, group=True)
    (folder / PID_FILE).unlink(missing_ok=True)
    return True


def stop_all_local_scorers() -> list[str]:
    """Stop every local scorer of this volume root (``make stop``); the pipelines stopped."""
    root = get_settings().volume_root / "_scoring"
    stopped = []
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if folder.is_dir() and stop_local_scorer(folder.name):
            stopped.append(folder.name)
    return stopped


def start_local_scorer(pipeline: str, timeout_s: float = 60.0) -> int:
    """Start (or restart) the pipeline's scorer as a detached, supervised process.

    ``python -m trainyard score-stream --pipeline P --supervise`` in a session of its own,
    its pid in ``<volume root>/_scoring/<P>/scorer.pid``, its log in ``scorer.log``, its
    progress in ``status.json``. A running one is stopped first (it commits what it has
    in flight), so the new one reads the current config.

    Returns:
        The supervisor's pid.

    Raises:
        ConfigError: If the pipeline has no ``scoring.stream``.
        RedisServerError, StreamError: If its Redis server cannot be started or reached.
        TrainyardError: If it exits or reports nothing within ``timeout_s`` (with its log).
    """
    from trainyard.contracts import load_contract

    cfg = load_pipeline(pipeline)
    streams_of(cfg)
    # what the new scorer would fail on, before the running one is stopped
    ensure_own_names(cfg)
    RecordChecker(load_contract(cfg.dataset))
    if cfg.scoring.stream is not None and cfg.scoring.stream.engine == "redis":
        open_engine(cfg).close()  # the Redis server answers (started if it is ours)
    folder = scorer_dir(pipeline)
    folder.mkdir(parents=True, exist_ok=True)
    # Two deploys at once: the second waits, then stops the first one's scorer and starts
    # its own, so one scorer (the pid file's) runs.
    with open(folder / START_LOCK, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(pipeline, folder, timeout_s)


def _start_locked(pipeline: str, folder: Path, timeout_s: float) -> int:
    import trainyard

    stop_local_scorer(pipeline)
    status = folder / STATUS_FILE
    status.unlink(missing_ok=True)
    plugins_dir = str(Path(trainyard.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugins_dir, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable, "-m", "trainyard", "score-stream", "--pipeline", pipeline,
        "--supervise", "--status-file", str(status),
    ]  # fmt: skip
    log_path = folder / LOG_FILE
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    (folder / PID_FILE).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrainyardError(f"scorer of {pipeline} exited ({proc.returncode}); log {log_path}")
        if status.is_file():
            return proc.pid
        time.sleep(0.1)
    raise TrainyardError(
        f"scorer of {pipeline} reported nothing in {timeout_s:.0f}s; log {log_path}"
    )
