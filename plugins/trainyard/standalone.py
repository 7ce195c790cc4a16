"""``make standalone``: Airflow standalone for this checkout, and all of it stopped after.

``python -m trainyard.standalone run [--port N]`` runs ``airflow standalone`` in a process
group of its own and records it in ``$AIRFLOW_HOME/standalone.json``. Stopping it (Ctrl-C,
SIGTERM to this process as ``kill %1`` sends, or ``python -m trainyard.standalone stop``,
which ``make stop`` runs) sends SIGTERM to that whole group and SIGKILL to what is left of
it after :data:`GRACE_S`: on SIGTERM Airflow 3.3's scheduler waits for its LocalExecutor
workers, which do not exit, so a plain SIGTERM left the scheduler and its workers running.

``make standalone`` first runs ``check``, which refuses a second standalone of the
checkout before anything touches its database. The API port and the log servers' ports
(which Airflow binds on every interface) are checked free before Airflow starts.

``--port`` (``make standalone AIRFLOW_PORT=N``) moves the API server and, with it, the
execution API URL the workers call (Airflow's ``[core] execution_api_server_url``, which
otherwise still names 8080 and every task fails before it starts).

``airflow standalone`` does not notice when one of its components dies (a scheduler
killed stayed a zombie, and runs queued for ever): the wrapper watches them every
:data:`WATCH_S` and, when one has exited, says which and stops the rest, so ``make
standalone`` ends with the reason instead of stalling.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from trainyard import argtypes
from trainyard.errors import ConfigError
from trainyard.fsutil import atomic_write_json, read_json

DEFAULT_PORT = 8080
GRACE_S = 10.0
"""How long the group gets after SIGTERM before SIGKILL."""
RECORD = "standalone.json"
WATCH_S = 2.0
"""How often the wrapper checks that Airflow's components still run."""
COMPONENTS = ("scheduler", "dag-processor", "api-server", "triggerer")
"""What ``airflow standalone`` runs, each as its child process ``airflow <name>``."""
LOG_SERVERS = {
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": 8793,
    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": 8794,
}
"""The ports of the log servers standalone starts, and Airflow's defaults."""
LOG_SERVER_NAMES = {
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": "worker",
    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": "triggerer",
}


def record_path() -> Path:
    """Where the running standalone of this checkout is recorded."""
    home = os.environ.get("AIRFLOW_HOME")
    if not home:
        raise ConfigError("AIRFLOW_HOME is not set: source scripts/env.sh first")
    return Path(home) / RECORD


