"""A real 2-worker training: every socket its workers listen on is loopback only.

TensorFlow's gRPC server binds the wildcard address whatever ``TF_CONFIG`` says (gRPC makes
it a dual-stack ``[::]`` socket); the launcher preloads ``_loopback.so`` into the workers.
What they listen on is read from ``/proc`` all along the run.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.net import is_loopback, listen_addresses
from tests.support.trainer import make_files_snapshot
from trainyard.config import TrainingConfig, parse_pipeline
from trainyard.training.launcher import TrainResult, run_training

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = parse_pipeline(ROOT / "dags" / "pipelines" / "digits.yaml")


def _snapshot(volume_root: Path) -> str:
    """A digits snapshot in its content-derived folder; returns its id."""
    made = make_files_snapshot(volume_root / "incoming", n=400, shards=2)
    snapshot_id = json.loads((made / "manifest.json").read_text())["snapshot_id"]
    folder = volume_root / "digits" / "snapshots"
    folder.mkdir(parents=True)
    shutil.move(made, folder / snapshot_id)
    return snapshot_id


def _is_worker(process: psutil.Process) -> bool:
    try:
        return process.cmdline()[1:5] == ["-m", "trainyard", "worker", "--snapshot-dir"]
    except psutil.Error:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD, /proc")
def test_training_workers_listen_on_loopback_only(volume_root: Path) -> None:
    snapshot_id = _snapshot(volume_root)
    params = TrainingConfig(
        model="small_cnn", workers=2, epochs=3, batch_size=32, max_attempts=1,
        start_deadline_s=90, attempt_timeout_s=300,
    )  # fmt: skip
    outcome: dict[str, TrainResult | BaseException] = {}

    def train() -> None:
        try:
            outcome["result"] = run_training(
                PIPELINE, params, snapshot_id, run_id="loopback", log=lambda _line: None
            )
        except BaseException as e:
            outcome["error"] = e

    runner = threading.Thread(target=train, name="training")
    runner.start()
    seen: dict[int, set[tuple[str, int]]] = {}
    while runner.is_alive():
        workers = [p.pid for p in psutil.Process().children(recursive=True) if _is_worker(p)]
        for pid, address, port in listen_addresses(workers):
            seen.setdefault(pid, set()).add((address, port))
        time.sleep(0.2)
    runner.join()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].attempts == 1
    assert len(seen) == 2, f"expected both workers' gRPC servers, saw {seen}"
    addresses = sorted(a for listeners in seen.values() for a, _port in listeners)
    assert addresses and all(is_loopback(a) for a in addresses), addresses
    print(f"worker listeners: {seen}")
