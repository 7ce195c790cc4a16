"""The fork server: a pod forked from a warm parent is the process a launcher would start.

Real processes throughout: the server imports TensorFlow and Great Expectations once,
then forks ``python -m trainyard ...`` pods; each is compared with the same command
started as a plain process.
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

from tests.support.ports import free_port
from trainyard.forkserver import ForkedProcess, pods, socket_path, spawn, stop_servers

ROOT = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, "-m", "trainyard", "pipelines", "check"]


@pytest.fixture(scope="module")
def warm_env() -> dict[str, str]:
    """This process's environment, with its fork server running."""
    env = dict(os.environ)
    spawn(CHECK, env).wait(120)  # the first request starts the server
    deadline = time.monotonic() + 180
    while not socket_path(env).exists():
        assert time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.2)
    return env


def _serve(tmp_path: Path) -> list[str]:
    (tmp_path / "base").mkdir(exist_ok=True)
    return [
        sys.executable, "-m", "trainyard", "serve", "--base-path", str(tmp_path / "base"),
        "--host", "127.0.0.1", "--port", str(free_port()),
    ]  # fmt: skip


def test_a_forked_pod_answers_as_a_plain_process_does(
    warm_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same output and exit code: its argv, its environment and its working folder apply."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "broken.yaml").write_text("dataset: [unclosed\n")
    monkeypatch.chdir(tmp_path)
    env = dict(warm_env, TRAINYARD_PIPELINES_DIR="pipelines")  # relative: the cwd counts
    forked = spawn(CHECK, env)
    assert isinstance(forked, ForkedProcess)
    assert forked.stdout is not None
    out = forked.stdout.read().decode()
    plain = spawn(CHECK, env, warm=False)
    assert isinstance(plain, subprocess.Popen)
    assert plain.stdout is not None
    expected = plain.stdout.read().decode()
    assert (forked.wait(60), out) == (plain.wait(60), expected)
    assert "broken.yaml" in out and forked.returncode != 0


def test_a_pod_leads_its_session_shows_its_argv_and_dies_with_its_launcher(
    warm_env: dict[str, str], tmp_path: Path
) -> None:
    argv = _serve(tmp_path)
    script = (
        "import sys, time; from trainyard.forkserver import spawn; "
        f"p = spawn({argv!r}, dict(__import__('os').environ)); "
        "print(type(p).__name__, p.pid, flush=True); time.sleep(600)"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", script], env=warm_env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        kind, pid = launcher.stdout.readline().split()
        assert kind == "ForkedProcess"
        pod = psutil.Process(int(pid))
        deadline = time.monotonic() + 30
        while pod.cmdline()[1:4] != ["-m", "trainyard", "serve"]:
            assert time.monotonic() < deadline, pod.cmdline()[:6]
            time.sleep(0.05)
        assert [a for a in pod.cmdline() if a] == argv
        assert os.getsid(pod.pid) == os.getpgid(pod.pid) == pod.pid
        assert pod not in psutil.Process().children(recursive=True)
        assert pods()[pod.pid] == launcher.pid
        launcher.kill()  # SIGKILL: nothing of the launcher's runs any more
        launcher.wait(30)
        _gone, alive = psutil.wait_procs([pod], timeout=15)
        assert alive == [], "the pod outlived its launcher"
    finally:
        launcher.kill()
        launcher.wait(30)


def test_a_killed_pod_reports_the_signal(warm_env: dict[str, str], tmp_path: Path) -> None:
    proc = spawn(_serve(tmp_path), warm_env)
    assert isinstance(proc, ForkedProcess)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL


def test_what_it_does_not_serve_starts_as_a_plain_process(warm_env: dict[str, str]) -> None:
    """Another program, the server turned off, an argv too long to show, another import
    environment (which another server serves)."""
    other = spawn([sys.executable, "-c", "print('plain')"], warm_env)
    assert isinstance(other, subprocess.Popen) and other.wait(30) == 0
    off = spawn(CHECK, warm_env, warm=False)
    assert isinstance(off, subprocess.Popen)
    off.wait(60)
    long = spawn([*CHECK, "x" * 5000], warm_env)
    assert isinstance(long, subprocess.Popen)
    long.wait(60)
    assert socket_path(warm_env) != socket_path(dict(warm_env, TF_CPP_MIN_LOG_LEVEL="3"))
    assert socket_path(warm_env) != socket_path(dict(warm_env, LD_PRELOAD="/x.so"))


def test_a_stopped_server_is_started_again_by_the_next_pod(warm_env: dict[str, str]) -> None:
    """``make stop`` ends the server; a pod meanwhile starts as a plain process."""
    assert socket_path(warm_env).name in stop_servers()
    deadline = time.monotonic() + 30
    while socket_path(warm_env).exists():
        assert time.monotonic() < deadline, "the stopped server left its socket"
        time.sleep(0.1)
    first = spawn(CHECK, warm_env)
    assert isinstance(first, subprocess.Popen)
    first.wait(60)
    deadline = time.monotonic() + 180
    while not isinstance(again := spawn(CHECK, warm_env), ForkedProcess):
        again.wait(60)
        assert time.monotonic() < deadline, "no server started again"
        time.sleep(0.5)
    again.wait(60)


def test_a_folder_others_can_enter_gets_no_server(
    warm_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request carries the pod's environment (passwords included): never to a socket in
    a folder somebody else could have put it in; no server is started there either."""
    import trainyard.forkserver as forkserver

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    linked = tmp_path / "linked"
    linked.symlink_to(socket_path(warm_env).parent)  # where the warm server listens
    for folder in (shared, linked):
        monkeypatch.setattr(forkserver, "_folder", lambda folder=folder: folder)
        proc = spawn(CHECK, warm_env)
        assert isinstance(proc, subprocess.Popen), folder
        proc.wait(60)
    time.sleep(1)
    assert list(shared.iterdir()) == []
