"""The loopback preload library, and who gets it: local workers only, never pods.

The library is the one ``make native`` built from ``plugins/trainyard/training/_loopback.c``
(``setup.py``, in place), preloaded into real Python processes that bind and listen; what
they listen on is read back from ``/proc``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.net import is_loopback
from trainyard import k8s
from trainyard.config import parse_pipeline
from trainyard.errors import TrainingError
from trainyard.training import launcher, spec
from trainyard.training.launcher import LaunchSpec, TaskSpec, launch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD, /proc")

# Binds and listens the ways a server does, then prints what it listens on.
LISTENER = r"""
import json, os, socket, sys
sys.path.insert(0, sys.argv[1])
from tests.support.net import listen_addresses
socks = []
def sock(family, v6only=None):
    s = socket.socket(family, socket.SOCK_STREAM)
    if v6only is not None:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
    socks.append(s)
    return s
sock(socket.AF_INET).bind(("0.0.0.0", 0))
sock(socket.AF_INET6, 0).bind(("::", 0))
sock(socket.AF_INET6, 1).bind(("::", 0))
sock(socket.AF_INET)  # listen() without bind(): the kernel would pick the wildcard
sock(socket.AF_INET).bind(("127.0.0.1", 0))
for s in socks:
    s.listen()
dual = socks[1].getsockname()[1]
socket.create_connection(("127.0.0.1", dual), timeout=5).close()  # IPv4 clients still reach it
print(json.dumps(listen_addresses([os.getpid()])))
"""


@pytest.fixture(scope="module")
def library() -> Path:
    # the library `make native` built (pip install -e .: setup.py builds it in place)
    out = launcher.LOOPBACK_LIBRARY
    assert out.name == "_loopback.so" and out.is_file(), "run: make native"
    return out


def _listen(env: dict[str, str]) -> list[tuple[int, str, int]]:
    proc = subprocess.run(
        [sys.executable, "-c", LISTENER, str(ROOT)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [tuple(row) for row in json.loads(proc.stdout)]


def test_without_the_library_wildcard_binds_listen_everywhere() -> None:
    shown = {a for _pid, a, _port in _listen({spec.ENV_BIND: "127.0.0.1"})}
    assert {"0.0.0.0", "::"} <= shown


def test_the_library_keeps_every_listener_on_loopback(library: Path) -> None:
    rows = _listen({"LD_PRELOAD": str(library), spec.ENV_BIND: "127.0.0.1"})
    assert sorted(a for _pid, a, _port in rows) == [
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
    ]
    assert all(is_loopback(a) for _pid, a, _port in rows)


def test_the_library_changes_nothing_unless_asked(library: Path) -> None:
    shown = {a for _pid, a, _port in _listen({"LD_PRELOAD": str(library)})}
    assert {"0.0.0.0", "::"} <= shown


def test_a_malformed_bind_address_fails_the_bind(library: Path) -> None:
    env = {**os.environ, "LD_PRELOAD": str(library), spec.ENV_BIND: "localhost"}
    code = "import socket; socket.socket().bind(('0.0.0.0', 0))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Cannot assign requested address" in proc.stderr


def test_launcher_refuses_to_start_workers_without_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "started"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    plan = LaunchSpec(
        tasks=[TaskSpec("worker:0", argv, dict(os.environ), "job-w-0.t")],
        start_deadline_s=10,
        attempt_timeout_s=10,
        max_attempts=3,
    )
    monkeypatch.setattr(launcher, "LOOPBACK_LIBRARY", tmp_path / "_loopback.so")
    lines: list[str] = []
    with pytest.raises(TrainingError, match="refusing to start them") as err:
        launch(plan, lines.append)
    assert str(tmp_path / "_loopback.so") in str(err.value)
    assert "make native" in str(err.value)
    assert err.value.retryable is False  # type: ignore[attr-defined]
    assert lines == [] and not marker.exists()  # no attempt, no process


def test_launcher_gives_every_task_the_library(tmp_path: Path) -> None:
    assert launcher.LOOPBACK_LIBRARY.is_file(), "run: make native"
    out = tmp_path / "env.json"
    code = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    env = {**os.environ, "LD_PRELOAD": "/other/lib.so", "PYTHONPATH": str(ROOT / "plugins")}
    plan = LaunchSpec(
        tasks=[TaskSpec("worker:0", [sys.executable, "-c", code], env, "job-w-0.t")],
        start_deadline_s=30,
        attempt_timeout_s=30,
        max_attempts=1,
    )
    launch(plan, lambda _line: None)
    seen = json.loads(out.read_text())
    assert seen["LD_PRELOAD"] == f"{launcher.LOOPBACK_LIBRARY} /other/lib.so"
    assert seen[spec.ENV_BIND] == "127.0.0.1"


def test_a_worker_whose_library_did_not_load_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update({spec.ENV_BIND: "127.0.0.1", "PYTHONPATH": str(ROOT / "plugins")})
    args = ["--snapshot-dir", "/x", "--contract", "/x.yaml", "--model", "mlp"]
    args += ["--strategy", "multi_worker_mirrored", "--epochs", "1", "--batch-size", "8"]
    args += ["--learning-rate", "0.1", "--checkpoint-dir", "/c", "--output-dir", "/o"]
    proc = subprocess.run(
        [sys.executable, "-m", "trainyard", "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    from trainyard.training.worker.main import EXIT_BAD_INPUT

    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert "gives 0.0.0.0: the loopback library is not preloaded" in proc.stderr


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_pods_never_get_the_library(strategy: str) -> None:
    cfg = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
    training = cfg.training.model_copy(update={"strategy": strategy, "parameter_servers": 1})
    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    objects = k8s.run_training_objects(profile, cfg, training, "0123456789abcdef", "r")
    for job in objects.jobs:
        for container in job.spec.template.spec.containers:
            names = {e.name for e in container.env or []}
            assert not names & {"LD_PRELOAD", spec.ENV_BIND}, (job.metadata.name, names)
