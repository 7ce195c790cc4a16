"""``trainyard tensorboard``: every version's (and running run's) curves in a real TensorBoard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.ports import free_port
from trainyard.errors import ConfigError
from trainyard.layout import Layout
from trainyard.registry import Registry
from trainyard.training.tensorboard import event_dirs

ROOT = Path(__file__).resolve().parents[2]


def _events(log_dir: Path, losses: list[float]) -> None:
    """Event files as the Keras TensorBoard callback writes them (``train/epoch_loss``)."""
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(log_dir / "train"))
    with writer.as_default():
        for epoch, loss in enumerate(losses):
            tf.summary.scalar("epoch_loss", loss, step=epoch)
    writer.close()


def _version(volume_root: Path, tmp_path: Path, losses: list[float] | None) -> int:
    """Register a version of ``digits`` whose training output held these curves."""
    out = tmp_path / f"out-{len(os.listdir(tmp_path))}"
    (out / "model").mkdir(parents=True)
    (out / "model" / "saved_model.pb").write_bytes(b"not read here")
    extra = []
    if losses is not None:
        _events(out / "tensorboard", losses)
        extra.append(out / "tensorboard")
    reg = Registry(Layout(volume_root).models_root, "digits")
    return reg.register(out / "model", {"dataset": "digits", "snapshot_id": "s1"}, extra)


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _runs(port: int, want: int, proc: subprocess.Popen[bytes], seconds: float = 90) -> list[str]:
    """TensorBoard's run names once it lists ``want`` of them."""
    deadline = time.monotonic() + seconds
    seen: list[str] = []
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            seen = _get(f"http://127.0.0.1:{port}/data/runs")  # type: ignore[assignment]
        except OSError:
            seen = []
        if len(seen) >= want:
            return sorted(seen)
        time.sleep(0.5)
    return sorted(seen)


def test_serves_every_version_and_running_run_and_follows_new_ones(
    volume_root: Path, tmp_path: Path
) -> None:
    assert _version(volume_root, tmp_path, None) == 1  # registered before event files existed
    assert _version(volume_root, tmp_path, [2.0, 1.0, 0.5]) == 2
    Registry(Layout(volume_root).models_root, "digits").promote(2, reason="test", actor="test")
    running = Path(Layout(volume_root).checkpoints("digits", "manual__2026-11-25T10:00:00+00:00"))
    _events(running / "output" / "tensorboard", [3.0])

    runs = event_dirs("digits")
    assert list(runs) == ["v2-champion", f"running-{running.name}"]
    assert runs["v2-champion"] == Path(Layout(volume_root).version("digits", 2)) / "tensorboard"

    port = free_port()
    env = {**os.environ, "TRAINYARD_VOLUME_ROOT": str(volume_root)}
    cmd = [sys.executable, "-m", "trainyard", "tensorboard", "--pipeline", "digits"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        cwd=ROOT / "plugins",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        run_name = f"running/{running.name}/output/tensorboard/train"
        assert _runs(port, 2, proc) == [run_name, "versions/2/tensorboard/train"]
        scalars = _get(
            f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?"
            "run=versions/2/tensorboard/train&tag=epoch_loss"
        )
        assert [(step, value) for _, step, value in scalars] == [(0, 2.0), (1, 1.0), (2, 0.5)]  # type: ignore[union-attr]
        # found by a new user: a version registered while it is open never appeared
        assert _version(volume_root, tmp_path, [1.5]) == 3
        assert "versions/3/tensorboard/train" in _runs(port, 3, proc)
        # a port in use is one clear error, before anything starts
        busy = subprocess.run(
            [*cmd, "--port", str(port)], cwd=ROOT / "plugins", env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert busy.returncode == 3 and f"cannot serve on 127.0.0.1:{port}" in busy.stderr
        assert "TensorBoard for" not in busy.stdout
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    printed = subprocess.run(
        [*cmd, "--version", "2", "--print"],
        cwd=ROOT / "plugins",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.split("\t")[0] == "v2-champion"
    bad_port = subprocess.run(
        [*cmd, "--port", "0"], cwd=ROOT / "plugins", env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert bad_port.returncode == 2 and "port 0 is not in 1..65535" in bad_port.stderr


def test_one_clear_error_for_a_version_it_cannot_show(volume_root: Path, tmp_path: Path) -> None:
    assert event_dirs("digits") == {}  # nothing yet: served anyway, runs appear as they train
    _version(volume_root, tmp_path, None)
    with pytest.raises(ConfigError, match="version 1 of 'digits' has no TensorBoard"):
        event_dirs("digits", [1])
    with pytest.raises(ConfigError, match=r"no version 7 \(versions: 1\)"):
        event_dirs("digits", [7])
