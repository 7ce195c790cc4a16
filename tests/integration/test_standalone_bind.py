"""``make standalone`` runs Airflow's API server on loopback unless the caller says otherwise.

``airflow standalone`` starts ``airflow api-server`` with its own environment
(``StandaloneCommand.calculate_env`` copies ``os.environ``), and that command's ``--host``
defaults to ``[api] host`` (``AIRFLOW__API__HOST``), which Airflow defaults to 0.0.0.0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.net import is_loopback, listen_addresses
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

# what standalone hands its api-server subcommand, and the host that subcommand parses
PROBE = """
from airflow.cli.commands.standalone_command import StandaloneCommand
from airflow.cli.cli_parser import get_parser
env = StandaloneCommand().calculate_env()
print(env.get("AIRFLOW__API__HOST"), get_parser().parse_args(["api-server"]).host)
"""


def _project_env(airflow_home: Path, **given: str) -> dict[str, str]:
    """This environment without any API setting, plus ``given``, with its own Airflow home.

    Its metadata database is SQLite in that home (one process here, the api-server), not
    the project's PostgreSQL that ``scripts/env.sh`` names by default.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__API__")}
    db = f"sqlite:///{airflow_home / 'airflow.db'}"
    return {
        **env,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
        **given,
    }


def _in_project_env(command: list[str], env: dict[str, str], **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        ["bash", "-c", '. scripts/env.sh && exec "$@"', "env.sh", *command],
        cwd=ROOT,
        env=env,
        text=True,
        **kw,
    )


def test_make_standalone_runs_airflow_in_the_project_env() -> None:
    def plan(*variables: str) -> str:
        out = subprocess.run(
            ["make", "-n", "standalone", *variables],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    # in a process group of its own, which Ctrl-C, kill %1 and make stop stop whole
    assert ". scripts/env.sh && python -m trainyard.standalone run \n" in plan()
    assert "python -m trainyard.standalone run --port 18080" in plan("AIRFLOW_PORT=18080")


@pytest.mark.parametrize(
    ("given", "host"),
    [({}, "127.0.0.1"), ({"AIRFLOW__API__HOST": "0.0.0.0"}, "0.0.0.0")],
    ids=["default-loopback", "caller-overrides"],
)
def test_standalone_api_server_host(given: dict[str, str], host: str, tmp_path: Path) -> None:
    proc = _in_project_env(
        [sys.executable, "-c", PROBE],
        _project_env(tmp_path / "airflow", **given),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert out.split()[-2:] == [host, host]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_real_api_server_listens_on_loopback_only(tmp_path: Path) -> None:
    env = _project_env(tmp_path / "airflow")
    migrate = _in_project_env(
        ["airflow", "db", "migrate"], env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert migrate.wait(timeout=180) == 0, migrate.stderr.read()[-2000:] if migrate.stderr else ""
    port = free_port()
    log = (tmp_path / "api-server.log").open("w")
    server = _in_project_env(
        ["airflow", "api-server", "--port", str(port)],
        env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        listening: list[tuple[int, str, int]] = []
        deadline = time.monotonic() + 120
        while not listening and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            root = psutil.Process(server.pid)
            pids = [root.pid, *(c.pid for c in root.children(recursive=True))]
            listening = [row for row in listen_addresses(pids) if row[2] == port]
        assert listening, (tmp_path / "api-server.log").read_text()[-3000:]
        assert all(is_loopback(address) for _pid, address, _port in listening), listening
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
