"""The embedded default's Redis server: Debian's ``redis-server`` run from ``.trainyard/redis``.

One server per checkout (``Settings.redis_dir``): ``data/`` (the append-only file, fsynced
every second), ``redis.sock`` (the only way in: no TCP port, the folder is 0700),
``redis.pid`` and ``redis.log``. :func:`ensure_running` starts it unless it already
answers (idempotent; a pid file left by a killed server is cleared), :func:`stop` shuts it
down (``make stop``). ``python -m trainyard.streaming.redis_server start|stop|status``.

The program comes from the ``redis-server`` Debian package, which ``scripts/system_deps.sh``
installs (``make test``); ``TRAINYARD_REDIS_SERVER`` names another binary.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainyard.errors import TrainyardError
from trainyard.fsutil import process_alive, terminate
from trainyard.settings import get_settings

SOCKET = "redis.sock"
PID_FILE = "redis.pid"
LOG_FILE = "redis.log"
CONF_FILE = "redis.conf"
START_LOCK = "start.lock"


class RedisServerError(TrainyardError):
    """The project's Redis server cannot be started or reached (the message says why)."""


def socket_path(redis_dir: Path | None = None) -> Path:
    """The server's Unix socket."""
    return Path(redis_dir or get_settings().redis_dir) / SOCKET


def url(redis_dir: Path | None = None) -> str:
    """The URL of the project's server (``unix://<dir>/redis.sock?db=0``)."""
    return f"unix://{socket_path(redis_dir)}?db=0"


def _binary() -> str:
    name = get_settings().redis_server
    found = shutil.which(name)
    if not found:
        raise RedisServerError(
            f"{name}: not found; install Debian's redis-server package "
            "(bash scripts/system_deps.sh, which make test runs) or set TRAINYARD_REDIS_SERVER"
        )
    return found


def _ping(sock: Path, timeout: float = 0.5) -> bool:
    """Whether a Redis server answers PING on the socket within ``timeout``."""
    import redis

    from trainyard.streaming.redis_client import redis_client

    client = redis_client(f"unix://{sock}", timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.connection_pool.disconnect()


def _read_pid(redis_dir: Path) -> int | None:
    try:
        return int((redis_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_redis(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"redis-server" in cmdline


def is_running(redis_dir: Path | None = None) -> bool:
    """Whether the project's server answers on its socket."""
    return _ping(socket_path(redis_dir))


def _quoted(path: Path) -> str:
    """A path as a Redis config value: quoted, so a folder with spaces reads whole."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _config(redis_dir: Path) -> str:
    data = redis_dir / "data"
    return "\n".join(
        [
            "port 0",  # no TCP: the Unix socket only
            f"unixsocket {_quoted(redis_dir / SOCKET)}",
            "unixsocketperm 700",
            "daemonize yes",
            f"pidfile {_quoted(redis_dir / PID_FILE)}",
            f"logfile {_quoted(redis_dir / LOG_FILE)}",
            f"dir {_quoted(data)}",
            # no client reconfigures it at run time (CONFIG SET port 6379 would open TCP)
            'rename-command CONFIG ""',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            "protected-mode yes",
            "",
        ]
    )


def ensure_running(redis_dir: Path | None = None, timeout_s: float = 15.0) -> str:
    """Start the project's Redis server unless it already answers.

    Args:
        redis_dir: Its folder (default ``Settings.redis_dir``).
        timeout_s: How long to wait for it to answer.

    Returns:
        Its URL (:func:`url`).

    Raises:
        RedisServerError: If ``redis-server`` is missing, the socket path is too long, or
            the server does not answer in time (with the tail of its log).
    """
    redis_dir = Path(redis_dir or get_settings().redis_dir).resolve()
    sock = redis_dir / SOCKET
    if len(os.fsencode(sock)) > 107:
        raise RedisServerError(f"{sock}: socket path longer than 107 bytes; use a shorter folder")
    if _ping(sock):
        return url(redis_dir)
    binary = _binary()
    redis_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(redis_dir, 0o700)
    (redis_dir / "data").mkdir(exist_ok=True)
    # Scorers restarted at once (after a Redis kill) all find no answer: one starts the
    # server, the others wait for it. Two servers on one append-only file lose writes.
    with open(redis_dir / START_LOCK, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ping(sock):
            return url(redis_dir)
        pid = _read_pid(redis_dir)
        done: subprocess.CompletedProcess[str] | None = None
        if pid is not None and not (_alive(pid) and _is_redis(pid)):
            (redis_dir / PID_FILE).unlink(missing_ok=True)  # left by a killed server
            pid = None
        if pid is None:  # else ours is alive, still loading its append-only file: wait
            sock.unlink(missing_ok=True)
            conf = redis_dir / CONF_FILE
            conf.write_text(_config(redis_dir))
            done = subprocess.run(
                [binary, str(conf)], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _ping(sock):
                return url(redis_dir)
            time.sleep(0.05)
    how = f"exit {done.returncode}: {done.stderr.strip()[-300:]}" if done else f"pid {pid}"
    raise RedisServerError(
        f"redis-server did not answer on {sock} within {timeout_s:.0f}s "
        f"({how}); log {redis_dir / LOG_FILE}:\n" + _tail(redis_dir / LOG_FILE)
    )


def stop(redis_dir: Path | None = None, timeout_s: float = 15.0) -> bool:
    """Shut the project's server down (SIGTERM: it flushes its append-only file; then SIGKILL).

    Returns:
        True if a running server was stopped.
    """
    redis_dir = Path(redis_dir or get_settings().redis_dir)
    pid = _read_pid(redis_dir)
    if pid is None or not _alive(pid) or not _is_redis(pid):
        (redis_dir / PID_FILE).unlink(missing_ok=True)
        return False
    terminate(pid, timeout_s)
    (redis_dir / PID_FILE).unlink(missing_ok=True)
    return True


def _alive(pid: int) -> bool:
    return process_alive(pid)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.streaming.redis_server start|stop|status``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in (["start"], ["stop"], ["status"]):
        sys.stderr.write("usage: python -m trainyard.streaming.redis_server start|stop|status\n")
        return 2
    try:
        if args == ["start"]:
            print(f"redis running: {ensure_running()}")
        elif args == ["stop"]:
            print("redis stopped" if stop() else "redis was not running")
        else:
            up = is_running()
            print(f"redis {'running' if up else 'not running'}: {url()}")
            return 0 if up else 1
    except RedisServerError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
