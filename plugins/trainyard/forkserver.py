"""A warm parent for local pod processes: TensorFlow and Great Expectations imported once.

Every local pod is ``python -m trainyard <step> ...``, and each of those that trains,
evaluates or validates spends 4-5 CPU seconds importing TensorFlow or Great Expectations
before its first line of work. The fork server imports them once; a pod process is then a
``fork()`` of it that runs ``trainyard``'s ``__main__`` with the pod's argv, environment and
working folder, in its own session, its output on the pipe the launcher reads.

What the launcher relies on stays true of a forked process: its pid leads its own process
group (``os.killpg`` stops it); its exit code or signal is the launcher's ``returncode``;
``/proc/<pid>/cmdline`` shows the pod's argv (written over the server's own, which holds a
placeholder of :data:`ARGV_ROOM` bytes; unused room reads as empty arguments). Its parent is a small
process of the server's that waits for it and lives exactly as long as the launcher's
connection (its argv names the launcher's pid: :func:`pods`): if the launcher dies, that
parent SIGKILLs the pod's group and exits, and a training worker (which dies with its
parent, ``TRAINYARD_PARENT_PID``) watches that parent instead of the launcher.

The server serves only requests whose import-time environment (:data:`IMPORT_ENV`), Python
and fork server code match its own: the socket's name is a hash of them, so another
environment (or an edited server) gets another server. It starts on first use (that pod
starts as a plain process), listens on a Unix socket in an owner-only folder, and exits
after :data:`IDLE_S` seconds without a request (``make stop`` ends it sooner).
``TRAINYARD_FORK_SERVER=0`` turns it off (every pod a plain process).

This file runs as the server with ``python -P`` and imports nothing of ``trainyard``: a
forked pod imports the project from its own ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PRELOAD = ("tensorflow", "tf_keras", "great_expectations")
"""Modules the server imports before it forks (what a pod would import at start)."""

IMPORT_ENV = (
    "TF_USE_LEGACY_KERAS",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "GX_ANALYTICS_ENABLED",
)
"""Variables read while those modules import: a request must match the server's."""

IDLE_S = 120.0
ARGV_ROOM = 4096
"""Bytes of argv a forked process can show (``/proc/<pid>/cmdline``); a longer one execs."""


def _folder() -> Path:
    return Path("/tmp") / f"trainyard-forkserver-{os.getuid()}"


@functools.cache
def _code() -> str:
    """This file's hash: a server runs the code it started with, so a change starts another."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def socket_path(env: Mapping[str, str], python: str = sys.executable) -> Path:
    """The socket of the server that serves processes of this environment and Python."""
    key = json.dumps([os.path.realpath(python), [env.get(k) for k in IMPORT_ENV], _code()])
    return _folder() / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock"


# --------------------------------------------------------------------------- client


class ForkedProcess:
    """A pod process the server forked, used as :class:`subprocess.Popen` is.

    Args:
        conn: The connection its parent reports the exit status on.
        pid: Its pid (the leader of its own process group).
        stdout: The read end of its stdout and stderr.
    """

    def __init__(self, conn: socket.socket, pid: int, stdout: IO[bytes]) -> None:
        self._conn = conn
        self._buf = b""
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process (not its group), unless it has ended."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM the process."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the process."""
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        """The exit code (negative: the signal), or None while it runs."""
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        """Block until it ends.

        Raises:
            subprocess.TimeoutExpired: If it runs ``timeout`` seconds more.
        """
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(["trainyard", str(self.pid)], timeout or 0)
        return code

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                return None
            chunk = self._conn.recv(64)
            if not chunk:  # the server's side died: the pod's parent is gone
                self._buf += b'{"code": -9}\n'
            self._buf += chunk
        self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["code"])
        self._conn.close()
        return self.returncode


def spawn(
    argv: Sequence[str], env: Mapping[str, str], *, warm: bool = True
) -> ForkedProcess | subprocess.Popen[bytes]:
    """Start ``argv`` as a pod process: forked from the server when one serves it.

    Output (stdout and stderr) comes on ``.stdout``; stdin is ``/dev/null``; the process
    leads its own session. An argv that is not ``<this python> -m trainyard ...``, a server
    that is not running yet (it is started for the next pod) or turned off: a plain process.

    Args:
        argv: The command.
        env: Its whole environment.
        warm: Use the fork server (``TRAINYARD_FORK_SERVER``, on by default).

    Returns:
        The process.
    """
    forked = None
    ours = sys.platform.startswith("linux")  # pidfd, /proc
    ours = ours and len(argv) > 3 and list(argv[1:3]) == ["-m", "trainyard"]
    ours = ours and sum(len(a.encode()) + 1 for a in argv) <= ARGV_ROOM
    if warm and ours and os.path.realpath(argv[0]) == os.path.realpath(sys.executable):
        forked = _request(argv, env)
    if forked is not None:
        return forked
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _request(argv: Sequence[str], env: Mapping[str, str]) -> ForkedProcess | None:
    path = socket_path(env, argv[0])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not _ours_alone(path.parent):  # the pod's environment goes to whoever listens
            raise FileNotFoundError(path.parent)
        conn.connect(str(path))
    except OSError:
        conn.close()
        _start_server(path, env, argv[0])
        return None
    read, write = os.pipe()
    try:
        body = json.dumps({"argv": list(argv), "env": dict(env), "cwd": os.getcwd()}).encode()
        conn.sendall(len(body).to_bytes(8, "big"))
        socket.send_fds(conn, [body], [write])
        os.close(write)
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                raise OSError("the fork server closed the connection")
            line += chunk
        pid = int(json.loads(line)["pid"])
    except (OSError, ValueError, KeyError):
        conn.close()
        os.close(read)
        with contextlib.suppress(OSError):
            os.close(write)
        return None
    return ForkedProcess(conn, pid, os.fdopen(read, "rb"))