def group_members(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of a process group."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def stop_group(pgid: int, grace_s: float = GRACE_S) -> int:
    """SIGTERM a process group, SIGKILL what is left of it after ``grace_s``.

    Returns:
        How many processes were still in the group when it was sent SIGKILL.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = group_members(pgid)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        psutil.wait_procs(left, timeout=10)
    return len(left)


def exited_components(pid: int, seen: dict[str, int]) -> list[str]:
    """The components of the standalone ``pid`` that have exited since they were seen.

    Args:
        pid: The ``airflow standalone`` process.
        seen: Component name → its process id, filled in as each is first seen running.

    Returns:
        The names of those that are gone or zombies (nobody waits for them).
    """
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    alive = set()
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            alive.add(child.pid)
            if child.pid in seen.values():  # its command line may change (uvicorn's does)
                continue
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        name = next((c for c in cmdline[-1:] if c in COMPONENTS), None)
        if name is not None and "airflow" in " ".join(cmdline[:-1]):
            seen.setdefault(name, child.pid)
    return [name for name, child_pid in seen.items() if child_pid not in alive]


def _stop_asked(path: Path) -> bool:
    """Whether ``stop`` has marked the record (or removed it): Airflow is being stopped."""
    try:
        return "stopped_by" in read_json(path)
    except (OSError, ValueError, TypeError):
        return True


def _running() -> dict[str, Any] | None:
    """The recorded standalone if its process group is still alive, else None."""
    path = record_path()
    try:
        rec = read_json(path)
        pgid = int(rec["pgid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rec if group_members(pgid) else None


def stop() -> str:
    """Stop this checkout's standalone, if one runs; say what was done."""
    rec = _running()
    path = record_path()
    if rec is None:
        path.unlink(missing_ok=True)
        return "Airflow standalone: not running"
    # said first: the wrapper, seeing Airflow exit, must know it was asked to
    atomic_write_json(path, {**rec, "stopped_by": os.getpid()})
    killed = stop_group(int(rec["pgid"]))
    path.unlink(missing_ok=True)
    forced = f" ({killed} processes needed SIGKILL)" if killed else ""
    return f"Airflow standalone stopped (port {rec.get('port')}){forced}"


def ensure_not_running() -> None:
    """Refuse when this checkout's standalone runs.

    Raises:
        ConfigError: Naming its port and process group.
    """
    rec = _running()
    if rec is not None:
        raise ConfigError(
            f"Airflow standalone already runs for this checkout (port {rec.get('port')}, "
            f"process group {rec['pgid']}): stop it first (make stop)"
        )


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def run(port: int | None = None) -> int:
    """Run ``airflow standalone`` until it exits or this process is told to stop.

    Returns:
        Its exit code (0 when stopped by a signal).

    Raises:
        ConfigError: If one runs already for this checkout, or the port is taken.
    """
    ensure_not_running()
    env = dict(os.environ)
    port = port or int(env.get("AIRFLOW__API__PORT") or DEFAULT_PORT)
    host = env.get("AIRFLOW__API__HOST") or "127.0.0.1"
    if not _port_free(host, port):
        raise ConfigError(
            f"port {port} on {host} is taken (another Airflow?): choose another, e.g. "
            f"make standalone AIRFLOW_PORT={port + 10000 if port < 55535 else 18080}"
        )
    for variable, default in LOG_SERVERS.items():  # they bind every interface
        log_port = int(env.get(variable) or default)
        if not _port_free("", log_port):
            raise ConfigError(
                f"port {log_port} (Airflow's {LOG_SERVER_NAMES[variable]} log server) is "
                f"taken (another Airflow?): export {variable}=<a free port>"
            )
    env["AIRFLOW__API__PORT"] = str(port)
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    env.setdefault("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", f"http://{local}:{port}/execution/")
    proc = subprocess.Popen(["airflow", "standalone"], env=env, start_new_session=True)
    path = record_path()
    atomic_write_json(path, {"pid": proc.pid, "pgid": proc.pid, "port": port})
    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        print(f"\nstopping Airflow standalone ({signal.Signals(signum).name})", flush=True)
        stop_group(proc.pid)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    seen: dict[str, int] = {}
    exited: list[str] = []
    try:
        while True:
            try:
                code = proc.wait(timeout=WATCH_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if not stopping and (exited := exited_components(proc.pid, seen)):
                if _stop_asked(path):  # `stop` (make stop) is ending them all
                    exited = []
                    continue
                print(
                    f"\nAirflow's {' and '.join(exited)} exited, and airflow standalone "
                    "goes on without it (runs would stay queued): stopping the rest; start "
                    "it again with make standalone (the model server keeps serving)",
                    flush=True,
                )
                stop_group(proc.pid)
                code = proc.wait()
                break
    finally:
        stop_group(proc.pid)  # what it left: the scheduler's workers
        try:
            rec = read_json(path)
            stopped_by_stop = int(rec["pgid"]) != proc.pid or "stopped_by" in rec
        except (OSError, ValueError, KeyError, TypeError):
            stopped_by_stop = True  # `stop` removed the record
        if not stopped_by_stop:
            path.unlink(missing_ok=True)
    if stopped_by_stop and not stopping:
        print("Airflow standalone stopped (make stop)", flush=True)
    if exited:
        return 1
    return 0 if stopping or stopped_by_stop else code


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.standalone run [--port N] | stop``."""
    os.umask(0o077)  # Airflow's generated passwords, logs and database: its owner's only
    parser = argtypes.ArgumentParser(prog="python -m trainyard.standalone", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("run", help="run Airflow standalone in the foreground")
    start.add_argument("--port", type=int, help=f"API server port (default {DEFAULT_PORT})")
    sub.add_parser("stop", help="stop the standalone this checkout runs, all of it")
    sub.add_parser("check", help="refuse now if one runs for this checkout (make's first step)")
    args = parser.parse_args(argv)
    try:
        if args.command == "stop":
            print(stop())
            return 0
        if args.command == "check":
            ensure_not_running()
            return 0
        if args.port is not None and not 0 < args.port < 65536:
            parser.error(f"--port {args.port}: not a TCP port")
        return run(args.port)
    except ConfigError as e:
        sys.stderr.write(f"make standalone: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
