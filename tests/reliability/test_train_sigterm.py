"""SIGTERM while training (Airflow killing or timing out ``train``) ends it failed, for good.

Real runs on a tiny snapshot, signalled mid-epoch: every worker dies, no other attempt
starts, nothing is exported, registered or returned as a result. Airflow's task runner
handles SIGTERM by calling the operator's ``on_kill`` and returning, so a handler that
returns is tested too, not only Python's default.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.trainer import make_files_snapshot
from trainyard.errors import TrainingTerminated
from trainyard.layout import Layout
from trainyard.steps import EXIT_DETERMINISTIC, deterministic

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 40

# Airflow's task runner: SIGTERM calls the operator's on_kill, then returns.
AIRFLOW_LIKE = """
import json, signal, sys
from pathlib import Path
sys.path.insert(0, {plugins!r})
from trainyard.config import parse_pipeline
from trainyard.training.launcher import run_training
signal.signal(signal.SIGTERM, lambda signum, frame: print("on_kill", flush=True))
cfg = parse_pipeline(Path({pipeline!r}))
params = cfg.training.model_copy(update={{"epochs": {epochs}, "max_attempts": 3}})
try:
    run_training(cfg, params, {snapshot!r}, run_id="term", log=lambda l: print(l, flush=True))
    outcome = {{"error": None}}
except Exception as e:
    outcome = {{"error": type(e).__name__, "message": str(e),
               "retryable": getattr(e, "retryable", True)}}
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


def _snapshot(volume_root: Path) -> str:
    made = make_files_snapshot(volume_root / "incoming", n=600, shards=2)
    snapshot_id = json.loads((made / "manifest.json").read_text())["snapshot_id"]
    folder = volume_root / "digits" / "snapshots"
    folder.mkdir(parents=True)
    shutil.move(made, folder / snapshot_id)
    return snapshot_id


def _workers(pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if p.cmdline()[1:4] == ["-m", "trainyard", "worker"]:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _signal_mid_training(proc: subprocess.Popen[str], lines: list[str]) -> list[psutil.Process]:
    """Read its output until the second epoch runs, then SIGTERM it; returns its workers."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if f"Epoch 2/{EPOCHS}" in line:
            workers = _workers(proc.pid)
            assert len(workers) == 2, workers
            proc.send_signal(signal.SIGTERM)
            return workers
    proc.kill()
    pytest.fail("training never reached its second epoch:\n" + "\n".join(lines[-30:]))


def _finish(proc: subprocess.Popen[str], lines: list[str], timeout: float = 60) -> int:
    """The process's exit code once it ends (killed, and the test failed, if it does not)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    while proc.poll() is None and time.monotonic() < deadline:
        lines.extend(ln.rstrip() for ln in proc.stdout.readlines())
        time.sleep(0.2)
    if proc.poll() is None:
        for w in _workers(proc.pid):
            w.kill()
        proc.kill()
        proc.wait()
        pytest.fail(f"still training {timeout:g}s after SIGTERM:\n" + "\n".join(lines[-30:]))
    lines.extend(ln.rstrip() for ln in proc.stdout.readlines())
    return proc.returncode


def _nothing_left(workers: list[psutil.Process], volume_root: Path) -> None:
    _gone, alive = psutil.wait_procs(workers, timeout=15)
    assert alive == [], f"workers outlived the terminated training: {[p.pid for p in alive]}"
    layout = Layout(volume_root)
    assert not list(Path(layout.models_root).glob("*/versions/*")), "a version was registered"
    assert not list(volume_root.rglob("saved_model.pb")), "a model was exported"


@pytest.mark.slow
def test_sigterm_of_cli_train_fails_and_registers_nothing(volume_root: Path, tmp_path: Path):
    snapshot_id = _snapshot(volume_root)
    xcom = tmp_path / "xcom" / "return.json"
    env = {
        **os.environ,
        "TRAINYARD_XCOM_PATH": str(xcom),
        "PYTHONPATH": str(ROOT / "plugins"),
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "trainyard", "train", "--pipeline", "digits"]
    argv += ["--snapshot-id", snapshot_id, "--run-id", "term"]
    argv += ["--overrides", json.dumps({"epochs": EPOCHS})]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    workers = _signal_mid_training(proc, lines)
    code = _finish(proc, lines)
    assert code == EXIT_DETERMINISTIC, "\n".join(lines[-30:])  # no orchestrator retries it
    assert any("TrainingTerminated: training stopped by SIGTERM" in line for line in lines)
    assert not xcom.exists(), "the step returned a result"
    assert not any("attempt 2: started" in line for line in lines), "\n".join(lines[-30:])
    _nothing_left(workers, volume_root)


@pytest.mark.slow
def test_sigterm_under_a_handler_that_returns_ends_training(volume_root: Path) -> None:
    snapshot_id = _snapshot(volume_root)
    code = AIRFLOW_LIKE.format(
        plugins=str(ROOT / "plugins"),
        pipeline=str(ROOT / "dags" / "pipelines" / "digits.yaml"),
        epochs=EPOCHS,
        snapshot=snapshot_id,
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    workers = _signal_mid_training(proc, lines)
    assert _finish(proc, lines) == 0
    assert "on_kill" in lines  # the replaced handler still ran
    assert not any("attempt 2: started" in line for line in lines), "\n".join(lines[-30:])
    outcome = json.loads(next(ln for ln in lines if ln.startswith("OUTCOME "))[8:])
    assert outcome["error"] == "TrainingTerminated", outcome
    assert "SIGTERM" in outcome["message"]
    assert outcome["retryable"] is False
    _nothing_left(workers, volume_root)


def test_a_terminated_training_is_never_retried() -> None:
    # the local runner fails the Airflow task without retry on exactly this
    assert deterministic(TrainingTerminated("stopped by SIGTERM"))