def _ours_alone(folder: Path) -> bool:
    """Whether ``folder`` is a directory (not a link) only this account can enter."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _start_server(path: Path, env: Mapping[str, str], python: str) -> None:
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(mode=0o700)
    if not _ours_alone(path.parent):
        return  # somebody else's folder: plain processes, and no server
    server_env = {k: env[k] for k in IMPORT_ENV if k in env}
    server_env.update(
        PATH=env.get("PATH", os.defpath),
        LANG=env.get("LANG", "C.UTF-8"),
        PYTHONUNBUFFERED="1",
    )
    with open(path.with_suffix(".log"), "ab") as log:
        subprocess.run(  # the server forks and this process ends: it is nobody's child
            [python, "-P", __file__, str(path), " " * ARGV_ROOM],
            env=server_env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            check=False,
            timeout=60,
        )


def _servers() -> list[Any]:
    """This account's running fork servers (psutil processes), by their lock files."""
    import psutil

    found = []
    for lock in sorted(_folder().glob("*.lock")) if _folder().is_dir() else []:
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            server = psutil.Process(int(lock.read_text().strip()))
            if str(lock.with_suffix(".sock")) in server.cmdline():  # not a reused pid
                found.append(server)
    return found


def stop_servers() -> list[str]:
    """SIGTERM this Python's fork servers (``make stop``); their sockets' names."""
    import psutil

    stopped = []
    for server in _servers():
        with contextlib.suppress(psutil.Error):
            python, sock = server.cmdline()[0], server.cmdline()[3]
            if os.path.realpath(python) == os.path.realpath(sys.executable):
                server.terminate()
                stopped.append(Path(sock).name)
    return stopped


def pods() -> dict[int, int]:
    """Every running pod process the fork servers of this account forked: pid to launcher."""
    import psutil

    found = {}
    for server in _servers():
        with contextlib.suppress(psutil.Error):
            for parent in server.children():
                argv = [a for a in parent.cmdline() if a]  # the room left reads as empty
                if argv[-2:-1] == ["--launcher"]:
                    found.update({pod.pid: int(argv[-1]) for pod in parent.children()})
    return found


# --------------------------------------------------------------------------- server


def serve(path: Path) -> None:
    """Import :data:`PRELOAD`, then fork a pod process for every request until idle."""
    import fcntl

    if os.fork():
        os._exit(0)
    lock = open(path.with_suffix(".lock"), "a+")  # noqa: SIM115 - held for the server's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server of this key is starting or running
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    for name in PRELOAD:
        __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    try:
        while select.select([listener], [], [], IDLE_S)[0]:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                lock.close()
                _handle(conn)  # never returns
            conn.close()
    finally:
        path.unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)


def _handle(conn: socket.socket) -> None:
    """In a fork of the server: fork the pod's process, then report how it ended."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        launcher = int.from_bytes(creds[:4], sys.byteorder)
        size = int.from_bytes(_recv_exact(conn, 8), "big")
        body, fds, _, _ = socket.recv_fds(conn, size, 1)
        while len(body) < size:
            body += _recv_exact(conn, size - len(body))
        request = json.loads(body)
        _show_argv([sys.executable, "-P", __file__, "--launcher", str(launcher)])
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run_pod(request, fds[0], launcher)  # never returns
        os.close(fds[0])
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        code = _watch(conn, pid)
        conn.sendall(json.dumps({"code": code}).encode() + b"\n")
        code = 0
    finally:
        os._exit(code)


def _watch(conn: socket.socket, pid: int) -> int:
    """The pod's exit code; if the launcher goes first, its group is killed."""
    pidfd = os.pidfd_open(pid)
    while True:
        ready = select.select([pidfd, conn.fileno()], [], [])[0]
        if conn.fileno() in ready and not conn.recv(1):  # the launcher died
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if pidfd in ready:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("the launcher closed the connection")
        data += chunk
    return data


def _run_pod(request: dict[str, Any], out: int, launcher: int) -> None:
    """Become the pod's process: session, output, environment, argv; run trainyard."""
    import atexit
    import io
    import runpy
    import traceback

    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
        )
        env = dict(request["env"])
        if env.get("TRAINYARD_PARENT_PID") == str(launcher):
            env["TRAINYARD_PARENT_PID"] = str(os.getppid())  # this pod's parent stands in
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [*extra, *[p for p in sys.path if p not in extra]]
        argv = request["argv"]
        import numpy

        numpy.random.seed()  # a fresh process seeds from the OS; a fork would share the server's
        _show_argv(argv)
        sys.argv = ["-m", *argv[3:]]
        try:
            runpy.run_module("trainyard", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except BaseException:  # an uncaught error ends the process as Python's would
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


def _show_argv(argv: list[str]) -> None:
    """Write ``argv`` over this process's own (what ``ps`` and ``/proc/<pid>/cmdline`` show)."""
    import ctypes

    line = Path("/proc/self/stat").read_text()
    fields = line[line.rindex(")") + 2 :].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    data = b"\0".join(a.encode() for a in argv) + b"\0"
    if len(data) <= end - start:
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
