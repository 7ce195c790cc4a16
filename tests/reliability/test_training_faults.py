"""Fault injection against real worker processes: crashes, hangs, NaN loss, killed launcher."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.trainer import (
    make_files_snapshot,
    make_table_snapshot,
    publish_fixture,
    write_table_contract,
)
from trainyard.config import TrainingConfig, parse_pipeline
from trainyard.errors import TrainingError
from trainyard.training.launcher import run_training

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")
FAST = dict(model="small_cnn", workers=2, batch_size=32, learning_rate=0.003, steps_per_execution=1)


def _no_children_left() -> None:
    deadline = time.monotonic() + 10
    while psutil.Process().children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.slow
def test_killed_worker_restarts_all_and_resumes_from_checkpoint(
    volume_root: Path, tmp_path: Path
) -> None:
    snap = publish_fixture(
        make_files_snapshot(volume_root / "incoming", n=640, shards=2), volume_root, "digits"
    )
    params = TrainingConfig(
        **FAST, epochs=3, max_attempts=3, start_deadline_s=60, attempt_timeout_s=240
    )
    lines: list[str] = []
    result = run_training(
        PIPELINE, params, snap, run_id="kill", log=lines.append,
        env={"TRAINYARD_FAULT": "kill_mid_epoch:1:worker:1"},
    )  # fmt: skip
    assert result.attempts == 2
    assert any("worker:1 died (signal 9)" in line for line in lines)
    # attempt 2 started from the checkpoint of epoch 0, not from scratch
    assert result.history["attempts"] == [
        {"attempt": 1, "start_epoch": 0},
        {"attempt": 2, "start_epoch": 1},
    ]
    assert [(e["epoch"], e["attempt"]) for e in result.history["epochs"]] == [
        (0, 1),
        (1, 2),
        (2, 2),
    ]
    assert (result.output_dir / "model" / "saved_model.pb").is_file()
    _no_children_left()


@pytest.mark.slow
def test_worker_that_never_starts_fails_at_deadline_and_retries_end_in_one_error(
    volume_root: Path, tmp_path: Path
) -> None:
    snap = publish_fixture(
        make_files_snapshot(volume_root / "incoming", n=200, shards=2), volume_root, "digits"
    )
    params = TrainingConfig(
        **FAST, epochs=1, max_attempts=2, start_deadline_s=25, attempt_timeout_s=120
    )
    t0 = time.monotonic()
    with pytest.raises(TrainingError) as err:
        run_training(
            PIPELINE, params, snap, run_id="hang", log=lambda _l: None,
            env={"TRAINYARD_FAULT": "hang_before_ready:0:worker:1:1,hang_before_ready:0:worker:1:2"},  # noqa: E501
        )  # fmt: skip
    elapsed = time.monotonic() - t0
    message = str(err.value)
    assert "training failed after 2 attempt(s)" in message
    # MWMS construction waits for every peer, so the hung worker holds worker:0 back too
    assert message.count("worker:1 not ready within the start deadline of 25s") == 2
    assert elapsed < 2 * (25 + 10)
    assert not list(volume_root.glob("_checkpoints/*/*/output/model"))
    _no_children_left()


@pytest.mark.slow
def test_nan_loss_stops_without_retry(
    volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    write_table_contract(contracts)
    monkeypatch.setenv("TRAINYARD_CONTRACTS_DIR", str(contracts))
    pipeline = PIPELINE.model_copy(update={"dataset": "blobs"})
    snap = publish_fixture(
        make_table_snapshot(volume_root / "incoming", n=400, parts=1), volume_root, "blobs"
    )
    # a learning rate this large overflows the logits in the first steps: a genuinely NaN loss
    params = TrainingConfig(
        model="mlp", workers=1, epochs=3, batch_size=32, learning_rate=1e35, max_attempts=3
    )
    lines: list[str] = []
    with pytest.raises(TrainingError, match=r"loss became NaN .* no model was exported") as err:
        run_training(pipeline, params, snap, run_id="nan", log=lines.append)
    # and no task retry either: the step exits 3, Airflow fails the task for good
    assert getattr(err.value, "retryable", True) is False
    from trainyard.steps import deterministic

    assert deterministic(err.value)
    assert not any(line.startswith("attempt 2") for line in lines)
    assert not list(volume_root.glob("_checkpoints/*/*/output/model"))
    _no_children_left()


DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {plugins!r})
from trainyard.config import TrainingConfig, parse_pipeline
from trainyard.training.launcher import run_training
p = parse_pipeline(Path({pipeline!r}))
params = TrainingConfig(model="small_cnn", workers=2, epochs=50, batch_size=32)
import threading
lock = threading.Lock()
def log(line):
    # one write a line: print() from the workers' two log threads once wrote "line1line2"
    with lock:
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()
run_training(p, params, {snap!r}, run_id="term", log=log)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killed_launcher_leaves_no_worker(sig: int, volume_root: Path, tmp_path: Path) -> None:
    snap = publish_fixture(
        make_files_snapshot(volume_root / "incoming", n=200, shards=2), volume_root, "digits"
    )
    code = DRIVER.format(
        plugins=str(ROOT / "plugins"), pipeline=str(ROOT / "dags" / "pipelines" / "digits.yaml"),
        snap=snap,
    )  # fmt: skip
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    ready: set[str] = set()
    # past the launcher's start deadline (120 s): a worker that did not start on a busy
    # machine is started again by the next attempt, whose workers then report ready
    deadline = time.monotonic() + 300
    assert launcher.stdout is not None
    seen: list[str] = []
    try:
        while len(ready) < 2 and time.monotonic() < deadline:
            line = launcher.stdout.readline()
            if not line:  # the launcher ended: nothing more will come
                break
            seen.append(line.rstrip()[:200])
            ready.update(re.findall(r"\[(worker:\d+)\] TRAINYARD_WORKER_READY", line))
        assert len(ready) == 2, (
            f"workers never became ready (launcher exit code {launcher.poll()}):\n"
            + "\n".join(seen[-40:])
        )
    except BaseException:
        # a launcher left running would go on training and load the tests after this one
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in psutil.Process(launcher.pid).children(recursive=True):
                proc.kill()
        launcher.kill()
        launcher.wait(30)
        raise
    workers = psutil.Process(launcher.pid).children(recursive=True)
    assert len(workers) >= 2
    os.kill(launcher.pid, sig)
    launcher.wait(timeout=30)
    _gone, alive = psutil.wait_procs(workers, timeout=15)
    assert alive == [], f"worker processes survived the launcher: {[p.pid for p in alive]}"


@pytest.mark.slow
def test_a_cli_run_stopped_in_training_leaves_no_checkpoints(volume_root: Path) -> None:
    """Found by a cold user: ``trainyard run`` stopped by Ctrl-C in training left its
    checkpoint folder, which nothing resumes: each run's id is new."""
    runs = volume_root / "_checkpoints" / "digits"
    log = volume_root.parent / "run.log"
    with open(log, "wb") as fh:
        # as from a terminal: SIGINT not ignored (a suite started in the background by a
        # non-interactive shell ignores it, and Python keeps an ignored SIGINT ignored)
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard", "run", "--pipeline", "digits",
             "--overrides", '{"epochs": 200, "workers": 1}'],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not list(runs.glob("*/backup/*")):  # training wrote its first checkpoint
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        assert proc.wait(120) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "removed the checkpoints of run cli__" in text, text[-3000:]
    assert not list(runs.iterdir())
    _no_children_left()
